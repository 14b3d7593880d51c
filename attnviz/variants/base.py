"""What every variant shares: its description (``Variant``), its result (``Result``), shape checks
in NumPy, and the masked softmax and scaled dot-product kernel in TensorFlow.

A variant module defines

* a ``Params`` dataclass of its options: each field's ``metadata["help"]`` is the option's help and
  the field name with ``-`` for ``_`` is the flag (a ``Literal`` type gives a choice);
* ``check(inputs, params, given)`` (NumPy only): validates the inputs' shapes and returns a
  ``Problem``: the weights' shape and, for variants with learned parameters, the ``ParamSpec`` of
  each (``given`` holds the arrays of ``--params``, or None, so that hyper-parameters such as the
  number of heads can be read off their shapes);
* ``compute(ctx, arrays, mask, params, learned)`` (TensorFlow): returns NumPy arrays in a ``Result``;
* one ``VARIANT = variant(__name__, ...)`` (``qkv_variant`` for a variant of ``QKV``), which reads
  those three and the docstring off the module, registered in ``attnviz/variants/__init__.py``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnviz.choices import MAX_WIDTH
from attnviz.device import Device, softmax_dtype, tensorflow
from attnviz.errors import AttnvizError, ShapeError, shape_str
from attnviz.storage import Place

if TYPE_CHECKING:  # NumPy is imported inside the functions: the registry must load without it

    import numpy as np

    from attnviz.io import Loaded
    from attnviz.masks import Mask
    from attnviz.params import ParamSpec
    from attnviz.scoring import Logits




@dataclass(frozen=True)
class InputSpec:
    """A positional array argument. ``name`` is also its key in an ``.npz`` bundle. All but the
    first may be left out on the command line when the first is a bundle holding every input;
    ``optional`` ones may be left out altogether."""

    name: str
    help: str
    optional: bool = False
    #: reads a form of this input that is not a plain array (opened spec -> entries such as the
    #: input itself, "mask" and "q_labels", as a bundle gives them), or None to read it as an array
    reader: Callable[[Any], dict[str, Loaded] | None] | None = None
    #: trailing axes that are not batch axes (2 for ``[..., L, d]``, 3 for ``[..., n_sent, n_word, d]``);
    #: None: 2, or more when the input has more axes than the weights (the pipeline flattens the rest)
    core: int | None = None


class NumericError(AttnvizError):
    """Values that overflowed the compute dtype (exit 1). ``stage`` says what came out non-finite
    ("the scores", "the output"); the pipeline adds which inputs are to blame."""

    def __init__(self, message: str, stage: str = "the result") -> None:
        super().__init__(message)
        self.stage = stage


@dataclass
class Problem:
    """What ``check`` found: the shapes of a run, before anything is computed."""

    weights_shape: tuple[int, ...]  # [..., Lq, Lk]
    specs: dict[str, ParamSpec] = field(default_factory=dict)  # learned parameters, in drawing order
    #: the shape user masks broadcast against, when it is not the weights' shape: multi-head weights
    #: [B, N, T, S] take masks [B, T, S] (as Keras attention_mask) with the head axis inserted at -3
    mask_shape: tuple[int, ...] | None = None
    #: a keep mask the variant itself imposes (an attention window), ANDed with the user's masks
    keep: np.ndarray | None = None
    keep_described: str = ""
    files: list[Place] = field(default_factory=list)  # further files read (an adjacency), never overwritten


@dataclass(frozen=True)
class View:
    """A further map of a ``Result`` to show beside the weights (table, PNG panel)."""

    name: str  # its key in ``Result.maps``
    title: str
    axis: str = "both"  # "both": [..., Lq, Lk]; "q": a vector over queries [..., Lq]; "k": over keys [..., Lk]
    stats: bool = False  # a distribution per row: show per-query statistics of it too
    png: bool | None = None  # draw it in the heatmap; by default 2-D maps are drawn and vectors are not

    def __post_init__(self) -> None:
        if self.png is None:
            object.__setattr__(self, "png", self.axis == "both")


@dataclass
class Result:
    """What a variant computes, as NumPy arrays."""

    weights: np.ndarray  # the primary attention map [..., Lq, Lk]
    output: np.ndarray | None  # [..., Lq, d_v], or None when the variant has no output
    params: dict[str, Any] = field(default_factory=dict)  # hyper-parameters actually used
    maps: dict[str, np.ndarray] = field(default_factory=dict)  # further maps a variant has
    views: list[View] = field(default_factory=list)  # which maps to show, and how
    warnings: list[str] = field(default_factory=list)
    #: the keep mask actually applied, when the variant computes it from the data (local-p's window)
    keep: np.ndarray | None = None


@dataclass(frozen=True)
class Variant:
    """One attention type: the registry holds one of these per command."""

    name: str
    summary: str  # one line, for `attnviz variants` and the command's help
    formula: str  # plain-text formula
    doc: str  # the module docstring: formula, shapes, references
    inputs: tuple[InputSpec, ...]
    params: type  # a dataclass of options
    check: Callable[[Mapping[str, Loaded], Any, Mapping[str, np.ndarray] | None], Problem]
    compute: Callable[[Context, Mapping[str, np.ndarray], Mask, Any, Mapping[str, np.ndarray]], Result]
    query_input: str = "q"  # the input whose JSON labels label the query axis
    key_input: str = "k"  # ... and the key axis
    learned: bool = False  # has learned parameters: --params, --seed, --save-params
    #: parameters from somewhere other than --params (a saved Keras model): (arrays, file, option)
    external_params: Callable[[Any], tuple[dict[str, np.ndarray], Place, str] | None] | None = None
    axis_names: tuple[str, str] = ("query", "key")  # what heatmaps and tables call the two axes
    weights_title: str = "weights"  # what the primary map is called beside further maps
    lead_names: tuple[str, ...] = ()  # names of the last leading axes of the weights, e.g. ("head",)
    seeds_samples: bool = False  # --seed also seeds sampling, so it may go with --params
    #: each row of weights depends only on its query row and all keys: long inputs run in row blocks
    blockwise: bool = False
    row_maps: Mapping[str, int] = field(default_factory=dict)  # maps split by rows, and along which axis
    query_defaults: tuple[str, ...] = ()  # optional inputs that default to the whole query input
    #: inputs q, k, v as hooks capture them: --layout, grouped heads and --rope apply (attnviz.captured)
    captured_qkv: bool = False


#: the inputs of the variants of queries, keys and values
QKV = (
    InputSpec("q", "queries [..., Lq, d_k], or one file holding q, k and v"),
    InputSpec("k", "keys [..., Lk, d_k]"),
    InputSpec("v", "values [..., Lk, d_v]"),
)


def variant(module: str, name: str, summary: str, formula: str, inputs: tuple[InputSpec, ...],
            **options: Any) -> Variant:
    """The ``Variant`` of the module named ``module`` (its ``__name__``): its docstring, ``Params``,
    ``check`` and ``compute`` are read off the module, so that each is written once; ``options`` are
    further fields of ``Variant``. Called last in the module, when all of them are defined."""
    defined = sys.modules[module]
    return Variant(name=name, summary=summary, formula=formula, doc=defined.__doc__ or "", inputs=inputs,
                   params=defined.Params, check=defined.check, compute=defined.compute, **options)


def qkv_variant(module: str, name: str, summary: str, formula: str, **options: Any) -> Variant:
    """``variant`` for a variant of ``QKV``: it takes q, k and v as hooks capture them too
    (``captured_qkv``)."""
    return variant(module, name, summary, formula, QKV, captured_qkv=True, **options)


@dataclass
class Context:
    """The TensorFlow module, device and dtype a computation runs with."""

    device: Device
    dtype: str
    seed: int = 0  # for variants that sample (hard attention)
    logits: Logits | None = None  # a model's logit softcap and attention sinks, applied by masked_softmax
    #: arrays that stay unchanged for the whole run (the keys and values while blocks of query rows are
    #: computed), by id, with what was derived from them: each is converted to a tensor once
    held: dict[int, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    derived: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def tf(self) -> Any:
        return tensorflow()

    def hold(self, *arrays: np.ndarray) -> None:
        """Mark ``arrays`` as unchanged for the rest of the run: ``tensor`` and ``largest`` work on
        each once."""
        for arr in arrays:
            self.held.setdefault(id(arr), arr)

    def _once(self, what: str, arr: np.ndarray, make: Callable[[], Any]) -> Any:
        if self.held.get(id(arr)) is not arr:
            return make()
        key = (what, id(arr))
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]

    def largest(self, arr: np.ndarray) -> float:
        """``max |arr|``, as a float."""
        import numpy as np

        return float(self._once("largest", arr, lambda: float(np.max(np.abs(arr))) if arr.size else 0.0))

    def tensor(self, arr: np.ndarray) -> Any:
        """A NumPy array as a tensor of the run's dtype."""
        import numpy as np

        tf = self.tf
        return self._once("tensor", arr, lambda: tf.cast(tf.convert_to_tensor(np.asarray(arr)), self.dtype))

    def scalar(self, value: float, dtype: Any = None) -> Any:
        """A Python number as a tensor (``tf.constant``, not ``tf.cast``: that rounds through float32)."""
        return self.tf.constant(value, dtype=dtype or self.dtype)

    def host(self, tensor: Any) -> np.ndarray:
        """A tensor as NumPy without a copy when it lives in host memory (a read-only view of
        TensorFlow's buffer, which it keeps alive); from a GPU, a copy. bfloat16 as float32."""
        import numpy as np

        tf = self.tf
        if tensor.dtype == tf.bfloat16:
            tensor = tf.cast(tensor, tf.float32)
        return np.asarray(tensor)

    def numpy(self, tensor: Any) -> np.ndarray:
        """A tensor back as NumPy (bfloat16 as float32, which NumPy can hold)."""
        import numpy as np

        tf = self.tf
        if tensor.dtype == tf.bfloat16:
            tensor = tf.cast(tensor, tf.float32)
        return np.asarray(tensor.numpy())


