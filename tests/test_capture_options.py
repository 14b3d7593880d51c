"""Capture's options as one typed object (issue 51, item 2): ``attnviz.capturing.options.CaptureSettings``, declared
with ``fields.option``, is what ``attnviz capture``'s parameters are made from and what the Python API builds;
its ``check()`` is the one place their conflicts are refused, in the command line's words there and in the API's
words through ``attnviz.capture`` and ``attnviz.corpus``. No model is loaded: every check runs before one is."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.capturing.options import (
    CaptureOutput,
    CaptureRun,
    CaptureSettings,
    CorpusOptions,
    ModelInput,
    SummaryOptions,
)
from attnviz.cli.app import app
from attnviz.errors import UsageError
from attnviz.fields import flat_fields

SUMMARY = "Summary (long inputs)"
CORPUS = "Corpus (--corpus)"
#: what ``attnviz capture --help`` showed before the options became one object (and --no-qkv, added since): each
#: option's names, the word after them, its default, its panel (None: Options) and whether the help hides it
HELP = [
    (("--text",), "TEXT", None, None, False), (("--text-file",), "FILE", None, None, False),
    (("-o", "--output"), "FILE", None, None, False), (("--device",), None, "auto", None, False),
    (("--dtype",), None, "auto", None, False), (("--layers",), "N,N,...", None, None, False),
    (("--generate",), "N", 0, None, False), (("--no-weights",), None, False, None, False),
    (("--no-qkv",), None, False, None, False),
    (("--weights-dtype",), None, "float32", None, False), (("--target",), "next|TOKEN|ID", None, None, False),
    (("--decoder-text",), "TEXT", None, None, False), (("--check",), None, False, None, False),
    (("--atol",), None, None, None, False),
    (("--summary",), None, False, SUMMARY, False), (("--sinks",), "S", None, SUMMARY, False),
    (("--local",), "W", None, SUMMARY, False), (("--pool",), "P", None, SUMMARY, False),
    (("--rows",), "ROWS", None, SUMMARY, False),
    (("--max-file",), "SIZE", None, None, False), (("--json",), None, False, None, False),
    (("-q", "--quiet"), None, False, None, False), (("--truncate",), None, False, None, True),
    (("--long",), "truncate|refuse", None, None, False),
    (("--corpus",), None, False, CORPUS, False), (("--batch-size",), "N", None, CORPUS, False),
    (("--shard",), "INDEX/COUNT|auto", None, CORPUS, False), (("--token-class",), "NAME=REGEX", None, CORPUS, False),
    (("--sink-threshold",), None, None, CORPUS, False),
]


def _command(name: str) -> object:
    from typer.main import get_command

    return get_command(app).commands[name]  # type: ignore[attr-defined]


def test_the_command_line_options_are_the_fields_of_one_object():
    """Every option of ``attnviz capture`` is a field of ``CaptureSettings`` (and ``--model``'s of inspect and rollout
    are ``ModelInput``'s), shown as before: names, metavar, default, panel, order."""
    params = [p for p in _command("capture").params if p.param_type_name == "option"]
    fields = {f.name: f for f, _ in flat_fields(CaptureSettings)}
    assert [p.name for p in params] == [p.name for p in params if p.name in fields]
    assert sorted(p.name for p in params) == sorted(fields)
    shown = [(tuple(sorted(p.opts, key=len)), p.metavar, p.default, getattr(p, "rich_help_panel", None), p.hidden)
             for p in params]
    assert shown == HELP
    for p in params:  # the default the command line gives is the field's
        assert p.default == fields[p.name].default
    for command in ("inspect", "rollout"):
        names = {p.name for p in _command(command).params}
        assert {f.name for f in dataclasses.fields(ModelInput)} <= names


@pytest.mark.parametrize("values, message", [
    ({"run": CaptureRun(truncate=True, long="refuse")},
     "--truncate is --long truncate; give one of --truncate and --long refuse."),
    ({"corpus": CorpusOptions(batch_size=3)},
     "--batch-size goes with --corpus (per-head statistics over a text file)."),
    ({"summary": SummaryOptions(rows="last")}, "--rows goes with --summary (a summary capture's settings)."),
    ({"summary": SummaryOptions(True), "run": CaptureRun(check=True)}, "--summary records no weights: drop --check."),
    ({"run": CaptureRun(max_file="lots")}, "--max-file 'lots': expected a size such as 4G, 500M or 0 (no limit)."),
    ({"output": CaptureOutput()}, "capture: name the file to write with -o FILE.safetensors (or .npz)."),
    ({"output": CaptureOutput("a.txt")}, "-o a.txt: a capture is written as .safetensors or .npz."),
    ({"run": CaptureRun(no_weights=True, target="next")}, "--target needs the weights; drop --no-weights."),
    ({"run": CaptureRun(layers=",")}, "--layers: give at least one site number."),
    ({"corpus": CorpusOptions(corpus=True), "run": CaptureRun(generate=2)},
     "--generate: a corpus run (--corpus) keeps per-head statistics, not the weights of one batch; drop it."),
    ({"corpus": CorpusOptions(corpus=True), "run": CaptureRun(text=["a"])},
     "--corpus reads its texts from --text-file FILE (one text a line), not --text."),
    ({"corpus": CorpusOptions(corpus=True), "run": CaptureRun(text_file="t.txt"), "output": CaptureOutput("a.npz")},
     "-o a.npz: a corpus file is written as .safetensors."),
])
def test_check_is_where_the_command_line_refuses(values, message):
    """``CaptureSettings.check()`` says what ``attnviz capture`` says, in its words (exit 2)."""
    options = CaptureSettings(model="m", **{"output": CaptureOutput("a.safetensors"), **values})
    with pytest.raises(UsageError) as raised:
        options.check()
    assert raised.value.message == message
    argv = []
    for group in dataclasses.fields(options)[1:]:
        value = getattr(options, group.name)
        for f in dataclasses.fields(value):
            given = getattr(value, f.name)
            if given == f.default or f.metadata.get("cli") is False:
                continue
            flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
            argv += [flag] if given is True else [flag, *given] if isinstance(given, list) else [flag, str(given)]
    result = CliRunner().invoke(app, ["capture", "m", *argv])
    assert (result.exit_code, result.output) == (2, f"attnviz: error: {message}\n")


def test_the_summary_settings_are_resolved_in_one_place():
    from attnviz.summarystats import DEFAULT_LOCAL, DEFAULT_POOL, DEFAULT_SINKS, SummarySettings

    assert SummaryOptions().settings() is None
    assert SummaryOptions(True).settings() == SummarySettings(DEFAULT_SINKS, DEFAULT_LOCAL, DEFAULT_POOL, "last")
    assert SummaryOptions(True, 2, 8, 16, " None ").settings() == SummarySettings(2, 8, 16, None)
    rec = attnviz.capture(object(), summary=True, sinks=2, rows=None)  # the API's None: no rows, as --rows none
    assert rec.summary == SummarySettings(2, DEFAULT_LOCAL, DEFAULT_POOL, None) and not rec.weights and not rec.qkv
    assert attnviz.capture(object(), rows="0,5").summary is None  # rows without a summary: unused, as before


@pytest.mark.parametrize("keywords, message", [
    ({"weights_dtype": "int8"}, "attnviz.capture: weights_dtype='int8': expected one of float32, float16, bfloat16."),
    ({"sinks": 3}, "attnviz.capture: sinks=… goes with summary=True (a summary capture's settings)."),
    ({"summary": True, "sinks": 0}, "attnviz.capture: sinks=0: must be at least 1."),
    ({"summary": True, "target": "next"}, "attnviz.capture: summary=True records no weights: drop target=…."),
    ({"weights": False, "target": 5}, "attnviz.capture: target=… needs the weights; drop weights=False."),
])
def test_the_api_checks_capture_as_the_command_line_does(keywords, message):
    """``attnviz.capture`` builds the same object and runs the same checks, said in its keywords."""
    with pytest.raises(UsageError) as raised:
        attnviz.capture(object(), **keywords)
    assert raised.value.message == message


def test_a_summary_without_weights_stays_allowed_in_the_api():
    assert attnviz.capture(object(), summary=True, weights=False).summary is not None


@pytest.mark.parametrize("keywords, message", [
    ({"batch_size": 0}, "attnviz.corpus: batch_size=0: must be at least 1."),
    ({"sink_threshold": 1.5}, "attnviz.corpus: sink_threshold=1.5: must be at most 1.0."),
    ({"long": "maybe"}, "attnviz.corpus: long='maybe': expected one of truncate, refuse."),
    ({"blocked_from": -1}, "attnviz.corpus: blocked_from=-1; a number of bytes, 0 or more."),
    ({"token_class": ["bad"]}, "attnviz.corpus: token_class='bad': expected NAME=REGEX, e.g. digits=[0-9]+."),
])
def test_the_api_checks_a_corpus_as_the_command_line_does(keywords, message):
    """``attnviz.corpus``'s options are the command line's corpus options, with their bounds and choices (a sink
    threshold is a weight, in [0, 1]), refused before the model is touched."""
    with pytest.raises(UsageError) as raised:
        attnviz.corpus(object(), None, ["a text"], **keywords)
    assert raised.value.message == message


# -- a capture option added as ARCHITECTURE.md's recipe says: --no-qkv


def test_no_qkv_keeps_the_weights_and_masks_only(tmp_path, tmp_path_factory):
    """``--no-qkv``: the weights (the model's own eager ``output_attentions``) and the masks, no q, k or v; the file
    inspects as the full capture does; what reads q, k or v is refused in one line."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors import safe_open

    from tests.test_capture import _cli, bert_folder  # noqa: F401

    folder = bert_folder.__wrapped__(tmp_path_factory)  # type: ignore[attr-defined]
    texts = ["the cat sat on the mat", "a dog ran"]
    files = {}
    for name, extra in (("full", []), ("weights", ["--no-qkv"])):
        files[name] = tmp_path / f"{name}.safetensors"
        done = _cli("capture", str(folder), *(w for t in texts for w in ("--text", t)), "-o", str(files[name]),
                    "--quiet", *extra)
        assert done.exit_code == 0, done.stderr
    with safe_open(str(files["weights"]), "np") as f:
        kept = {k: f.get_tensor(k) for k in f.keys()}
    assert not [k for k in kept if k.rsplit(".", 1)[-1] in ("q", "k", "v")]
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    with torch.no_grad():
        eager = model(**tok(texts, return_tensors="pt", padding=True), output_attentions=True).attentions
    for layer, want in enumerate(eager):
        np_want = want.numpy()
        real = kept[f"layers.{layer}.real_keys"]  # padded keys: weights of rows that are not the model's own
        got = kept[f"layers.{layer}.weights"]
        for b in range(len(texts)):
            n = int(real[b].sum())
            assert abs(got[b, :, :n, :n] - np_want[b, :, :n, :n]).max() < 1e-5
    inspected = [json.loads(_cli("inspect", str(files[n]), "--json").stdout) for n in ("full", "weights")]
    assert [d["head_stats"] for d in inspected] == [inspected[0]["head_stats"]] * 2 and inspected[0]["head_stats"]
    refused = _cli("inspect", str(files["weights"]), "--weigh-by", "value-norms")
    assert refused.exit_code == 1 and "captured without its values" in refused.stderr
    for extra, words in ((["--check"], "--check recomputes each site from its q and k; drop --no-qkv."),
                         (["--no-weights"], "--no-qkv and --no-weights would keep the masks alone; drop one."),
                         (["--summary"], "--summary keeps no q, k and v anyway: drop --no-qkv."),
                         (["--corpus"], "--no-qkv: a corpus run (--corpus) keeps per-head statistics, not the weights "
                                        "of one batch; drop it.")):
        done = _cli("capture", str(folder), "--text", "a", "-o", str(tmp_path / "x.safetensors"), "--no-qkv", *extra)
        assert (done.exit_code, done.stderr) == (2, f"attnviz: error: {words}\n")
