"""A model run with chosen heads restricted, through transformers' attention interface, as a capture is.

While ``restricted(model, plan)`` is open, every config of the model names the implementation ``attnviz_ablate``,
registered once with ``transformers.AttentionInterface`` together with SDPA's mask function under the same name.
The registered function receives each layer's q, k, v and boolean mask. A layer no entry restricts is handed to the
implementation the model was loaded with, unchanged. In a layer with restricted heads, the mask of each restricted
(entry, head) is cut down to the keys the restriction keeps (``heads.Restriction``: the first ``sink`` real keys and
the last ``recent``, or a window), the model's own implementation runs once with that per-head mask, and a head
removed has its output (before the output projection) zeroed or replaced by its mean over the prompt's real rows.

Under ``generate()`` a decode step's row sees what the restriction leaves of the cache: a streaming head reads
the first ``sink`` and the last ``recent`` entries, as DuoAttention's streaming cache holds them.

torch and transformers are imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from attnviz.ablation.heads import Geometry, Plan, Restriction
from attnviz.capturing.blame import model_call
from attnviz.capturing.hf import attention_modules, eager_of, implementation, register_implementation
from attnviz.errors import InputError

IMPLEMENTATION = "attnviz_ablate"
#: the open runs, by id of each attention module of their models
_owners: dict[int, Restricting] = {}


def _register() -> None:
    from transformers.masking_utils import sdpa_mask

    register_implementation(IMPLEMENTATION, _attention, sdpa_mask)


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> tuple[Any, Any]:
    owner = _owners.get(id(module))
    if owner is None:  # a module whose run has ended but whose config was copied: plain SDPA
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return model_call(ALL_ATTENTION_FUNCTIONS["sdpa"], module, query, key, value, attention_mask, **kwargs)
    return owner.attend(module, query, key, value, attention_mask, **kwargs)


def geometry(model: Any) -> Geometry:
    """The model's attention layers and heads, from its (text) config."""
    config = model.config
    config = getattr(config, "text_config", None) or config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not isinstance(layers, int) or not isinstance(heads, int):
        raise InputError(f"{type(model).__name__}: its config names no num_hidden_layers and num_attention_heads; "
                         "attnviz ablate restricts the heads of decoder language models.")
    kv = getattr(config, "num_key_value_heads", None) or heads
    return Geometry(layers, heads, int(kv))


class Restricting:
    """One run of ``model`` with ``plan``'s heads restricted. ``layers`` maps each attention module (by id) to
    its layer number (the order of the model's attention modules)."""

    def __init__(self, model: Any, plan: Plan, geometry: Geometry) -> None:
        self.model = model
        self.plan = plan
        self.geometry = geometry
        found = attention_modules(model)
        self.layers = {key: i for i, key in enumerate(found)}
        self.names = found
        self.routed: set[int] = set()
        self.ran: set[int] = set()  # the attention modules that ran (a layer below a recorded prefix does not)
        #: a head replaced by its mean: (entry, layer, head) -> its mean output over the prompt's real rows
        self.means: dict[tuple[int, int, int], Any] = {}

    def attend(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
               **kwargs: Any) -> tuple[Any, Any]:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.routed.add(id(module))
        layer = self.layers.get(id(module))
        touched = layer is not None and self.plan.touches(layer)
        # SDPA where the family's scores allow it; a softcap or gpt-oss's sinks: the family's eager attention,
        # handed an additive float mask (the mask the model builds here is SDPA's boolean one, or None)
        plain = kwargs.get("softcap") is None and kwargs.get("s_aux") is None
        if not touched:
            if plain:
                return model_call(ALL_ATTENTION_FUNCTIONS["sdpa"], module, query, key, value,  # type: ignore[no-any-return]
                                  attention_mask, **kwargs)
            keep = base_keep(attention_mask, query, key, module)
            return model_call(eager_of(module), module, query, key, value,  # type: ignore[no-any-return]
                              _additive(keep, query.dtype), **kwargs)
        assert layer is not None
        wanted = self.plan.at(layer)
        if len(wanted) != int(query.shape[0]):
            raise InputError(f"attnviz ablate: the plan restricts {len(wanted)} batch entries, the model ran "
                             f"{int(query.shape[0])}.")
        heads = int(query.shape[1])
        if heads != self.geometry.heads or int(key.shape[1]) != self.geometry.kv_heads:
            raise InputError(f"{type(self.model).__name__}: layer {layer} runs {heads} query and {int(key.shape[1])} "
                             f"key-value heads, its config says {self.geometry.heads} and {self.geometry.kv_heads}.")
        keep = base_keep(attention_mask, query, key, module)
        mask: Any = attention_mask
        if any(r.masks for entry in wanted for r in entry.values()):
            mask = restricted_keep(keep, wanted, heads)
        elif mask is None and not plain:
            mask = keep
        if plain:
            out, weights = model_call(ALL_ATTENTION_FUNCTIONS["sdpa"], module, query, key, value, mask, **kwargs)
        else:
            out, weights = model_call(eager_of(module), module, query, key, value, _additive(mask, query.dtype),
                                      **kwargs)
        if any(not r.masks for entry in wanted for r in entry.values()):
            out = self._outputs(out, wanted, keep, layer)
        return out, weights

    def _outputs(self, out: Any, wanted: list[dict[int, Restriction]], keep: Any, layer: int) -> Any:
        """The output (``[batch, rows, heads, dim]``) with removed heads zeroed or set to their mean."""
        out = out.clone()
        rows = int(out.shape[1])
        for b, entry in enumerate(wanted):
            for head, r in entry.items():
                if r.kind == "zero":
                    out[b, :, head, :] = 0
                elif r.kind == "mean":
                    known = self.means.get((b, layer, head))
                    if known is None or rows > 1:  # the prompt's rows (a decode step reuses their mean)
                        real = keep[b, 0].any(-1)  # rows that see a key: real rows (padding rows see none)
                        known = out[b, real, head, :].mean(0) if bool(real.any()) else out[b, :, head, :].mean(0)
                        self.means[(b, layer, head)] = known
                    out[b, :, head, :] = known
        return out