# ----------------------------------------------------------------------------------------------
# Shape checks (NumPy only, before TensorFlow is imported)


def require_rank(loaded: Loaded, name: str, rank: int, layout: str) -> None:
    if loaded.data.ndim < rank:
        raise ShapeError(
            f"{loaded.source}: {name} must have at least {rank} dimensions {layout}; "
            f"received shape {shape_str(loaded.data.shape)}."
        )


def broadcast_leading(inputs: Mapping[str, Loaded], names: tuple[str, ...], core: int = 2) -> tuple[int, ...]:
    """Broadcast the leading (batch, head) dimensions of the named inputs, or say which clash."""
    import numpy as np

    shapes = [inputs[n].data.shape[:-core] for n in names]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listed = ", ".join(
            f"{inputs[n].source} {shape_str(inputs[n].data.shape)}" for n in names
        )
        raise ShapeError(
            f"the leading (batch/head) dimensions do not broadcast: {listed}; "
            "they must be equal or 1, as in [batch, heads, L, d]."
        ) from None


#: the width of a variant's learned layer that neither ``--params`` nor ``--units`` gives
DEFAULT_UNITS = 32


def units_field(what: str, when: str = "") -> Any:
    """The ``--units`` option of a variant with a learned layer (``read_units`` reads it): ``what``
    says which width it is, ``when`` when the option applies, if not always."""
    default = f"{when}; default" if when else "default"
    return field(default=None, metadata={"help": f"{what} ({default}: from --params, else {DEFAULT_UNITS})",
                                         "min": 1, "max": MAX_WIDTH})


