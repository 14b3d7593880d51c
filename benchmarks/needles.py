"""The needle suite on a real model: does the model as it is answer each needle's code? (A check of the suite's
prompt, not a benchmark of time: what ``attnviz ablate`` compares its restricted runs with.)

    python benchmarks/needles.py MODEL_DIR [--tokens 1000 2000 4000] [--seeds 0 1] [--count 5] [--new 8]

For each length and seed, ``needle_suite(count, tokens=..., seed=..., tokenizer=...)`` measured with the
model's tokenizer; each prompt run through ``generate`` (greedy, ``--new`` tokens) on raw text, no chat
template; a needle is answered when the generated text holds its code. Prints a line a needle (length, seed,
depth, code, right or not, the answer) and the count answered per length and seed. The model is loaded in
float32 with SDPA attention, on the CPU.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a transformers model folder (SmolLM2-135M-Instruct in float32, say)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 2000, 4000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--new", type=int, default=8, help="new tokens generated")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnviz.ablation.needles import needle_suite

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    totals = []
    for tokens in args.tokens:
        for seed in args.seeds:
            right = 0
            for needle in needle_suite(args.count, tokens=tokens, seed=seed, tokenizer=tokenizer):
                ids = tokenizer(needle.text, return_tensors="pt")
                began = time.perf_counter()
                with torch.no_grad():
                    out = model.generate(**ids, max_new_tokens=args.new, do_sample=False,
                                         pad_token_id=tokenizer.eos_token_id)
                answer = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
                ok = needle.code in answer
                right += ok
                print(f"tokens {tokens:>6} seed {seed} needle {needle.index}: {needle.tokens} tokens, depth "
                      f"{needle.depth:.2f}, code {needle.code}: {'right' if ok else 'WRONG'} {answer!r} "
                      f"({time.perf_counter() - began:.1f} s)", flush=True)
            totals.append((tokens, seed, right))
    print()
    for tokens, seed, right in totals:
        print(f"{tokens:>6} tokens, seed {seed}: {right} of {args.count} answered")


if __name__ == "__main__":
    main()
