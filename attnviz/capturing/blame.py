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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

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