def read_units(given: Mapping[str, np.ndarray] | None, key: str, requested: int | None,
               default: int = DEFAULT_UNITS, also: Mapping[str, int] | None = None, option: str = "--units",
               name: str = "units") -> int:
    """The width of a learned layer: read off the last axis of ``given[key]`` when a parameter file
    has that kernel (``--units`` must then agree), else ``--units``, else ``default``. ``also`` names
    further arrays of the file and the axis that holds the same width (``{"v": 0}``): when they
    disagree with the kernel, the error names both arrays and their shapes. Errors about the file
    start with ``parameters:``, which the command line replaces by the file's name. ``option`` and
    ``name`` say which option gives the width and what it is called (``--key-dim``, ``d_k``)."""
    from attnviz.errors import ParamsError, UsageError

    if requested is not None and requested < 1:
        raise UsageError(f"{option} {requested}: must be at least 1.")
    if given is None or key not in given or given[key].ndim != 2:
        return requested or default
    kernel = given[key]
    found = int(kernel.shape[1])
    for other, axis in (also or {}).items():
        arr = given.get(other)
        if arr is not None and -arr.ndim <= axis < arr.ndim and int(arr.shape[axis]) != found:
            raise ParamsError(f"parameters: {key} {shape_str(kernel.shape)} and {other} {shape_str(arr.shape)} "
                              f"disagree on the width ({name}): {found} and {int(arr.shape[axis])}.")
    if requested is not None and requested != found:
        raise ParamsError(f"parameters: {key} {shape_str(kernel.shape)} has {name} = {found}, but {option} "
                          f"{requested} was given.")
    return found


