"""attnviz for Keras users: ``AttentionMonitor``, a callback that records a model's attention while it trains and
writes what ``attnviz inspect`` reports of it to TensorBoard (``attnviz.monitoring``).

    >>> from attnviz.keras import AttentionMonitor
    >>> model.fit(x, y, epochs=20, callbacks=[AttentionMonitor(x_val[:8], log_dir="logs/attnviz")])

Keras is imported when ``AttentionMonitor`` is first used, not with this module."""

from __future__ import annotations

from typing import Any

#: the names this module gives, made when first asked for (PEP 562)
NAMES = ("AttentionMonitor",)
__all__ = [*NAMES]


def __getattr__(name: str) -> Any:
    if name in NAMES:
        from attnviz.monitoring.callback import keras_callback

        return keras_callback()
    raise AttributeError(f"module 'attnviz.keras' has no attribute {name!r}")
