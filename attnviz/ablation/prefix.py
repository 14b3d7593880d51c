"""The layers below a restriction computed once: a head restricted at layer L leaves every layer below L as the
plain run computed it, so a batch whose restrictions all lie at layer L or above starts from the plain run's
hidden states after layer L - 1 (recorded once per text) instead of running the layers below again. The ranking
restricts one unit a forward, so this halves its cost on average.

Where the model's decoder layers are not found (a ``ModuleList`` of as many blocks as attention layers, each
holding one attention module, in order) or a layer returns something other than one hidden-state tensor, every
forward runs whole: the same numbers, at the full cost.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from attnviz.ablation.heads import Geometry
from attnviz.capturing.hf import attention_modules


def decoder_layers(model: Any, geometry: Geometry) -> list[Any] | None:
    """The model's decoder blocks in order (each holding its layer's attention module), or None."""
    import torch

    attention = list(attention_modules(model))
    for module in model.modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) != geometry.layers:
            continue
        inside = [[id(m) for m in block.modules() if id(m) in attention] for block in module]
        if all(len(ids) == 1 for ids in inside) and [ids[0] for ids in inside] == attention:
            return list(module)
    return None


class LayerPrefix:
    """The plain run's output of each decoder layer for one text (``recording``), and forwards that start above
    them (``starting_at``)."""

    def __init__(self, model: Any, geometry: Geometry) -> None:
        self.layers = decoder_layers(model, geometry)
        self.outputs: list[Any] | None = None

    @contextmanager
    def recording(self, entry: int = 0) -> Iterator[None]:
        """Keep batch entry ``entry``'s output of each layer (the plain run's) while the block runs."""
        self.outputs = None
        if self.layers is None:
            yield
            return
        found: list[Any] = [None] * len(self.layers)
        usable = [True]

        def keep(i: int) -> Any:
            def hook(module: Any, args: Any, output: Any) -> None:
                if hasattr(output, "detach") and getattr(output, "ndim", 0) == 3:
                    found[i] = output[entry:entry + 1].detach().clone()
                else:
                    usable[0] = False
            return hook

        hooks = [layer.register_forward_hook(keep(i)) for i, layer in enumerate(self.layers)]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()
        if usable[0] and all(x is not None for x in found):
            self.outputs = found

    @contextmanager
    def starting_at(self, layer: int, batch: int) -> Iterator[bool]:
        """Within the block, the layers below ``layer`` hand on the recorded hidden states (``batch`` copies)
        instead of computing them. Yields whether they do (False: nothing recorded, or ``layer`` is 0)."""
        if layer <= 0 or self.layers is None or self.outputs is None:
            yield False
            return
        hidden = self.outputs[layer - 1]
        below = self.layers[:layer]

        def passed(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            return hidden_states

        def recorded(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            return hidden.expand(batch, *hidden.shape[1:]).clone()

        for i, block in enumerate(below):
            block.forward = recorded if i == layer - 1 else passed
        try:
            yield True
        finally:
            for block in below:
                del block.forward