def check_qkv(inputs: Mapping[str, Loaded], same_dim: bool = True) -> tuple[int, ...]:
    """Q ``[..., Lq, d_k]``, K ``[..., Lk, d_k]``, V ``[..., Lk, d_v]``; returns ``[..., Lq, Lk]``.
    With ``same_dim=False`` Q and K may have different last dimensions (a learned map joins them)."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    require_rank(q, "Q", 2, "[..., Lq, d_q]")
    require_rank(k, "K", 2, "[..., Lk, d_k]")
    require_rank(v, "V", 2, "[..., Lk, d_v]")
    if same_dim and q.data.shape[-1] != k.data.shape[-1]:
        raise ShapeError(
            f"d_k differs: Q ({q.source}) has shape {shape_str(q.data.shape)} and K ({k.source}) "
            f"{shape_str(k.data.shape)}; their last dimensions must be equal."
        )
    if k.data.shape[-2] != v.data.shape[-2]:
        raise ShapeError(
            f"Lk differs: K ({k.source}) has shape {shape_str(k.data.shape)} and V ({v.source}) "
            f"{shape_str(v.data.shape)}; they need the same number of rows (keys)."
        )
    lead = broadcast_leading(inputs, ("q", "k", "v"))
    return (*lead, q.data.shape[-2], k.data.shape[-2])


# ----------------------------------------------------------------------------------------------
# TensorFlow kernels


def masked_softmax(ctx: Context, scores: Any, mask: Mask, finite: bool = False) -> Any:
    """Softmax over the last axis with a keep mask and an optional bias (reference section 0.3).

    ``where(keep, s, -inf)``, subtract the finite-guarded row max, exp, divide with 0/0 -> 0: a fully
    masked row is all zeros, never NaN and never uniform. float16/bfloat16 scores are upcast to
    float32 first. Scores that are not finite where a key is kept overflowed: ``NumericError``.

    A model's ``ctx.logits`` (``attnviz.scoring``): a softcap ``C tanh(s / C)`` before the bias and the
    mask; per-head sink logits ``[H]`` (heads at axis -3) as one more column of the softmax, dropped
    after it.
    """
    import numpy as np

    tf = ctx.tf
    s = tf.cast(scores, softmax_dtype(ctx.dtype))
    logits = ctx.logits
    if logits is not None and logits.softcap is not None:
        cap = tf.constant(logits.softcap, dtype=s.dtype)
        s = tf.tanh(s / cap) * cap
    if mask.bias is not None:
        s = s + tf.cast(tf.convert_to_tensor(mask.bias), s.dtype)
    keep = None if mask.keep is None else tf.convert_to_tensor(mask.keep)
    if not finite:  # ``finite``: the caller has shown the scores cannot overflow
        check_finite_scores(ctx, s, keep)
    sinks = None if logits is None else logits.sinks
    if keep is None and mask.bias is None and sinks is None:
        return tf.nn.softmax(s, axis=-1)  # nothing masked: the fused kernel (it subtracts the row max too)
    if keep is not None:
        s = tf.where(keep, s, tf.constant(-np.inf, dtype=s.dtype))
    m = tf.reduce_max(s, axis=-1, keepdims=True)
    sink = None
    if sinks is not None:
        sink = tf.broadcast_to(tf.constant(np.asarray(sinks).reshape(-1, 1, 1), dtype=s.dtype), tf.shape(m))
        m = tf.maximum(m, sink)
    m = tf.where(tf.math.is_finite(m), m, tf.zeros_like(m))
    e = tf.exp(s - m)
    if keep is not None:
        e = tf.where(keep, e, tf.zeros_like(e))
    total = tf.reduce_sum(e, axis=-1, keepdims=True)
    if sink is not None:
        total = total + tf.exp(sink - m)
    return tf.math.divide_no_nan(e, total)


def attend(ctx: Context, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Mask,
           scale: float) -> tuple[np.ndarray, np.ndarray]:
    """``A = softmax(scale * Q K^T (+ bias), masked)``, ``O = A V``; returns (A, O) as NumPy.

    Q is multiplied by ``scale`` before the matmul (as Keras MultiHeadAttention does), which keeps
    float16 scores in range. The output is computed in the run's dtype from the weights cast to it.
    """

    tf = ctx.tf
    with tf.device(ctx.device.tf_name):
        qt, kt, vt = ctx.tensor(q), ctx.tensor(k), ctx.tensor(v)
        if scale != 1.0:
            qt = qt * ctx.scalar(scale, qt.dtype)
        scores = tf.matmul(qt, kt, transpose_b=True)
        return softmax_and_output(ctx, scores, vt, mask, finite=scores_bounded(ctx, q, k, scale, mask))


def scores_bounded(ctx: Context, q: np.ndarray, k: np.ndarray, scale: float, mask: Mask) -> bool:
    """Whether ``scale * Q K^T (+ bias)`` is sure to be finite in the run's dtype: every score is at
    most ``|scale| max|q| max|k| d`` (and the largest bias) in size, the partial sums of the matmul
    too, so when that is well inside the dtype's range the scores need no finiteness pass."""
    import numpy as np

    from attnviz.device import DTYPE_MAX

    if q.size == 0 or k.size == 0 or q.dtype.kind not in "biuf" or k.dtype.kind not in "biuf":
        return False
    limit = DTYPE_MAX[ctx.dtype] / 4
    with np.errstate(all="ignore"):
        q_max, k_max = abs(scale) * ctx.largest(q), ctx.largest(k)
        bound = q_max * k_max * q.shape[-1]
        if mask.bias is not None and np.size(mask.bias):
            bound += float(np.max(np.abs(mask.bias)))
    return all(math.isfinite(x) and x < limit for x in (q_max, k_max, bound))


