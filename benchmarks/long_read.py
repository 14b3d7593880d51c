"""Reading a large exact capture in bounded memory: the peak resident memory of ``attnviz inspect --png``
(the layer x head grid, the head table, received attention, JSON) and of ``attnviz view`` (headless: every
key, its rollout ``r`` last), against the size of the capture file they read.

The capture is made here: a Llama-architecture model of random weights (hidden 256, 4 layers, 4 query and
2 key-value heads, head_dim 64) saved with its own word-level tokenizer, and ``attnviz capture DIR --text
"word word ..."``: 8,000 words (8,002 tokens) make a 4 GiB file of float32 weights. Each measurement is a
process of its own, under ``/usr/bin/time -v`` (its "Maximum resident set size": mapped file pages that
were read count too); the baseline beside them is ``python -c "import numpy"`` in the same run.

    python benchmarks/long_read.py                     # 8,000 words, files in a temporary folder
    python benchmarks/long_read.py --words 2000 --dir /tmp
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VIEW_ROLLOUT = r"""
import asyncio, sys
from attnviz.cli.commands.view import view
from attnviz.inspection.options import InspectOptions
from attnviz.render.options import FigureOptions
viewer = view(InspectOptions(weights=sys.argv[1]), FigureOptions(), run=False)

async def drive():
    async with viewer.run_test(size=(120, 40)) as pilot:
        # every key: heads and layers, sort, the cursor, the batch entry, search, the keys, then the rollout
        await pilot.press("l", "j", "h", "k", "s", "s", "L", "J", "H", "K", "b", "B", "question_mark", "escape")
        await pilot.press("slash", *"word", "enter", "escape", "r")
        await pilot.pause()
        assert viewer.model.rollout and viewer.model.map()[0].size
        await pilot.press("r", "q")

asyncio.run(drive())
print("rollout drawn in blocks of", viewer.model._maps[(-1, -1)][1])
"""


def make_model(folder: Path, max_tokens: int) -> None:
    """A small Llama-architecture model of random weights and a word-level tokenizer, saved as a user's
    model folder is."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "word": 3, "the": 4, "needle": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=max_tokens)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(folder))
    fast.save_pretrained(str(folder))


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Wall seconds, peak resident bytes (``/usr/bin/time -v``) and stderr of one process."""
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        sys.exit(f"{argv[:4]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, int(found.group(1)) * 1024, done.stderr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=8000)
    ap.add_argument("--dir", default=None, help="where the model and the capture go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="leave the folder (its capture) in place")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="attnviz-long-read-", dir=args.dir))
    env = {**os.environ, "ATTNVIZ_NO_SERVER": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    py = sys.executable
    try:
        make_model(root / "model", max(8192, args.words + 16))
        text = "word " * args.words
        capture = root / "big.safetensors"
        wall, peak, _ = timed([py, "-m", "attnviz", "capture", str(root / "model"), "--text", text, "-o",
                               str(capture)], env)
        size = capture.stat().st_size
        print(f"capture: {args.words} words, {size / 2**30:.2f} GiB file, {wall:.1f} s, peak {peak / 2**20:.0f} MiB",
              flush=True)
        _, base, _ = timed([py, "-c", "import numpy, matplotlib"], env)
        print(f"baseline: python -c 'import numpy, matplotlib' peak {base / 2**20:.0f} MiB", flush=True)
        rows = []
        for name, argv in (
            ("inspect --png --json", [py, "-m", "attnviz", "inspect", str(capture), "--png", str(root / "grid.png"),
                                      "--json"]),
            ("inspect --png (table)", [py, "-m", "attnviz", "inspect", str(capture), "--png",
                                       str(root / "grid2.png")]),
            ("view, every key, r (rollout) last", [py, "-c", VIEW_ROLLOUT, str(capture)]),
        ):
            wall, peak, _ = timed(argv, env)
            rows.append((name, wall, peak))
            print(f"{name}: {wall:.1f} s, peak {peak / 2**20:.0f} MiB = {peak / size:.3f} x the file "
                  f"({peak / 2**30:.2f} GiB; target < 1 GiB)", flush=True)
        print("\n| command | seconds | peak memory | peak / file size |\n| --- | --- | --- | --- |")
        for name, wall, peak in rows:
            print(f"| `{name}` | {wall:.1f} | {peak / 2**20:.0f} MiB | {peak / size:.3f} |")
    finally:
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
