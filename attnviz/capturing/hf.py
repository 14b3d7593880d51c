"""Capture through transformers' attention interface: one mechanism for every family that routes its
attention through ``ALL_ATTENTION_FUNCTIONS`` (Llama, Mistral, Qwen, Gemma, gpt-oss, BERT, BART, T5,
Whisper, GPT-2 and more).

While a capture is open, every config of the model (sub-configs included) names the implementation
``attnviz_capture``, registered once with ``transformers.AttentionInterface`` together with
``masking_utils.eager_mask`` under the same name in ``AttentionMaskInterface`` (without it the mask would
be dropped). The registered function receives the very q, k, v, mask, scale and extras the model
multiplies; it computes the weights with the family's own ``eager_attention_forward`` (the model's exact
eager probabilities: softcaps, sinks, T5's bias included) and hands the model the output of the
implementation the model was loaded with (SDPA gets its boolean mask back), so that what the model
computes is what it computes outside the capture. On exit every config names its implementation again.

torch and transformers are imported here only, when a capture starts.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from attnviz.capturing.blame import model_call
from attnviz.capturing.recorder import HostArray, Pending, Recorder, Site
from attnviz.errors import AttnvizError, InputError, UsageError

IMPLEMENTATION = "attnviz_capture"
#: a capture's progress is told at most this often (seconds) while a summary's blocks of rows are summed
PROGRESS_EVERY = 0.1
#: attribute names of an attention module's output projection, by family
OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "o", "c_proj", "dense", "wo", "out", "proj")
CROSS_NAMES = ("encoder_attn", "crossattention", "cross_attn", "encdecattention", "cross_attention")
#: the implementations registered with transformers in this process
_registered: set[str] = set()
_lock = threading.Lock()
#: the open captures, by id of each attention module they own
_owners: dict[int, HFCapture] = {}
#: the open captures, by id of each config of their models (the mask function is handed the config)
_config_owners: dict[int, HFCapture] = {}


def register_implementation(name: str, attention: Any, mask: Any) -> None:
    """``attention`` and ``mask`` registered under ``name`` with transformers' ``AttentionInterface`` and
    ``AttentionMaskInterface``, once a process (a capture's, ``attnviz ablate``'s)."""
    with _lock:
        if name in _registered:
            return
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(name, attention)
        AttentionMaskInterface.register(name, mask)
        _registered.add(name)


def _register() -> None:
    register_implementation(IMPLEMENTATION, _attention, _mask)


def _mask(*args: Any, **kwargs: Any) -> Any:
    """The mask of a capture's model: eager's additive float mask where the capture computes exact weights
    with the family's eager function; else SDPA's boolean mask, or None where SDPA's ``is_causal`` stands in
    for it (summaries and ``--no-weights``: no [L, L] floats are built)."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    owner = _config_owners.get(id(kwargs.get("config")))
    if owner is not None and owner.light:
        return model_call(sdpa_mask, *args, **kwargs)
    return model_call(eager_mask, *args, **kwargs)


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> tuple[Any, Any]:
    owner = _owners.get(id(module))
    if owner is None:  # a module of a model whose capture has ended but whose config was copied: plain eager
        return model_call(eager_of(module), module, query, key, value, attention_mask, **kwargs)
    return owner.attend(module, query, key, value, attention_mask, **kwargs)


def eager_of(module: Any) -> Any:
    """The family's own eager attention (its modeling module's ``eager_attention_forward``)."""
    found = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if found is None:
        from transformers.integrations.sdpa_attention import repeat_kv  # noqa: F401 - the generic eager below
        return _generic_eager
    return found


def _generic_eager(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None,
                   dropout: float = 0.0, **kwargs: Any) -> tuple[Any, Any]:
    """Eager attention as Llama's, for a family whose module has none of its own."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def attention_modules(model: Any) -> dict[int, str]:
    """The model's modules that look like attention (a class named ``...Attention`` with no such module inside), by
    id, in the model's order: its layers' order in a decoder."""
    out = {}
    for name, module in model.named_modules():
        cls = type(module).__name__
        if not cls.endswith("Attention"):
            continue
        inner = any(type(m).__name__.endswith("Attention") for n, m in module.named_modules() if n)
        if not inner:
            out[id(module)] = name
    return out


def configs_of(model: Any) -> list[Any]:
    """Every config of a model: its own, its submodels', and their sub-configs, each once."""
    from transformers import PretrainedConfig

    found: dict[int, Any] = {}
    pending = [model.config, *(getattr(m, "config", None) for m in model.modules())]
    while pending:
        config = pending.pop()
        if not isinstance(config, PretrainedConfig) or id(config) in found:
            continue
        found[id(config)] = config
        for name in getattr(config, "sub_configs", {}) or {}:
            pending.append(getattr(config, name, None))
    return list(found.values())