def softmax_and_output(ctx: Context, scores: Any, v: Any, mask: Mask,
                       finite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """From scores ``[..., Lq, Lk]`` and values ``[..., Lk, d_v]`` (tensors, on the run's device):
    the masked softmax weights and ``O = A V``, as NumPy, checked to be finite. The weights are
    broadcast to the leading dimensions of the output. ``finite``: the caller has shown that the
    scores cannot overflow (``scores_bounded``), so they are not checked again."""
    tf = ctx.tf
    weights = masked_softmax(ctx, scores, mask, finite)
    output = tf.matmul(tf.cast(weights, v.dtype), v)
    lead = tuple(output.shape[:-2])
    if tuple(weights.shape[:-2]) != lead:
        weights = tf.broadcast_to(weights, (*lead, *weights.shape[-2:]))
    w, o = ctx.host(weights), ctx.numpy(output)  # the weights, the large one, without a copy on the CPU
    check_finite_result(w, ctx.dtype, o)
    return w, o


def overflow_advice(dtype: str) -> str:
    """What to do when values overflow ``dtype``."""
    if dtype in ("float16", "bfloat16"):
        return "use --dtype float32 (or float64) or rescale the inputs"
    if dtype == "float32":
        return "use --dtype float64 or rescale the inputs"
    return "rescale the inputs"


def check_finite_scores(ctx: Context, scores: Any, keep: Any = None) -> None:
    """Scores from finite inputs that are not finite where a key may be attended overflowed the
    dtype: an error, never NaN weights, and never a row silently all zero (every score -inf)."""
    tf = ctx.tf
    bad = tf.logical_not(tf.math.is_finite(scores))
    if keep is not None:
        bad = tf.logical_and(bad, keep)
    if bool(tf.reduce_any(bad)):
        raise NumericError(f"the scores overflowed {ctx.dtype}; {overflow_advice(ctx.dtype)}.", "the scores")


def check_finite_result(weights: np.ndarray, dtype: str, output: np.ndarray | None = None) -> None:
    """Never show NaN: scores that overflowed the dtype are an error with a way out. A NaN weight
    makes its row of ``O = A V`` NaN too (NaN times anything is NaN), so the much smaller output is
    checked when there is one; otherwise each row's sum, which any NaN or infinity spoils."""
    import numpy as np

    probe = output if output is not None else weights.sum(axis=-1)
    if not np.isfinite(probe).all():
        stage = "the output" if output is not None and np.isfinite(weights.sum(axis=-1)).all() else "the weights"
        raise NumericError(f"{stage} overflowed {dtype}; {overflow_advice(dtype)}.", stage)



# ----------------------------------------------------------------------------------------------
# The score functions the scope variants (local, hard, sparse, structured) build on

SCORES = ("scaled", "dot", "general")


def score_specs(score: str, d_q: int, d_k: int) -> dict[str, ParamSpec]:
    """Parameters of a base score: ``W_a [d_q, d_k]`` for Luong's general score, none otherwise."""
    from attnviz.params import ParamSpec

    return {"W_a": ParamSpec((d_q, d_k))} if score == "general" else {}


def base_scores(ctx: Context, q: Any, k: Any, score: str, learned: Mapping[str, np.ndarray],
                scale: float | None = None) -> Any:
    """Scores ``[..., Lq, Lk]`` from tensors Q and K: ``scaled`` Q K^T / sqrt(d_k), ``dot`` Q K^T,
    ``general`` Q W_a K^T, each times ``scale`` instead when one is given (``--scale``); finite, or a
    ``NumericError`` (they overflowed the dtype)."""
    tf = ctx.tf
    if score == "general":
        q = tf.tensordot(q, ctx.tensor(learned["W_a"]), axes=1)
    factor = scale if scale is not None else 1.0 / math.sqrt(int(q.shape[-1])) if score == "scaled" else 1.0
    if factor != 1.0:
        q = q * ctx.scalar(factor, q.dtype)
    scores = tf.matmul(q, k, transpose_b=True)
    check_finite_scores(ctx, scores)  # some users (sparsemax, the CRF) take them to NumPy, not to masked_softmax
    return scores


def scale_field(default: str) -> Any:
    """The ``--scale`` option of a variant that scores with a dot product (``default`` says what it is
    without it); a model's config (``--hf-config``) sets it too."""
    return field(default=None, metadata={"help": f"multiply the scores by this instead of {default}; a "
                                                 "temperature t is --scale 1/t", "above": 0})


def check_scale(scale: float | None) -> None:
    from attnviz.errors import UsageError

    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise UsageError(f"--scale {scale}: must be a positive finite number.")


def score_field_help() -> str:
    return "base score: scaled (Q K^T / sqrt(d)), dot (Q K^T) or general (Q W_a K^T, parameter W_a)"
