"""Every picture of the README and docs/ is what the command line beside it draws (issue 33, item 6): the
command is run again (``docs/pictures.py``: a --png or --overlay-png, --show in a pseudo-terminal, view's
screen headless) and its picture compared with the one the pages show. After a change that alters a
picture, ``python docs/pictures.py NAME`` makes it again."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "docs"))
import pictures  # noqa: E402

FOUND = pictures.pictures()


def test_every_picture_follows_its_command():
    shown = set(FOUND)
    stored = {p.name for p in pictures.IMAGES.glob("*.png")}
    assert shown == stored, f"pictures no page shows: {stored - shown}; missing: {shown - stored}"
    for picture in FOUND.values():
        assert "sample_inputs/" in picture.command, f"{picture.name}: its command reads no sample file"


@pytest.mark.parametrize("name", sorted(FOUND))
def test_the_picture_is_what_its_command_draws(name):
    from PIL import Image

    picture = FOUND[name]
    made = np.asarray(Image.open(io.BytesIO(pictures.make(picture))).convert("RGB")).astype(np.int16)
    shown = np.asarray(Image.open(picture.path).convert("RGB")).astype(np.int16)
    hint = f"{name} is not what `{picture.command}` draws now; run python docs/pictures.py {name}"
    assert made.shape == shown.shape, hint
    far = np.abs(made - shown).max(axis=-1) > 48  # font rendering may differ by a few levels; content not
    assert far.mean() < 0.002, hint


def test_every_input_list_names_every_format():
    """The help of every array argument and the pages that list the formats name each one the readers read."""
    import typer

    from attnviz.choices import INPUT_FORMATS, KEYED_FORMATS
    from attnviz.cli import app
    from attnviz.formats import BY_SUFFIX, FORMATS

    for suffix in [*BY_SUFFIX, ".json", "-"]:
        assert suffix in INPUT_FORMATS, suffix
    assert all(s in KEYED_FORMATS for f in FORMATS if f.keyed for s in f.suffixes)
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    checked = 0
    for name, command in commands.items():
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        if name in ("batch", "capture", "ablate", "merge", "serve", "variants", "repeat-test") or not arguments:
            continue
        first = " ".join(getattr(arguments[0], "help", "") .split())
        assert INPUT_FORMATS in first, f"attnviz {name} {arguments[0].name}: {first}"
        checked += 1
    assert checked >= 18
    for page in ("README.md", "docs/index.md", "docs/inputs.md", "docs/commands/inspect.md"):
        text = (ROOT / page).read_text()
        for suffix in (*BY_SUFFIX, ".json"):
            assert suffix in text, f"{page} does not name {suffix}"