@contextmanager
def implementation(model: Any, name: str) -> Iterator[dict[int, Any]]:
    """Every config of ``model`` names the attention implementation ``name`` within the block; each names
    its own again afterwards, also after an exception. Yields the configs' own implementations."""
    configs = configs_of(model)
    before = {id(c): (c, c.__dict__.get("_attn_implementation_internal")) for c in configs}
    try:
        for config in configs:
            config._attn_implementation_internal = name
        yield {k: v[1] for k, v in before.items()}
    finally:
        for config, value in before.values():
            config._attn_implementation_internal = value


#: tensors from this size on are copied into reused pinned buffers (smaller ones, such as generate()'s steps,
#: plainly: a pinned allocation per new shape would cost more than the copy)
PINNED_FROM = 1 << 20


class HostPool:
    """Pinned host buffers reused across layers for copies from a GPU (the copy runs beside the next
    layer's compute and the writer waits for it), or plain NumPy conversion on the CPU."""

    def __init__(self) -> None:
        self.free: dict[tuple[Any, ...], list[Any]] = {}
        self.lock = threading.Lock()

    def host(self, tensor: Any, dtype: Any) -> HostArray:
        import torch

        t = tensor.detach()
        if t.dtype != dtype:
            t = t.to(dtype)
        if t.device.type == "cpu":
            return _numpy(t.contiguous())
        if t.numel() * t.element_size() < PINNED_FROM:  # a step's rows: a plain copy costs less than pinning
            return _numpy(t.cpu())
        key = (tuple(t.shape), t.dtype)
        with self.lock:
            free = self.free.setdefault(key, [])
            buf = free.pop() if free else None
        if buf is None:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()

        def wait() -> np.ndarray:
            event.synchronize()
            return _numpy(buf)

        def release() -> None:
            with self.lock:
                self.free.setdefault(key, []).append(buf)

        return Pending(wait, release)


