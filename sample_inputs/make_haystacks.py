"""Regenerate ``haystack-20.txt``, ``haystack-50.txt`` and ``haystack-80.txt``: three needle-in-a-haystack
prompts for the retrieval heads of docs/long-context.md, each one text (``--text @FILE``). Each is the first ~4,600
characters (about 1,000 tokens of SmolLM2's tokenizer) of ``licences.txt`` (the Apache License 2.0, then
matplotlib's licence agreement; both may be copied verbatim), whole lines, with Wu et al. 2024's needle sentence
put in after the sentence that ends nearest before 20%, 50% and 80% of it, and a question whose answer repeats
the needle.

    python sample_inputs/make_haystacks.py
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
QUESTION = "\n\nQuestion: What is the best thing to do in San Francisco?\nAnswer:"
DEPTHS = (20, 50, 80)
CHARACTERS = 4600


def haystack(text: str, depth: int, characters: int = CHARACTERS) -> str:
    body = text[:text.rfind("\n", 0, characters)]
    cut = body.rfind(". ", 0, len(body) * depth // 100) + 1
    return f"{body[:cut]} {NEEDLE}{body[cut:]}{QUESTION}"


def main() -> None:
    text = (HERE / "licences.txt").read_text(encoding="utf-8")
    for depth in DEPTHS:
        (HERE / f"haystack-{depth}.txt").write_text(haystack(text, depth), encoding="utf-8")


if __name__ == "__main__":
    main()
