"""The needle suite (``attnviz.ablation.needles``): each prompt is a run of the shipped filler, cut at sentence
ends, with the needle sentence at its recorded span and depth and the question last; the codes, depths and
filler are the seed's, the same on every run (another process, another hash seed) and different for another
seed; the prompts are as long as asked, measured by a tokenizer or estimated; the filler is package data.
No model: a tokenizer here is ``str.split``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from attnviz.ablation import needles
from attnviz.ablation.needles import ANSWER, NEEDLE, QUESTION, needle_suite
from attnviz.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


def words(text: str) -> dict[str, list[str]]:
    """A tokenizer as the suite calls one: a token a word."""
    return {"input_ids": text.split()}


def parts(needle: needles.Needle) -> tuple[str, str]:
    """The filler before the needle and after it, read back from the prompt by the documented form."""
    start, end = needle.span
    assert needle.text.endswith(QUESTION)
    assert needle.text[end] == " "
    return needle.text[:start], needle.text[end + 1:len(needle.text) - len(QUESTION)]


def filler_text() -> str:
    return (resources.files("attnviz.ablation") / "filler.txt").read_text(encoding="utf-8")


def test_the_needle_stands_at_its_span_after_a_sentence_end_with_the_question_last():
    suite = needle_suite(6, tokens=1500, seed=4)
    assert [n.index for n in suite] == list(range(6))
    for n in suite:
        assert re.fullmatch(r"[1-9][0-9]{3}", n.code)
        assert n.needle == n.text[n.span[0]:n.span[1]] == f"The secret code is {n.code}." == NEEDLE.format(code=n.code)
        assert n.text.count(n.code) == 1
        assert n.text.count("secret code") == 3  # the needle's, the question's, the answer's start
        assert n.answer == f" {n.code}." == ANSWER.format(code=n.code)
        assert n.text.endswith("\n\nQuestion: What is the secret code?\nAnswer: The secret code is")
        before, after = parts(n)
        assert re.search(r"[.!?]['\")]*\s$", before), before[-40:]  # after a sentence end
        assert re.match(r"['\"(]*[A-Z]", after), after[:40]  # and the next sentence goes on after it
        assert re.search(r"[.!?]['\")]*$", after), after[-40:]  # the filler ends at a sentence end
        assert n.seed == 4
    assert len({n.code for n in suite}) == 6


def test_the_filler_is_a_run_of_the_shipped_text_from_a_sentence_start():
    text = filler_text()
    twice = text + text  # a prompt longer than the rest of the text goes on from its start
    starts = set()
    for n in needle_suite(5, tokens=3000, seed=2):
        before, after = parts(n)
        run = before + after
        at = twice.find(run)
        assert at >= 0, "the filler is not a run of the shipped text"
        assert at == 0 or re.search(r"[.!?]['\")]*\s$", twice[:at]), twice[at - 30:at + 30]
        starts.add(at % len(text))
    assert len(starts) == 5  # each needle its own filler


def test_a_prompt_longer_than_the_text_goes_on_from_its_start():
    text = filler_text()
    n, = needle_suite(1, tokens=len(text) // 4 + 2000, seed=0)  # about 36,000 estimated tokens
    before, after = parts(n)
    assert len(before + after) > len(text)
    assert (before + after) in text * 3


def test_depths_are_spread_over_the_range_or_as_given_to_within_a_sentence():
    longest = max(len(s) for s in needles.sentences())
    suite = needle_suite(8, tokens=4000, seed=1)
    for n in suite:
        before, after = parts(n)
        filler_chars = len(before) + len(after)
        assert n.depth == pytest.approx(len(before) / (filler_chars + 1), abs=2 / filler_chars)
        slack = longest / filler_chars
        low, high = 0.1 + 0.8 * n.index / 8, 0.1 + 0.8 * (n.index + 1) / 8  # its own stretch of (0.1, 0.9)
        assert low - slack <= n.depth <= high + slack, (n.index, n.depth)
    asked = [0.0, 0.25, 0.5, 0.75, 1.0]
    for n, depth in zip(needle_suite(5, tokens=4000, seed=1, depths=asked), asked):
        before, after = parts(n)
        assert abs(n.depth - depth) <= longest / (len(before) + len(after))
        assert before and after  # a sentence on either side, even at 0 and 1


def next_sentence(needle: needles.Needle) -> str:
    """The filler's sentence after the last one the prompt holds."""
    text = filler_text()
    before, after = parts(needle)
    at = (text * 3).find(before + after)  # a prompt longer than the rest of the text goes on from its start
    assert at >= 0, "the filler is not a run of the shipped text"
    end = (at + len(before + after)) % len(text)
    starts = [0]
    for sentence in needles.sentences():
        starts.append(starts[-1] + len(sentence))
    following = [s for s, at in zip(needles.sentences(), starts) if at >= end]
    return (following or needles.sentences())[0]  # after the text's last sentence, its first


