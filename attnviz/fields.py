"""Declaring a run's options once: a dataclass field whose metadata says how the command line shows
it (``attnviz.cli.options.parameters`` makes the Typer options from it), as the variants' ``Params``
already do. The library reads only the values; the metadata is for the command line and the docs.

Metadata keys: ``help``; ``flag`` (default ``--field-name``) and ``short`` (``-q``); ``panel`` (the help
section); ``metavar``; ``min``, ``max``, ``above`` (bounds of a number); ``parse`` (a named parser for
values that are not plain numbers or choices: ``size``, ``positions``, ``norm``, ``ranges``, ``seed``);
``cli=False`` for a field the command line does not set.
"""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any

# help sections, in the order a command's help usually shows them
MASKS = "Masks"
PARAMS = "Learned parameters"
LABELS = "Labels"
RUN = "Device and precision"
OUTPUT = "Output"
CAPTURED = "Captured Q/K/V (layouts, grouped heads, RoPE)"
MODEL = "Model attention (--hf-config, or part by part)"
FIGURE = "Figure"
SELECT = "Selection"
CHECKS = "Checks (exit 3 when one fails)"
ROLLOUT = "Rollout"


def option(default: Any = MISSING, help: str = "", *, factory: Any = MISSING, **meta: Any) -> Any:  # noqa: A002
    """A dataclass field declaring an option: ``option(None, "the heatmap's title", panel=FIGURE)``."""
    metadata = {"help": help, **{k: v for k, v in meta.items() if v is not None}}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)