def base_keep(mask: Any, query: Any, key: Any, module: Any) -> Any:
    """The boolean keep mask (``[batch, 1, rows, keys]``) the model's own mask stands for: the mask as given (boolean,
    or an additive float mask), or causal where SDPA's ``is_causal`` stands in for it (None)."""
    import torch

    batch, lq, lk = int(query.shape[0]), int(query.shape[-2]), int(key.shape[-2])
    if mask is None:
        if getattr(module, "is_causal", True) and lq > 1:
            keep = torch.ones((lq, lk), dtype=torch.bool, device=query.device).tril(lk - lq)
        else:
            keep = torch.ones((lq, lk), dtype=torch.bool, device=query.device)
        return keep[None, None].expand(batch, 1, lq, lk)
    keep = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    keep = keep[:, :, :, :lk]
    if int(keep.shape[1]) != 1:
        keep = keep[:, :1]
    return keep.expand(batch, 1, lq, lk)


def restricted_keep(keep: Any, wanted: list[dict[int, Restriction]], heads: int) -> Any:
    """A per-head keep mask ``[batch, heads, rows, keys]``: ``keep`` for every head, cut down for the restricted
    ones. A row's position is its key index (the rows are the last ``rows`` of the keys: the cache before them);
    a streaming head's sink is the first ``sink`` real keys of its row (left padding moves them)."""
    import torch

    batch, _, lq, lk = (int(s) for s in keep.shape)
    out = keep.expand(batch, heads, lq, lk).clone()
    j = torch.arange(lk, device=keep.device)
    i = torch.arange(lk - lq, lk, device=keep.device)[:, None]
    for b, entry in enumerate(wanted):
        allowed: dict[Restriction, Any] = {}  # the keys each restriction keeps, made once an entry
        rank = None
        for head, r in entry.items():
            if not r.masks:
                continue
            if r not in allowed:
                if r.kind == "window":
                    allowed[r] = j[None, :] > i - r.window
                else:
                    real = keep[b, 0]
                    if rank is None:  # the rank of each key among its row's real keys: the first ``sink`` sink
                        rank = torch.cumsum(real.to(torch.int32), dim=-1)
                    allowed[r] = ((rank <= r.sink) & real) | (j[None, :] > i - r.recent)
            out[b, head] &= allowed[r]
    return out


def _additive(keep: Any, dtype: Any) -> Any:
    """Eager attention's additive mask (0 kept, the dtype's minimum masked) of a boolean keep mask."""
    import torch

    if keep.dtype != torch.bool:
        return keep
    return torch.where(keep, torch.zeros((), dtype=dtype, device=keep.device), torch.finfo(dtype).min)


@contextmanager
def restricted(model: Any, plan: Plan, geometry: Geometry) -> Iterator[Restricting]:
    """Within the block, ``model`` runs with ``plan``'s heads restricted; on exit it is as before. Refuses a model
    whose attention did not go through transformers' attention interface."""
    _register()
    run = Restricting(model, plan, geometry)
    if not run.layers:
        raise InputError(f"{type(model).__name__}: no attention module found (a class named ...Attention); attnviz "
                         "ablate restricts heads of models whose attention goes through transformers' attention "
                         "interface.")
    if len(run.layers) != geometry.layers:
        raise InputError(f"{type(model).__name__}: {len(run.layers)} attention modules, its config names "
                         f"{geometry.layers} layers; attnviz ablate restricts decoder language models' heads.")
    for module in model.modules():
        _owners[id(module)] = run

    modules = {id(m): m for m in model.modules()}
    hooks = [modules[key].register_forward_pre_hook(lambda m, a, k=key: run.ran.add(k)) for key in run.layers]
    try:
        with implementation(model, IMPLEMENTATION):
            yield run
    finally:
        for hook in hooks:
            hook.remove()
        for module in model.modules():
            if _owners.get(id(module)) is run:
                del _owners[id(module)]
    missing = [run.names[k] for k in run.layers if k in run.ran and k not in run.routed][:1]
    if missing:
        raise InputError(f"{type(model).__name__}: its attention ({', '.join(missing)} ...) does not go through "
                         "transformers' attention interface, so attnviz cannot restrict its heads.")