def test_prompts_are_as_long_as_asked_measured_or_estimated():
    for tokens in (300, 2000, 9000, 40000):
        for n in needle_suite(3, tokens=tokens, seed=5, tokenizer=words):
            assert n.tokens == len(n.text.split()) <= tokens
            assert n.tokens + len(next_sentence(n).split()) > tokens  # one more sentence would not fit
        for n in needle_suite(3, tokens=tokens, seed=5):
            assert n.tokens == -(-len(n.text) // 4) and len(n.text) <= 4 * tokens
            assert len(n.text) + len(next_sentence(n)) > 4 * tokens


def test_the_same_arguments_give_the_same_needles_in_another_process_and_hash_seed():
    here = [(n.code, n.depth, n.span, n.text) for n in needle_suite(4, tokens=800, seed=9)]
    again = [(n.code, n.depth, n.span, n.text) for n in needle_suite(4, tokens=800, seed=9)]
    assert here == again
    script = ("import json; from attnviz.ablation.needles import needle_suite; print(json.dumps("
              "[[n.code, n.depth, list(n.span), n.text] for n in needle_suite(4, tokens=800, seed=9)]))")
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        assert [(c, d, tuple(s), t) for c, d, s, t in json.loads(out.stdout)] == here


def test_the_suite_of_a_seed_is_pinned():
    """Python promises ``random.Random(seed).random()``'s sequence on every version: these codes are what seed 0
    draws. A change here changes every calibration and held-out suite made before."""
    suite = needle_suite(5, seed=0)
    assert [n.code for n in suite] == ["8599", "3330", "8054", "6250", "3536"]
    assert [round(n.depth, 2) for n in suite] == [0.22, 0.34, 0.47, 0.73, 0.85]


def test_another_seed_gives_other_codes_depths_and_filler():
    one, two = needle_suite(5, seed=0), needle_suite(5, seed=1)
    assert {n.code for n in one}.isdisjoint({n.code for n in two})
    assert all(a.depth != b.depth for a, b in zip(one, two))
    assert all(parts(a)[0][:200] != parts(b)[0][:200] for a, b in zip(one, two))
    # given depths change neither the codes nor the filler's start
    given = needle_suite(5, seed=0, depths=[0.5] * 5)
    assert [n.code for n in given] == [n.code for n in one]
    text = filler_text() * 2
    assert [text.find(parts(n)[0][:300]) for n in given] == [text.find(parts(n)[0][:300]) for n in one]


def test_the_filler_is_package_data_public_domain_prose_long_enough():
    text = filler_text()
    assert needles.filler() == text
    data = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]")[1].split("\n[")[0]
    assert re.search(r'^"attnviz\.ablation" = \[[^]]*"filler\.txt"', data, re.M), data  # installed with the package
    assert len(text) >= 130_000  # ~30,000 tokens of English prose (SmolLM2's tokenizer: 34,244)
    assert "Gutenberg" not in text and "licen" not in text.lower()  # no licence boilerplate
    assert not re.search(r"[0-9]", text) and "secret" not in text  # nothing a code could be confused with
    assert "Alice" in needles.__doc__ and "public domain" in needles.__doc__  # its source and status stated
    assert len(needles.sentences()) > 1000 and "".join(needles.sentences()) == text


@pytest.mark.parametrize("call, words_in_message", [
    (dict(count=0), "1 or more"),
    (dict(count=2, tokens=0), "1 or more"),
    (dict(count=2, tokens=20), "cannot hold"),
    (dict(count=2, depths=[0.5]), "one depth a needle"),
    (dict(count=2, depths=[0.5, 1.5]), "outside [0, 1]"),
])
def test_bad_arguments_are_usage_errors_in_one_line(call, words_in_message):
    with pytest.raises(UsageError) as info:
        needle_suite(**call)
    assert info.value.exit_code == 2 and words_in_message in info.value.message
    assert "\n" not in info.value.message
