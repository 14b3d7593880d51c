"""Progress on a long single text (issue 48, item 7): while a capture's forward pass runs, the layers done (a
summary's share of a layer's rows as its blocks are summed), told to ``capture_folder``'s ``progress``; on the
command line a rich progress bar on stderr (the layer, tokens a second, the time left), on a terminal only and not
with --quiet, as the corpus's bar. The Llama of tests/test_summary.py."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.test_summary import _text, invoke, llama_folder  # noqa: E402, F401

TERMINAL = {"TTY_COMPATIBLE": "1", "COLUMNS": "120"}  # rich's switch: stderr is a terminal


@pytest.mark.parametrize("summary", [True, False])
def test_the_forward_pass_tells_its_progress(llama_folder: Path, tmp_path: Path, summary: bool,  # noqa: F811
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer is told once it is done, in order, up to all of them; a summary tells shares of a layer as its
    blocks of rows are summed; generate()'s later steps tell nothing (the bar is the prompt's)."""
    import transformers

    from attnviz.capturing import hf
    from attnviz.capturing.folder import capture_folder
    from attnviz.capturing.options import CaptureRun, CaptureSettings, SummaryOptions

    monkeypatch.setattr(hf, "PROGRESS_EVERY", 0.0)
    text = _text(1500)
    told: list[tuple[float, int, int]] = []
    options = CaptureSettings(model=str(llama_folder), run=CaptureRun(generate=2), summary=SummaryOptions(summary))
    capture_folder(options, [text], tmp_path / "run.safetensors",
                   progress=lambda done, total, tokens: told.append((done, total, tokens)))
    tokens = len(transformers.AutoTokenizer.from_pretrained(llama_folder)(text)["input_ids"])
    assert {t for _, _, t in told} == {tokens} and {n for _, n, _ in told} == {2}  # 2 layers
    done = [d for d, _, _ in told]
    assert done == sorted(done) and done[-1] == 2
    assert [d for d in done if d == int(d)] == [1, 2]  # each layer once: generate()'s steps tell nothing
    if summary:  # 1500 rows of 4 heads: blocks of rows, each a share of its layer
        assert any(0 < d < 1 for d in done) and any(1 < d < 2 for d in done)


def test_a_progress_bar_on_a_terminal_only(llama_folder: Path, tmp_path: Path,  # noqa: F811
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from attnviz.cli import app
    from attnviz.cli.commands import capture

    monkeypatch.setattr(capture, "BAR_AFTER", 0.0)  # a short capture's bar appears too
    text = _text(1500)

    def run(*extra: str, env: dict[str, str] | None = None) -> object:
        got = CliRunner().invoke(app, ["capture", str(llama_folder), "--text", text, "--summary", "-o",
                                       str(tmp_path / "s.safetensors"), *extra], env=env)
        assert got.exit_code == 0, got.stderr
        return got

    shown = run(env=TERMINAL)
    assert "summary" in shown.stderr and "layer 2/2" in shown.stderr and "tokens/s" in shown.stderr, shown.stderr
    assert "captured summaries of 2 attention sites" in shown.stdout
    exact = CliRunner().invoke(app, ["capture", str(llama_folder), "--text", _text(300), "-o",
                                     str(tmp_path / "e.safetensors")], env=TERMINAL)
    assert exact.exit_code == 0 and "capture" in exact.stderr and "layer 2/2" in exact.stderr, exact.stderr
    for got in (run("--quiet", env=TERMINAL), run()):  # --quiet, and a pipe: no bar
        assert "layer" not in got.stderr and "tokens/s" not in got.stderr, got.stderr
