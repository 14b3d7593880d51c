"""The errors attnviz raises for a user to read.

Each carries the exit code the command line ends with: 1 for bad data or a failure at run time,
2 for bad usage. The message is one or two lines that name the file, what was wrong and, where it
helps, what to do.
"""

from __future__ import annotations

from collections.abc import Iterable


def shape_str(shape: Iterable[int]) -> str:
    """A shape as messages write it: ``[2, 3, 4]``."""
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


class AttnvizError(Exception):
    """Base of every error meant for the user. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(AttnvizError):
    """Bad usage: a missing file, an unknown file type, an invalid option value (exit 2)."""

    exit_code = 2


class InputError(AttnvizError):
    """An input file cannot be read or holds the wrong kind of data (exit 1)."""


class ShapeError(AttnvizError):
    """Arrays whose shapes do not fit together (exit 1)."""


class ParamsError(AttnvizError):
    """A parameter file with a missing, extra or wrongly shaped entry (exit 1)."""


class DeviceError(AttnvizError):
    """The requested device or precision is not available (exit 1)."""


class OutputError(AttnvizError):
    """An output file cannot be written (exit 1)."""


#: how the command line names recording a model (the Python API says ``attnviz.capture(model)``)
CAPTURE_HINT = "attnviz capture (attnviz.capture(model) in Python)"
#: how the command line says to record a model on some text, and to record the gradients of a target; the
#: Python API says ``PYTHON_WORDS[...]`` instead (``attnviz.api.wording``)
CAPTURE_RUN = "attnviz capture MODEL_DIR --text ... -o run.safetensors"
CAPTURE_TARGET = "attnviz capture --target next (or a token)"
PYTHON_WORDS = {CAPTURE_HINT: "attnviz.capture(model)",
                CAPTURE_RUN: "attnviz.capture(model, tokenizer) around a forward pass",
                CAPTURE_TARGET: 'attnviz.capture(model, target="next") (or a token id) around a forward pass'}


def no_weights(subject: str) -> str:
    """The message for a dump with no attention weights in it (``subject``: "attn.npz holds no arrays",
    "weights is an empty tuple"): what a model built with SDPA or flash attention gives for
    ``output_attentions``, and what to do."""
    return (f"{subject}: what a model run with SDPA or flash attention gives (it returns no attention weights); "
            "load the model with attn_implementation=\"eager\" and run it with output_attentions=True, or record it "
            f"with {CAPTURE_HINT}.")
