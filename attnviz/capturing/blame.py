"""Whose fault an exception out of a captured forward pass is: the model's, or attnviz's own code that ran
inside it.

A capture runs attnviz's code inside the model's forward (the attention function registered with transformers,
the mask function, forward hooks, Keras' wrapped layers; from there the recorder, the summary, a corpus's
accumulators). What the model raises (an input it cannot take, a family that breaks) is said as "the model
failed on the texts", exit 1; what attnviz's own code raises is a bug of attnviz, and is reported as the command
line reports any other internal error. They are told apart by the traceback: attnviz's code calls the model's
own code back only through ``model_call`` (the family's eager attention, the implementation the model was loaded
with, a wrapped layer's own call), so an exception is attnviz's when a frame of the ``attnviz`` package lies
between the forward's caller and where it was raised, with no ``model_call`` after that frame.

``run_forward`` runs a captured forward pass and says what went wrong in one line: the model's failure and a GPU out of
memory as errors the user can act on, attnviz's own as it was raised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from attnviz.errors import AttnvizError, DeviceError, InputError

T = TypeVar("T")


def model_call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)``: the model's own code, called from attnviz's code inside the forward; what it
    raises is the model's (``raised_by_attnviz`` stops at this frame)."""
    return function(*args, **kwargs)


def _ours(frame: Any) -> bool:
    """A frame of the attnviz package (told by its module's name: a file name may be relative, the folder moved)."""
    name = frame.f_globals.get("__name__") or ""
    return name == "attnviz" or name.startswith("attnviz.")


def raised_by_attnviz(exc: BaseException) -> bool:
    """Whether ``exc``, caught around a model's forward pass, was raised by attnviz's own code that the forward
    ran: a frame of the package below the one that caught it (the forward's caller), with no call back into the
    model (``model_call``) below that frame. Code that attnviz's frames call (torch's functions, a replaced
    method) counts as attnviz's."""
    tb = exc.__traceback__
    tb = None if tb is None else tb.tb_next  # the frame that called the forward and caught the exception
    ours = False
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is model_call.__code__:
            ours = False  # the model's code from here on, until attnviz's is called again
        elif _ours(frame):
            ours = True
        tb = tb.tb_next
    return ours


def run_forward(function: Callable[..., T], inputs: dict[str, Any], *, where: str, smaller: str,
                failed_on: str = "the texts") -> T:
    """``function(**inputs)``, a model's forward (or ``generate``) inside a capture. attnviz's errors pass as they
    are; a GPU out of memory is a ``DeviceError`` that names ``where`` and advises ``smaller`` (fewer texts or a
    smaller batch), a lower dtype or the CPU; any other exception is the model's (an ``InputError``, "the model
    failed on ``failed_on``") unless attnviz's own code raised it inside the forward (``raised_by_attnviz``: an
    internal error, raised as it is). ``function`` is called from this frame directly: a frame of attnviz's
    between this one and the model's (a lambda, a partial written in Python) would make every failure attnviz's."""
    import torch

    try:
        return function(**inputs)
    except AttnvizError:
        raise
    except torch.cuda.OutOfMemoryError:
        raise DeviceError(f"{where}: the GPU ran out of memory; {smaller}, --dtype bfloat16, or --device cpu.") \
            from None
    except Exception as exc:  # noqa: BLE001
        if raised_by_attnviz(exc):
            raise  # attnviz's own code inside the forward (a recorder, an accumulator): an internal error
        from attnviz.quoting import reason

        raise InputError(f"{where}: the model failed on {failed_on} ({reason(exc)}).") from None
