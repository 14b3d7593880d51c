"""Regenerate ``haystacks.txt``: three needle-in-a-haystack prompts, one a line, for the retrieval heads of
docs/long-context.md. Each is the first ~8,000 characters (about 1,800 tokens of SmolLM2's tokenizer) of
``licences.txt`` (the Apache License 2.0, then matplotlib's licence agreement; both may be copied verbatim) on one
line, with Wu et al. 2024's needle sentence put in after the sentence that ends nearest before 20%, 50% and 80% of
it, and a question whose answer repeats the needle.

    python sample_inputs/make_haystacks.py
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
QUESTION = "Question: What is the best thing to do in San Francisco? Answer:"
DEPTHS = (0.2, 0.5, 0.8)
CHARACTERS = 8000


def haystack(text: str, depth: float, characters: int = CHARACTERS) -> str:
    body = " ".join(text.split())[:characters]
    body = body[:body.rfind(". ") + 1]  # whole sentences
    cut = body.rfind(". ", 0, int(len(body) * depth)) + 1
    return f"{body[:cut]} {NEEDLE}{body[cut:]} {QUESTION}"


def main() -> None:
    text = (HERE / "licences.txt").read_text(encoding="utf-8")
    (HERE / "haystacks.txt").write_text("".join(haystack(text, d) + "\n" for d in DEPTHS), encoding="utf-8")


if __name__ == "__main__":
    main()