def _numpy(t: Any) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class HFCapture:
    """A capture of one transformers model: the attention sites it runs, recorded by ``recorder``."""

    def __init__(self, model: Any, recorder: Recorder, weights_dtype: str = "float32", weights: bool = True,
                 qkv: bool = True, target: Any = None, summary: Any = None,
                 corpus: Any = None) -> None:
        import torch

        self.model = model
        self.rec = recorder
        self.names = {id(m): n for n, m in model.named_modules()}
        self.modules = {n: m for n, m in model.named_modules()}
        self.encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        self.weights = weights
        self.qkv = qkv
        self.dtype = getattr(torch, weights_dtype)
        self.pool = HostPool()
        self.originals: dict[int, Any] = {}
        self.routed: set[int] = set()
        self.ran: set[int] = set()
        self.forwards = 0
        self.hooks: list[Any] = []
        self.target = target
        self.corpus = corpus  # an ``attnviz.capturing.corpus.CorpusAccumulator``: the weights go there
        self.graph: dict[str, Any] = {}  # with a target: each site's weights, kept for the gradient
        self.note: str | None = None
        self.logits: Any = None
        self.original = "eager"
        #: ``attnviz.summarystats.SummarySettings``: record each site's summary instead of its weights
        self.summary = summary
        #: the parts of each mask tensor seen in this forward, by id (the tensor kept, so that its id stays its own)
        self.parts_of: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}
        #: the kinds of attention layer checked against their family's eager attention (``_check_family``)
        self.checked_kinds: set[tuple[Any, ...]] = set()
        self.dense_bytes = 0  # the dense masks kept (masks not made of padding, causal and a window)
        #: inside the model's generate(): a summary keeps the prompt's last row (it decodes the first new token)
        self.generating = False
        #: ``progress(done, total)``: told, while the model's first forward runs (the prompt's, under generate()),
        #: how many of its ``total`` attention modules are done (a summary's share of rows summed counts too)
        self.progress: Any = None
        self.sites_done = 0
        self.sites_total = 0
        self.reported = 0.0  # when progress was last told (it is told at most every PROGRESS_EVERY seconds)

    @property
    def light(self) -> bool:
        """No exact weights are computed (a summary, q, k and v only, or a corpus's long text): masks stay boolean
        or are not built."""
        return self.summary is not None or (not self.weights and self.target is None) or self.blocked

    @property
    def blocked(self) -> bool:
        """A corpus's long text runs: each site hands the corpus its q and k (statistics a block of query rows at a
        time, ``capturing.corpuslong``), and no weights are computed."""
        return self.corpus is not None and getattr(self.corpus, "long_text", None) is not None

    # -- opening and closing

    @contextmanager
    def opened(self) -> Iterator[None]:
        _register()
        looks = attention_modules(self.model)
        self.sites_total = len(looks)
        for module in self.model.modules():
            _owners[id(module)] = self
        configs = configs_of(self.model)
        for config in configs:
            _config_owners[id(config)] = self
        for key, name in looks.items():
            module = self.modules[name]
            self.hooks.append(module.register_forward_pre_hook(lambda m, a, k=key: self.ran.add(k)))
        self.hooks.append(self.model.register_forward_pre_hook(self._inputs, with_kwargs=True))
        if self.target is not None:
            self.hooks.append(self.model.register_forward_hook(self._output))
        encoder = self._encoder()
        if encoder is not None:
            self.hooks.append(encoder.register_forward_pre_hook(self._encoder_inputs, with_kwargs=True))
        restore = self._watch_generate()
        try:
            with implementation(self.model, IMPLEMENTATION) as originals:
                self.originals = originals
                self.original = originals.get(id(self.model.config)) or "eager"
                yield
        finally:
            restore()
            for hook in self.hooks:
                hook.remove()
            self.hooks.clear()
            for module in self.model.modules():
                if _owners.get(id(module)) is self:
                    del _owners[id(module)]
            for config in configs:
                if _config_owners.get(id(config)) is self:
                    del _config_owners[id(config)]
            self.parts_of.clear()
        if self.forwards and not self.routed:
            raise InputError(f"{type(self.model).__name__}: its attention does not go through transformers' attention "
                             "interface, so attnviz cannot see it; load it with attn_implementation=\"eager\", run it "
                             "with output_attentions=True and give out.attentions to attnviz.inspect.")
        unseen = sorted(looks[k] for k in self.ran - self.routed if k in looks)
        if unseen:
            raise InputError(f"{type(self.model).__name__}: the attention module {unseen[0]} "
                             f"({type(self.modules[unseen[0]]).__name__}) computes its attention outside transformers' "
                             "attention interface; attnviz records all of a model or nothing.")

    def _watch_generate(self) -> Any:
        """The model's ``generate`` wrapped on the instance for the block (restored by the function returned):
        while it runs, a summary keeps the prompt's last row (the row that decodes the first new token), and the
        tokens it returns are recorded as ``generated_ids`` [B, N], the last one too, which no forward sees (the
        retrieval score checks every step's token). A decoder's own tokens only (an encoder-decoder's decoder
        starts from its own start token)."""
        generate = getattr(self.model, "generate", None)
        if not callable(generate) or self.encoder_decoder:
            return lambda: None
        had = "generate" in vars(self.model)
        before = vars(self.model).get("generate")

        def watched(*args: Any, **kwargs: Any) -> Any:
            self.generating = True
            try:
                out = generate(*args, **kwargs)
            finally:
                self.generating = False
            self._generated(out)
            return out

        vars(self.model)["generate"] = watched

        def restore() -> None:
            if had:
                vars(self.model)["generate"] = before
            else:
                vars(self.model).pop("generate", None)

        return restore

    def _generated(self, out: Any) -> None:
        """The tokens ``generate()`` returned past the prompt (the first forward's ``input_ids``)."""
        seqs: Any = out if _is_tensor(out) else getattr(out, "sequences", None)
        prompt = self.rec.inputs.get("input_ids")
        if seqs is None or not _is_tensor(seqs) or not prompt or seqs.dim() != 2:
            return
        start = int(prompt[0].shape[-1])
        if seqs.shape[-1] > start and seqs.shape[0] == prompt[0].reshape(-1, start).shape[0]:
            self.rec.inputs["generated_ids"] = [_numpy(seqs[:, start:].detach().cpu())]

    def _output(self, module: Any, args: Any, output: Any) -> None:
        logits = getattr(output, "logits", None)
        if logits is None and isinstance(output, tuple) and output:
            logits = output[0]
        self.logits = logits

    def describe(self) -> dict[str, Any]:
        """What the file's metadata says of the model."""
        import torch
        import transformers

        config = self.model.config
        return {"model_type": getattr(config, "model_type", None), "architecture": type(self.model).__name__,
                "transformers": transformers.__version__, "torch": torch.__version__,
                "implementation": self.original, "dtype": str(getattr(self.model, "dtype", "")).removeprefix("torch."),
                "framework": "transformers"}

    def _encoder(self) -> Any:
        if not self.encoder_decoder:
            return None
        get = getattr(self.model, "get_encoder", None)
        try:
            return get() if callable(get) else None
        except Exception:  # noqa: BLE001 - a model without one
            return None

    def _inputs(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.forwards += 1
        self.parts_of.clear()  # the masks of the last forward are let go (a corpus runs thousands)
        cache = kwargs.get("past_key_values", kwargs.get("cache"))  # the name transformers 5 uses, or 4's
        continuing = False
        if cache is not None:
            try:
                continuing = int(cache.get_seq_length()) > 0
            except Exception:  # noqa: BLE001 - a legacy tuple cache
                continuing = bool(cache)
        names = ("decoder_input_ids", "decoder_attention_mask") if self.encoder_decoder else ("input_ids",
                                                                                            "attention_mask")
        given = dict(kwargs)
        if args and "input_ids" not in given:
            given["input_ids"] = args[0]
        if self.encoder_decoder and given.get("encoder_outputs") is None:
            self._encoder_inputs(module, (), {k: given.get(k) for k in ("input_ids", "attention_mask")})
        arrays = {n: _numpy(given[n].detach().cpu()) for n in names if _is_tensor(given.get(n))}
        if not continuing:
            self.rec.inputs.pop("generated_ids", None)  # a new run's generate() records its own
        self.rec.record_inputs(arrays, continuing, names)
        self.rec.stepping = continuing

    def _encoder_inputs(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        given = dict(kwargs)
        if args and "input_ids" not in given:
            given["input_ids"] = args[0]
        for name in ("input_ids", "attention_mask"):
            if _is_tensor(given.get(name)):
                self.rec.inputs[name] = [_numpy(given[name].detach().cpu())]

    # -- one call of an attention module

    def kind(self, name: str) -> str:
        low = name.lower()
        if any(part in low for part in CROSS_NAMES):
            return "cross"
        if not self.encoder_decoder:
            return "layers"
        return "encoder" if "encoder." in f"{low}." and "decoder" not in low else "decoder"

    def attend(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
               **kwargs: Any) -> tuple[Any, Any]:
        import torch

        self.routed.add(id(module))
        name = self.names.get(id(module), type(module).__name__)
        lq, lk = int(query.shape[-2]), int(key.shape[-2])
        info = {"scale": _number(kwargs.get("scaling", getattr(module, "scaling", None))),
                "window": _number(kwargs.get("sliding_window")), "softcap": _number(kwargs.get("softcap")),
                "sinks": kwargs.get("s_aux") is not None, "heads": int(query.shape[1]), "kv_heads": int(key.shape[1])}
        site = self.rec.site(id(module), self.kind(name), name, info)
        blocked = self.blocked
        want = site is not None and (self.weights or self.target is not None) and self.summary is None and not blocked
        eager_out = weights = None
        if want:
            eager_out, weights = model_call(eager_of(module), module, query, key, value, attention_mask, **kwargs)
        if self.target is not None and want:
            out = eager_out  # the weights take part in the output: the gradient reaches them
            self.graph[site.name] = weights  # type: ignore[union-attr]
        elif eager_out is not None and (self.original == "eager" or self.corpus is not None):
            out = eager_out  # a corpus keeps no logits: the weights' own output, not a second attention call
        else:
            out = self._original(module, query, key, value, attention_mask, kwargs, eager_out)
        if self.corpus is not None:
            if site is not None and blocked:
                with torch.no_grad():
                    self._corpus_blocked(site, module, query, key, attention_mask, kwargs)
            elif site is not None and weights is not None:
                self.corpus.add(site, weights, attention_mask)
        elif site is not None:
            with torch.no_grad():
                self._record(site, module, query, key, value, attention_mask, weights, kwargs, lq, lk)
        if self.progress is not None and self.forwards <= 1:
            self.sites_done += 1
            self._tell(self.sites_done, now=True)
        returned = weights if kwargs.get("output_attentions") else None
        return out, returned

    def _tell(self, done: float, now: bool = False) -> None:
        """``progress`` told of ``done`` sites of the first forward (not more often than every PROGRESS_EVERY s)."""
        at = time.monotonic()
        if now or at - self.reported >= PROGRESS_EVERY:
            self.reported = at
            self.progress(min(done, self.sites_total), self.sites_total)

    def _original(self, module: Any, query: Any, key: Any, value: Any, mask: Any, kwargs: dict[str, Any],
                  eager_out: Any) -> Any:
        """The output of the implementation the model was loaded with (SDPA with its boolean mask), or the
        eager output where that cannot be called here."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        plain = kwargs.get("softcap") is None and kwargs.get("s_aux") is None
        if self.original == "sdpa" and plain:
            fn = ALL_ATTENTION_FUNCTIONS["sdpa"]
            keep = None if mask is None else _keep(mask)
            out, _ = model_call(fn, module, query, key, value, keep, **kwargs)
            return out
        if eager_out is None:
            if self.light:  # the mask is boolean (or not built): eager attention adds a float mask
                mask = _additive(mask, query, key, module)
            eager_out, _ = model_call(eager_of(module), module, query, key, value, mask, **kwargs)
        if self.original not in ("eager", "sdpa") and self.note is None:
            self.note = (f"the model runs {self.original}, which attnviz cannot call from inside the capture: its "
                         "attention output was computed eagerly (the same weights, rounding may differ)")
        return eager_out

    def _record(self, site: Site, module: Any, query: Any, key: Any, value: Any, mask: Any, weights: Any,
                kwargs: dict[str, Any], lq: int, lk: int) -> None:
        import torch

        host = self.pool.host
        arrays: dict[str, HostArray] = {}
        step = self.rec.is_step(site, lq, lk)
        keep = None if mask is None else _keep(mask)
        if keep is not None and keep.shape[-1] != lk:
            keep = keep[..., :lk]
        parts, real = self._parts(module, site, keep, lq, lk, kwargs, mask)
        if self.summary is not None:
            self._summarise(site, module, query, key, keep, parts, kwargs, step, arrays)
        if weights is not None and self.weights:
            arrays["weights"] = host(weights, self.dtype)
        if self.qkv:
            arrays["q"] = host(query.transpose(1, 2), torch.float32)
            if not self.rec.is_step(site, lq, lk):
                arrays["k"] = host(key.transpose(1, 2), torch.float32)
                arrays["v"] = host(value.transpose(1, 2), torch.float32)
            elif site.kind != "cross":  # a step: only the new positions' keys and values (the rest came before)
                arrays["k"] = host(key.transpose(1, 2)[:, -lq:], torch.float32)
                arrays["v"] = host(value.transpose(1, 2)[:, -lq:], torch.float32)
        b = int(query.shape[0])
        if not step:
            site.info["mask"] = None if parts is None else parts.as_metadata()
        if site.info.get("mask") is not None:  # the mask as its parts: the padding vector, causal, the window
            if real is not None:
                arrays["real_keys"] = host(real.expand(b, lk).contiguous(), torch.bool)
        else:  # a mask of other parts: kept whole (its size said in the summary line)
            if keep is None:
                keep = torch.ones((b, 1, lq, lk), dtype=torch.bool, device=query.device)
            dense = keep.expand(keep.shape[0] if keep.shape[0] == b else b, *keep.shape[1:]).contiguous()
            self.dense_bytes += int(dense.numel())
            arrays["mask"] = host(dense, torch.bool)
        bias: Any = kwargs.get("position_bias")
        if bias is not None and _is_tensor(bias):
            arrays["position_bias"] = host(bias[..., -lq:, :lk] if bias.shape[-2] != lq else bias[..., :lk],
                                           torch.float32)
        self.rec.record(site, lq, lk, arrays)
        statics: dict[str, HostArray] = {}
        projection = None if self.summary is not None else self._projection(module, site, int(query.shape[1]),
                                                                            int(value.shape[-1]))
        if projection is not None:
            wo, bo = projection
            statics["wo"] = host(wo, torch.float32)
            if bo is not None:
                statics["bo"] = host(bo, torch.float32)
        sinks = kwargs.get("s_aux")
        if _is_tensor(sinks):
            statics["sinks"] = host(sinks, torch.float32)
        if statics:
            self.rec.record_static(site, statics)

    def _parts(self, module: Any, site: Site, keep: Any, lq: int, lk: int, kwargs: dict[str, Any],
               given: Any = None) -> tuple[Any, Any]:
        """The site's mask as parts (``attnviz.summarystats.MaskParts``) and its real keys, or (None, real keys)
        when it is not made of them; worked out once per mask tensor the model hands its layers (``given``, kept
        while the forward runs so that its id stays its own)."""
        from attnviz.summarytorch import mask_parts

        found = _number(kwargs.get("sliding_window"))
        window = None if found is None else int(found)
        self_attention = site.kind != "cross"
        causal = bool(getattr(module, "is_causal", False)) and self_attention
        source = keep if given is None else given
        key = (id(source), window, self_attention, causal, lq, lk)
        if keep is not None and key in self.parts_of:
            return self.parts_of[key][1:]
        parts, real = mask_parts(keep, causal=causal, window=window, lq=lq, lk=lk, self_attention=self_attention)
        if keep is not None:
            self.parts_of[key] = (source, parts, real)
        return parts, real

    def _summarise(self, site: Site, module: Any, query: Any, key: Any, keep: Any, parts: Any,
                   kwargs: dict[str, Any], step: bool, arrays: dict[str, HostArray]) -> None:
        """A site's summary (``attnviz.summarytorch``) into ``arrays``; a step of generate() keeps its
        row of weights whole ([B, H, 1, Lk]: what the retrieval probe reads)."""
        import torch

        from attnviz.summarystats import MaskParts
        from attnviz.summarytorch import step_row, summarise

        scale, softcap, sinks, bias = _scoring(module, query, key, kwargs)
        self._check_family(site, module, query, key, keep, parts, kwargs, scale, softcap, sinks, bias)
        host = self.pool.host
        if step:
            arrays["step_rows"] = host(step_row(query, key, scale=scale, dense=keep, softcap=softcap, sinks=sinks,
                                                bias=bias), torch.float32)
            return
        if parts is None:
            parts = MaskParts(causal=False, self_attention=site.kind != "cross")
        settings = self.summary
        if self.generating:  # the prompt's last row decodes the first new token: every step is kept
            chosen = (settings.rows or "").strip()
            settings = replace(settings, rows="last" if chosen in ("", "none") else f"{chosen},last")
        on_rows = None
        if self.progress is not None and self.forwards <= 1:  # the prompt's pass: its rows, a block at a time
            rows, lq = [0], max(1, int(query.shape[-2]))

            def on_rows(n: int) -> None:
                rows[0] += n
                if rows[0] < lq:  # the last block: the site's own report follows
                    self._tell(self.sites_done + rows[0] / lq)

        got = summarise(query, key, scale=scale, settings=settings, parts=parts, dense=keep, softcap=softcap,
                        sinks=sinks, bias=bias, on_rows=on_rows)
        for name, value in got.items():
            if name != "real_keys":
                arrays[name] = host(value, value.dtype)

    def _corpus_blocked(self, site: Site, module: Any, query: Any, key: Any, mask: Any, kwargs: dict[str, Any]) -> None:
        """A corpus's long text: the site's q, k, mask (as its parts where it is made of them) and the family's
        scale, softcap, sinks and position bias to the corpus (``CorpusAccumulator.add_blocked``), the family
        checked first as a summary's is."""
        from attnviz.summarystats import MaskParts

        lq, lk = int(query.shape[-2]), int(key.shape[-2])
        keep = None if mask is None else _keep(mask)
        if keep is not None and keep.shape[-1] != lk:
            keep = keep[..., :lk]
        parts, _ = self._parts(module, site, keep, lq, lk, kwargs, mask)
        scale, softcap, sinks, bias = _scoring(module, query, key, kwargs)
        self._check_family(site, module, query, key, keep, parts, kwargs, scale, softcap, sinks, bias,
                           instead="run the corpus with shorter texts (a text whose exact weights would be too "
                                   "large runs a block of rows at a time)")
        dense = None
        if parts is None:  # a mask of other parts: kept whole, sliced a block of rows at a time
            parts, dense = MaskParts(causal=False, self_attention=site.kind != "cross"), keep
        self.corpus.add_blocked(site, query, key, parts=parts, dense=dense, scale=scale, softcap=softcap, sinks=sinks,
                                bias=bias)

    def _check_family(self, site: Site, module: Any, query: Any, key: Any, keep: Any, parts: Any,
                      kwargs: dict[str, Any], scale: float, softcap: Any, sinks: Any, bias: Any,
                      instead: str = "capture its exact weights instead (without --summary)") -> None:
        """Once per kind of attention layer: the summary's weights of a few rows against the family's own eager
        attention on the same rows; a family whose settings the summary does not reproduce is refused, and so is
        one whose eager attention cannot be run on those rows (what cannot be compared is not trusted).

        A kind is the class and what changes its scores and mask: the sliding window, the softcap, sinks, a
        position bias, the scale, causal or not, cross attention or not. One class may hold several kinds
        (Gemma 2's sliding-window and global layers are both ``Gemma2Attention``; BART's encoder, decoder and
        cross attention are ``BartAttention``), and each is checked the first time it is met."""
        import torch

        from attnviz.summarytorch import step_row

        family = type(module).__name__
        kind = (family, _number(kwargs.get("sliding_window")), softcap, sinks is not None, bias is not None,
                float(scale), bool(getattr(module, "is_causal", False)), site.kind == "cross")
        if kind in self.checked_kinds:
            return
        lq, lk = int(query.shape[-2]), int(key.shape[-2])
        rows = sorted({0, lq // 2, lq - 1})
        q = query[:, :, rows]
        sub = None
        if keep is not None:
            sub = keep[:, :, rows]
        elif parts is not None and parts.causal:
            i = torch.tensor(rows, device=query.device)[:, None] + (lk - lq)
            sub = (torch.arange(lk, device=query.device)[None] <= i)[None, None]
        extra = dict(kwargs)
        if bias is not None:
            extra["position_bias"] = bias[..., rows, :]
        additive = None if sub is None else torch.where(sub, torch.zeros((), dtype=query.dtype, device=query.device),
                                                         torch.finfo(query.dtype).min)
        try:
            _, theirs = eager_of(module)(module, q, key, torch.zeros_like(key), additive, **extra)
        except Exception as exc:  # noqa: BLE001 - a family whose eager function cannot take a few rows
            # refused, not passed: a summary whose scores were never compared with the family's may be wrong
            # in every statistic, and nothing in the file would say so
            raise InputError(f"{family}: attnviz cannot check this family's attention on a few rows against its own "
                             f"eager attention (it raised {type(exc).__name__}), and does not compute it a block "
                             f"of rows at a time unchecked; {instead}.") from exc
        ours = step_row(q, key, scale=scale, dense=sub, softcap=softcap, sinks=sinks,
                        bias=None if bias is None else bias[..., rows, :])
        tol = 1e-4 if query.dtype == torch.float32 else 2e-2
        if theirs is not None and theirs.shape == ours.shape and sub is not None:  # rows that attend to nothing:
            live = sub.any(-1, keepdim=True)  # eager spreads them evenly (a mask of the dtype's minimum), no weights
            theirs, ours = torch.where(live, theirs.float(), 0.0), torch.where(live, ours, 0.0)
        if theirs is None or theirs.shape != ours.shape or not bool(torch.allclose(theirs.float(), ours, atol=tol)):
            raise InputError(f"{family}: attnviz cannot reproduce this family's attention a block of rows at a time "
                             f"(at {site.name}, its weights differ from what its scale, mask, softcap and sinks "
                             f"give); {instead}.")
        self.checked_kinds.add(kind)

    def _projection(self, module: Any, site: Site, heads: int, dv: int) -> tuple[Any, Any] | None:
        """The output projection's per-head slices ``[H, dv, d_model]`` and its bias, where found: on the
        module (``o_proj``, ``out_proj``, ``o``, ``c_proj`` ...), or BERT's ``attention.output.dense``."""
        if site.name in self.rec.statics:
            return None
        found = None
        for attr in OUTPUT_PROJECTIONS:
            layer = getattr(module, attr, None)
            if layer is not None and getattr(getattr(layer, "weight", None), "ndim", 0) == 2:
                found = layer
                break
        if found is None:
            parent = self.modules.get(site.module.rpartition(".")[0])
            layer = getattr(getattr(parent, "output", None), "dense", None)
            if layer is not None and getattr(getattr(layer, "weight", None), "ndim", 0) == 2:
                found = layer
        if found is None:
            return None
        w = found.weight.detach()
        matrix = w if type(found).__name__ == "Conv1D" else w.t()  # GPT-2's Conv1D stores [in, out]
        if matrix.shape[0] != heads * dv:
            return None
        bias = getattr(found, "bias", None)
        return matrix.reshape(heads, dv, matrix.shape[1]), (None if bias is None else bias.detach())

    # -- after the run

    def gradients(self, logits: Any, target: Any) -> None:
        """d(target logit at the last position) / d(weights) of every site, recorded as ``SITE.grad``
        (``target``: "next" for the model's top prediction, or a token id per row)."""
        import torch

        if not self.graph:
            raise InputError("--target: no attention weights were recorded to take the gradient of.")
        # each row's last real position (a right-padded row's is not the last column)
        mask = self.rec.inputs.get("decoder_attention_mask" if self.encoder_decoder else "attention_mask")
        position = np.full(logits.shape[0], logits.shape[1] - 1)
        if mask and mask[-1].shape == tuple(logits.shape[:2]):
            real = np.asarray(mask[-1]).astype(bool)
            position = np.where(real.any(1), real.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1), position)
        rows = torch.arange(logits.shape[0], device=logits.device)
        last = logits[rows, torch.as_tensor(position, device=logits.device)]
        if target == "next":
            ids = last.argmax(-1)
        else:
            if not 0 <= int(target) < last.shape[-1]:
                raise UsageError(f"--target {target}: no such token id; the model's vocabulary is "
                                 f"0..{last.shape[-1] - 1}.")
            ids = torch.as_tensor(target, device=last.device).reshape(-1).expand(last.shape[0])
        chosen = last.gather(1, ids[:, None]).sum()
        names = [n for n in self.graph if n in self.rec.run]
        grads = torch.autograd.grad(chosen, [self.graph[n] for n in names], allow_unused=True)
        for name, grad in zip(names, grads):
            if grad is None:
                continue
            self.rec.record_more(name, {"grad": self.pool.host(grad, torch.float32)})
        self.graph.clear()
        self.rec.metadata_extra["target_ids"] = [int(i) for i in ids.reshape(-1).tolist()]
        self.rec.metadata_extra["target_positions"] = [int(p) for p in position]


def _scoring(module: Any, query: Any, key: Any, kwargs: dict[str, Any]) -> tuple[float, Any, Any, Any]:
    """What the family does to a call's scores: its scale, softcap, gpt-oss's sinks (``s_aux``) and a position bias
    (T5's), cut to the call's rows and keys."""
    lq, lk = int(query.shape[-2]), int(key.shape[-2])
    scale = kwargs.get("scaling", getattr(module, "scaling", None))
    scale = float(query.shape[-1] ** -0.5 if scale is None else scale)
    softcap = _number(kwargs.get("softcap"))
    sinks = kwargs.get("s_aux") if _is_tensor(kwargs.get("s_aux")) else None
    given: Any = kwargs.get("position_bias")
    bias = None
    if _is_tensor(given):
        bias = given[..., -lq:, :lk] if given.shape[-2] != lq else given[..., :lk]
    return scale, softcap, sinks, bias


def _additive(mask: Any, query: Any, key: Any, module: Any) -> Any:
    """The float mask eager attention adds (0 kept, the dtype's minimum masked) from a boolean mask, or from
    none (SDPA's ``is_causal``: causal when the module is, for more than one row)."""
    import torch

    lq, lk = int(query.shape[-2]), int(key.shape[-2])
    if mask is None:
        if not getattr(module, "is_causal", False) or lq == 1:
            return None
        mask = torch.ones((lq, lk), dtype=torch.bool, device=query.device).tril(lk - lq)[None, None]
    if mask.dtype != torch.bool:
        return mask
    return torch.where(mask, torch.zeros((), dtype=query.dtype, device=query.device), torch.finfo(query.dtype).min)


def _keep(mask: Any) -> Any:
    """A boolean keep mask from the mask the attention function received (additive float: 0 kept, the
    dtype's minimum masked; or boolean already)."""
    import torch

    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "detach") and hasattr(value, "shape")


def _number(value: Any) -> float | int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() and abs(number) >= 1 else number


def check_model(model: Any) -> None:
    """A model attnviz can capture: a torch module with a transformers config."""
    if not hasattr(model, "named_modules") or not hasattr(model, "config"):
        raise AttnvizError(f"attnviz.capture: expected a transformers or Keras model; received {type(model).__name__}.")
