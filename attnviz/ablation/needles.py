"""The needle suite: prompts that hide a four-digit code in filler text and ask for it back, to check that a
model restricted to fewer keys still finds it (``attnviz ablate``'s policies are tried on calibration and
held-out suites, two calls with different seeds).

A prompt is filler prose with the needle sentence put in after a sentence end at a depth, then the question::

    ... filler ... The secret code is 5831. ... filler ...

    Question: What is the secret code?
    Answer: The secret code is

and its answer, teacher-forced or generated, is `` 5831.``: the prompt starts the answer, so that the model has
only the code left to say, and the answer's log-probability is that of the code's tokens, the ones only the
needle supplies. (SmolLM2-135M-Instruct, asked with "Answer:" alone, talked about the question instead: 0 of 2
at 2,000 tokens; with the answer begun it gave the code for 10 of 10 needles at 1,000 and at 2,000 tokens, 8 of
10 at 4,000: ``benchmarks/needles.py``, ``docs/ablation.md``.)

The codes (four digits, none repeated within a suite), the depths (spread evenly over 0.1-0.9 with jitter,
unless given) and where each needle's filler starts in the text are drawn by ``random.Random(seed)``, from its
``random()`` alone: Python promises that sequence for a seed on every version and machine (``randrange``,
``sample`` and ``shuffle`` it does not). No ``hash()`` and no set order enter the texts. The standard library
only.

The filler (``filler.txt`` beside this module, package data) is Lewis Carroll's *Alice's Adventures in
Wonderland* (1865; Carroll died in 1898): in the public domain everywhere. The text is Project Gutenberg's
transcription, etext 11, "The Millennium Fulcrum Edition 2.9", as the Canterbury compression corpus holds it
(``alice29.txt``, which the source distribution of the ``brotli`` package on PyPI ships among its test data),
and carries no Project Gutenberg header or licence. It was reduced to plain prose: the title and chapter
headings, the poems and songs, and the rows of asterisks dropped; each paragraph joined onto one line; the
backquote that opens a quotation written as an apostrophe, as the one that closes it; two spaces after a
sentence written as one. 747 paragraphs, 135,416 characters, 34,244 tokens of SmolLM2's tokenizer; a longer
prompt goes on from the text's start again. The text holds no digit, and neither "secret" nor "code".
"""

from __future__ import annotations

import bisect
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from attnviz.errors import UsageError

#: the package data file of the filler
FILLER_FILE = "filler.txt"
#: the sentence that hides the code, and the prompt's last lines, which ask for it
NEEDLE = "The secret code is {code}."
QUESTION = "\n\nQuestion: What is the secret code?\nAnswer: The secret code is"
#: the answer the model should give, as the prompt's last line invites it (a space first)
ANSWER = " {code}."
#: where depths are spread when they are not given
DEPTH_RANGE = (0.1, 0.9)
#: characters a token, to size a prompt when no tokenizer is given (English prose in byte-level BPE: SmolLM2's
#: tokenizer reads the filler at 3.95)
CHARS_PER_TOKEN = 4
#: the most filler characters a token a prompt is given: English prose takes 3 to 6 a token in any tokenizer
#: (one that counts fewer tokens gets a shorter prompt than asked for)
CHAR_LIMIT = 16
#: a sentence ends at . ! or ?, with the quotes and brackets that close on it, where whitespace and a capital
#: (perhaps after an opening quote) follow; what follows the whitespace starts the next sentence
_SENTENCE_END = re.compile(r"[.!?]['\")]*\s+(?=['\"(]*[A-Z])")


@dataclass(frozen=True)
class Needle:
    """One prompt of the suite.

    ``text`` is the whole prompt: filler, the needle sentence at ``span`` (character offsets, end exclusive:
    ``text[span[0]:span[1]]`` is ``"The secret code is 5831."``), filler, the question and the answer's
    start. ``answer`` is what the model should say next (``" 5831."``); a generated answer is right when it holds
    ``code``. ``depth`` is the share of the filler's characters before the needle (within a sentence of the
    depth asked for), ``tokens`` the prompt's length, measured by the tokenizer or estimated
    (``CHARS_PER_TOKEN``), ``seed`` the suite's seed and ``index`` the needle's place in it.
    """

    text: str
    answer: str
    code: str
    depth: float
    span: tuple[int, int]
    tokens: int
    seed: int
    index: int

    @property
    def needle(self) -> str:
        """The needle sentence, as it stands in the text."""
        return self.text[self.span[0]:self.span[1]]


@lru_cache(maxsize=1)
def filler() -> str:
    """The filler text, read from the package data (one paragraph a line)."""
    return resources.files(__package__).joinpath(FILLER_FILE).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """The filler cut at its sentence ends: each sentence with the whitespace after it (a space, or the newline
    that ends its paragraph), so that any run of them, joined, is text as the filler has it."""
    text = filler()
    cuts = [m.end() for m in _SENTENCE_END.finditer(text)]
    starts = [0, *cuts]
    ends = [*cuts, len(text)]
    return tuple(text[a:b] for a, b in zip(starts, ends) if a < b)


