"""A long input summarised while the model runs (``attnviz capture --summary``) against the plain forward,
in one run on one machine: the time, the peak memory and the file.

The model (benchmarks/models.py): a Llama architecture of 4 layers, 4 query / 2 key-value heads, head_dim 64,
hidden 256, random weights. Each measurement runs in a fresh process (its peak resident memory is its own):
baseline, the model's plain SDPA forward on the tokens; summary, the same forward inside
``attnviz.capture(model, summary=True, path=...)`` with the file written. Targets (issue: long contexts): the
summary within 6x the forward's time, its peak within the forward's + 512 MiB, the file at most 64 MiB.

    python benchmarks/long_context.py                       # 8k, 16k, 32k tokens
    python benchmarks/long_context.py --tokens 131072 --repeat 1 --layers 1
    python benchmarks/long_context.py --device cuda --size 1b --dtype bfloat16 --tokens 32768
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from memory import reset_peak, rss_peak  # noqa: E402 - the benchmarks' folder first


def measure(folder: str, tokens: int, mode: str, device: str, dtype: str, out: str) -> dict:
    """One measurement in this process: load, warm up on a short input, then time the long one."""
    import torch
    import transformers

    sys.path.insert(0, str(HERE.parent))
    import attnviz

    kwargs = {} if dtype == "auto" else {"dtype": getattr(torch, dtype)}
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs).to(device).eval()
    base = model.model  # the transformer alone: the logits of 32k positions are not what is measured
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (1, tokens), generator=g).to(device)
    ids[0, 0] = 1
    with torch.no_grad():
        base(ids[:, :256])  # warm up
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        reset_peak()
        started = time.perf_counter()
        if mode == "forward":
            base(ids)
        else:
            with attnviz.capture(model, path=out, summary=True):
                base(ids)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    result = {"mode": mode, "tokens": tokens, "seconds": seconds, "peak_rss": rss_peak()}
    if device == "cuda":
        result["peak_gpu"] = torch.cuda.max_memory_allocated()
    if mode == "summary":
        result["file"] = os.path.getsize(out)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="*", default=[8192, 16384, 32768])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--size", choices=("small", "1b"), default="small")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each; the fastest is kept")
    ap.add_argument("--layers", type=int, default=4, help="the small model's layers (1: a 128k run's memory in "
                                                          "a quarter of the time; a site's summary needs no more)")
    ap.add_argument("--one", nargs=3, metavar=("FOLDER", "TOKENS", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        folder, tokens, mode = args.one
        print(json.dumps(measure(folder, int(tokens), mode, args.device, args.dtype, args.out)))
        return
    from models import llama_folder

    with tempfile.TemporaryDirectory() as tmp:
        if args.size == "1b":  # a 1B-class Llama: 16 layers x 32 heads (8 kv), head_dim 64
            folder = llama_folder(Path(tmp) / "model", layers=16, heads=32, kv_heads=8, hidden=2048)
        else:
            folder = llama_folder(Path(tmp) / "model", layers=args.layers)
        print(f"model: {args.size} ({args.layers} layers), device {args.device}, dtype {args.dtype}, torch threads "
              f"{os.environ.get('OMP_NUM_THREADS', 'default')}")
        print(f"{'tokens':>7} {'forward s':>10} {'summary s':>10} {'ratio':>6} {'fwd peak MiB':>13} "
              f"{'sum peak MiB':>13} {'extra MiB':>10} {'file MiB':>9}")
        for tokens in args.tokens:
            best: dict[str, dict] = {}
            for _ in range(args.repeat):
                for mode in ("forward", "summary"):
                    cmd = [sys.executable, __file__, "--one", str(folder), str(tokens), mode, "--device", args.device,
                           "--dtype", args.dtype, "--out", str(Path(tmp) / "s.safetensors")]
                    got = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
                    if mode not in best or got["seconds"] < best[mode]["seconds"]:
                        best[mode] = got
            f, s = best["forward"], best["summary"]
            print(f"{tokens:>7} {f['seconds']:>10.2f} {s['seconds']:>10.2f} {s['seconds'] / f['seconds']:>6.2f} "
                  f"{f['peak_rss'] / 2**20:>13.0f} {s['peak_rss'] / 2**20:>13.0f} "
                  f"{(s['peak_rss'] - f['peak_rss']) / 2**20:>10.0f} {s['file'] / 2**20:>9.1f}", flush=True)
            if args.device == "cuda":
                print(f"{'':>7} GPU peak: forward {f['peak_gpu'] / 2**20:.0f} MiB, summary {s['peak_gpu'] / 2**20:.0f} "
                      "MiB")


if __name__ == "__main__":
    main()