def needle_suite(count: int, *, tokens: int = 2000, seed: int = 0, depths: Sequence[float] | None = None,
                 tokenizer: Callable[[str], Mapping[str, Any]] | None = None) -> list[Needle]:
    """``count`` needles, each a prompt of about ``tokens`` tokens (at most that many, short of it by less
    than a sentence): codes, depths and where each needle's filler starts drawn by ``random.Random(seed)``.

    ``depths``: one per needle, each within [0, 1] (the share of the filler before the needle); by default
    spread evenly over ``DEPTH_RANGE``, each drawn within its own stretch. ``tokenizer``: a transformers
    tokenizer (only called as ``tokenizer(text)["input_ids"]``) to measure the prompts with; without one
    their length is estimated at ``CHARS_PER_TOKEN`` characters a token. The same arguments give the same
    needles on every machine and Python version; calibration and held-out suites are two calls with
    different seeds.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(f"needles: {count!r} needles: give a whole number of 1 or more.")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise UsageError(f"needles: a prompt of {tokens!r} tokens: give a whole number of 1 or more.")
    if depths is not None:
        depths = [float(d) for d in depths]
        if len(depths) != count:
            raise UsageError(f"needles: {len(depths)} depths for {count} needles: give one depth a needle.")
        outside = [d for d in depths if not 0.0 <= d <= 1.0]
        if outside:
            raise UsageError(f"needles: depth {outside[0]!r} is outside [0, 1] (the share of the filler before "
                             "the needle).")

    def measure(text: str) -> int:
        if tokenizer is None:
            return -(-len(text) // CHARS_PER_TOKEN)
        return len(tokenizer(text)["input_ids"])

    rng = random.Random(seed)
    pieces = sentences()
    low, high = DEPTH_RANGE
    suite: list[Needle] = []
    codes: list[str] = []
    for index in range(count):
        # the same draws in the same order whatever is given, so that given depths change nothing else
        code = _code(rng, codes)
        codes.append(code)
        jitter = rng.random()
        start = int(rng.random() * len(pieces))
        if depths is None:
            depth = low + (high - low) * (index + jitter) / count
        else:
            depth = depths[index]
        run = _Run(pieces, start, code, depth)
        n, size = _longest(run, measure, tokens)
        text, span, actual = run.prompt(n)
        suite.append(Needle(text=text, answer=ANSWER.format(code=code), code=code, depth=actual, span=span,
                            tokens=size, seed=seed, index=index))
    return suite


def _code(rng: random.Random, taken: Sequence[str]) -> str:
    """Four digits, the first not 0, none of those already taken (drawn again until so)."""
    while True:
        code = str(1000 + int(rng.random() * 9000))
        if code not in taken:
            return code


class _Run:
    """The filler's sentences from ``start`` on (going on from the text's start after its end), the needle
    put in at the sentence end nearest ``depth`` of the first ``n`` of them."""

    def __init__(self, pieces: Sequence[str], start: int, code: str, depth: float) -> None:
        self.pieces = pieces
        self.start = start
        self.needle = NEEDLE.format(code=code)
        self.depth = depth
        self.ends = [0]  # the characters of the first i sentences, as far as built

    def length(self, n: int) -> int:
        """The characters of the first ``n`` sentences."""
        while len(self.ends) <= n:
            piece = self.pieces[(self.start + len(self.ends) - 1) % len(self.pieces)]
            self.ends.append(self.ends[-1] + len(piece))
        return self.ends[n]

    def count(self, chars: float) -> int:
        """The fewest sentences that hold ``chars`` characters."""
        n = 0
        while self.length(n) < chars:
            n += 1
        return n

    def prompt(self, n: int) -> tuple[str, tuple[int, int], float]:
        """The prompt with ``n`` sentences of filler (2 or more): its text, the needle's span in it and the
        share of the filler before the needle."""
        total = self.length(n)
        # the sentence end nearest the depth asked for, with at least one sentence on either side
        target = self.depth * total
        at = bisect.bisect_left(self.ends, target, 1, n - 1)
        if at > 1 and target - self.ends[at - 1] <= self.ends[at] - target:
            at -= 1
        at = min(max(at, 1), n - 1)
        chosen = [self.pieces[(self.start + i) % len(self.pieces)] for i in range(n)]
        before = "".join(chosen[:at])
        after = "".join(chosen[at:]).rstrip()
        text = before + self.needle + " " + after + QUESTION
        return text, (len(before), len(before) + len(self.needle)), len(before) / total


def _longest(run: _Run, measure: Callable[[str], int], tokens: int) -> tuple[int, int]:
    """The most sentences of filler whose prompt measures ``tokens`` or fewer (a prompt grows with its filler),
    and what that prompt measures; 2 at the least, or a usage error when even those are too long. A tokenizer's
    call on a long prompt costs more than building it: the count is guessed from the characters, guessed again
    from what the first guess measured, then found by galloping from there to a bracket and bisecting it, a
    handful of calls."""
    sizes: dict[int, int] = {}

    def fits(n: int) -> bool:
        if n not in sizes:
            sizes[n] = measure(run.prompt(n)[0])
        return sizes[n] <= tokens

    if not fits(2):
        raise UsageError(f"needles: {tokens} tokens cannot hold a needle's prompt (two sentences of filler, the "
                         f"needle and the question: {sizes[2]} tokens); give more.")
    cap = run.count(CHAR_LIMIT * tokens)
    n = min(max(run.count(CHARS_PER_TOKEN * tokens), 2), cap)
    fits(n)
    if sizes[n] > 0:  # the characters a token this text measured
        n = min(max(run.count(run.length(n) * tokens / sizes[n]), 2), cap)
    good, bad = 2, cap + 1  # the most sentences known to fit, the fewest known not to (or past the cap)
    step = 1
    if fits(n):
        good = n
        while good < cap:
            probe = min(good + step, cap)
            if not fits(probe):
                bad = probe
                break
            good, step = probe, 2 * step
    else:
        bad = n
        while bad - step > good:
            probe = bad - step
            if fits(probe):
                good = probe
                break
            bad, step = probe, 2 * step
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good, sizes[good]
