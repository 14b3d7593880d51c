"""The masks of saved weights (inspect's ``--mask``, ``--key-padding-mask``, ``--check-mask``;
compare's and rollout's masks), read onto ``attnviz.masks.Mask`` in the standard layout: what may
be attended, and which keys and query rows are padding."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnviz.errors import InputError, ShapeError, UsageError, shape_str
from attnviz.inspection.options import MaskOptions
from attnviz.inspection.weights import Weights, standard_mask
from attnviz.masks import Mask, boolean_keep

# Masks and padding (inspect's --mask, --key-padding-mask, --check-mask; compare's masks)

#: with ``--mask-kind additive``, a bias at or below this masks its key: -inf, the -10000 of older
#: Hugging Face models and the dtype minimum of newer ones (exp underflows to exactly 0 long before)
ADDITIVE_MASKED = -1e4


def additive_keep(loaded: Any) -> np.ndarray:
    """An additive mask (a float bias added to the scores) as a keep array: 0 and other biases keep,
    ``-inf`` and anything at or below ``ADDITIVE_MASKED`` masks."""
    bias = np.asarray(loaded.data, dtype=np.float64)
    if np.isnan(bias).any() or np.isposinf(bias).any():
        raise InputError(f"{loaded.source}: an additive mask may hold finite values and -inf only.")
    return bias > ADDITIVE_MASKED


def read_mask(w: Weights, loaded: Any, *, convention: str = "keep", kind: str = "bool", key_padding: bool = False,
              option: str = "--mask") -> Mask:
    """A mask file for the weights ``w``, in the standard layout. Its shapes:

    * ``[S]`` or ``[B, S]`` with ``key_padding`` (``--key-padding-mask``), or a 2-D ``[B, S]`` mask when
      the weights have ``B > 1`` batch entries and ``Lq != B``: a Hugging Face ``attention_mask``;
    * 4-D: Hugging Face's ``[batch, heads or 1, Lq or 1, Lk]``, whatever the file's layout;
    * anything else broadcasts against the file's maps as the file holds them (``standard_mask``).

    Call ``finish`` on the result (after combining it with other masks) for the padding it marks.
    """
    keep = additive_keep(loaded) if kind == "additive" else boolean_keep(loaded, convention)
    layers, batches, heads, lq, lk = w.shape
    source = loaded.source
    attention_mask = keep.ndim == 2 and keep.shape == (batches, lk) and batches > 1
    if attention_mask and lq == batches and not key_padding:
        raise UsageError(f"{option} {source}: a [{batches}, {lk}] mask may be a Hugging Face attention_mask "
                         f"[batch, S] or a [Lq, Lk] mask here (batch = Lq = {lq}); give an attention_mask "
                         f"with --key-padding-mask, or a [Lq, Lk] mask as [1, {lq}, {lk}].")
    if key_padding or attention_mask:
        if keep.ndim not in (1, 2) or keep.shape[-1] != lk or (keep.ndim == 2 and keep.shape[0] not in (1, batches)):
            raise ShapeError(f"{option} {source}: a padding mask is [batch, Lk] = [{batches}, {lk}] or [{lk}] here; "
                             f"received {shape_str(keep.shape)} for weights {shape_str(w.shape)} "
                             "[layers, batch, heads, Lq, Lk].")
        std = keep.reshape(1, keep.shape[0] if keep.ndim == 2 else 1, 1, 1, lk)
        what = f"key padding {source}"
    elif keep.ndim == 4:
        try:
            fits = np.broadcast_shapes(keep.shape, (batches, heads, lq, lk)) == (batches, heads, lq, lk)
        except ValueError:
            fits = False
        if not fits:
            raise ShapeError(f"{option} {source}: a 4-D mask is read as [batch, heads or 1, Lq or 1, Lk] (Hugging "
                             f"Face); received {shape_str(keep.shape)}, expected one that broadcasts to "
                             f"{shape_str((batches, heads, lq, lk))}.")
        std = keep[None]
        what = f"mask {source}"
    else:
        std = standard_mask(w, keep, source)
        what = f"mask {source}"
    if kind == "additive":
        what += f" (additive: <= {ADDITIVE_MASKED:g} masks)"
    else:
        what += f" ({convention}: 1 = {'may attend' if convention == 'keep' else 'masked'})"
    if std.shape[-2] > 1 and np.array_equal(std, np.broadcast_to(std[..., :1, :], std.shape)):
        std = std[..., :1, :]  # the same for every query row (an expanded attention_mask): keep one
    return Mask(keep=std, described=[what])


def read_masks(options: MaskOptions, w: Weights, paths: list[Any], stdin: Any = None,
               check: bool = True) -> tuple[Mask, Mask | None]:
    """The masks of a run (``--mask``, ``--key-padding-mask``, ``--check-mask`` when ``check``),
    combined, with their padding worked out; and the ``--check-mask`` alone, for its check. The files
    read are appended to ``paths`` (outputs may not overwrite them)."""
    from attnviz.io import load_array

    combined = Mask()
    checked = None
    if w.capture is not None and options.mask is None and options.key_padding_mask is None:
        from attnviz.inspection.weights import capture_mask

        keep = capture_mask(w)
        if keep is not None:  # the masks the model applied, site by site
            combined = Mask(keep=keep, described=[f"the capture's masks ({w.source})"])
    wanted = [("--mask", options.mask, options.mask_kind, False),
              ("--key-padding-mask", options.key_padding_mask, "bool", True)]
    if check:
        wanted.append(("--check-mask", options.check_mask, "bool", False))
    for option, spec, kind, key_padding in wanted:
        if spec is None:
            continue
        loaded = load_array(spec, stdin, allow_neg_inf=kind == "additive")
        if loaded.path is not None:
            paths.append(loaded.path)
        if w.generation is not None:  # a prompt's attention_mask, extended over the generated tokens
            from dataclasses import replace

            from attnviz.inspection.generation import fit_mask

            loaded = replace(loaded, data=fit_mask(loaded.data, w.shape[-1], w.generation))
        one = read_mask(w, loaded, convention=options.mask_convention, kind=kind, key_padding=key_padding,
                        option=option)
        if option == "--check-mask":
            checked = one
        combined = combined & one
    return combined.with_padding(w.shape), checked


def grid_masks(masks: Mask | None, shape: tuple[int, ...],
               bi: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The keep mask and real query rows of batch entry ``bi`` of weights ``shape [L, B, H, Lq, Lk]``,
    for a layer x head grid (views that broadcast, never a copy the size of the weights)."""
    keep = real = None
    if masks is not None and masks.keep is not None:
        keep = np.broadcast_to(masks.keep, shape)[:, bi]
    if masks is not None and masks.real_rows is not None:
        real = np.broadcast_to(masks.real_rows, shape[:-1])[:, bi]
    return keep, real


#: the share of the weight of the rows a mask keeps that may lie on the keys it hides before a run says so:
#: a model that applied the mask puts exactly 0 there (exp(-inf), or of the dtype's minimum, underflows)
HIDDEN_SHARE = 1e-3


def hidden_weight_warning(source: str, options: MaskOptions, held: float, hidden: float, rows: int,
                          captured: bool = False, command: str = "inspect") -> str | None:
    """One line when the masks drop weight the model put somewhere: ``hidden`` of the ``held`` weight of the
    ``rows`` rows they keep lies on keys they hide (an inverted mask: the weights of the real tokens are
    dropped, those of the padding shown); or they keep no row at all. None when they hide only zeros.
    ``command``: the run that says it (another than inspect points to inspect's --check-mask)."""
    if captured:
        cause = "the capture's masks do not fit its weights?"
    elif options.mask_kind == "additive":
        cause = "an additive mask of the wrong sign, or one made for other inputs?"
    elif options.mask_convention == "block":
        cause = ("the wrong convention? --mask-convention block reads 1 as masked, but a Hugging Face "
                 "attention_mask is keep (1 = real token)")
    else:
        cause = "an inverted mask (1 - attention_mask, or a 1 = masked mask without --mask-convention block)?"
    check = ("--check-mask" if command == "inspect" else "inspect's --check-mask") + \
        " with that mask lists where the weight lies"
    if rows == 0:
        return (f"{source}: the masks leave out every query row (each is padding or fully masked), so nothing is "
                f"counted; {cause} {check}.")
    if not np.isfinite(held) or held <= 0 or hidden < HIDDEN_SHARE * held:
        return None
    return (f"{source}: {hidden / held:.1%} of the attention weight of the query rows the masks keep lies on keys "
            f"they hide and is left out; {cause} {check}.")


def hidden_weight(data: np.ndarray, masks: Mask) -> tuple[float, float, int]:
    """The weight of the query rows ``masks`` keep (real rows that may attend somewhere) of ``data [L, B, H,
    Lq, Lk]``, the part of it on keys the masks hide, and the number of those rows; a layer at a time (the
    head pass of inspect sums the same as it goes: ``heads.HeadPass``)."""
    if masks.keep is None:
        return 0.0, 0.0, 0
    held = hidden = 0.0
    rows = 0
    for li in range(data.shape[0]):
        one = np.asarray(data[li], dtype=np.float64)
        keep = np.broadcast_to(masks.keep, data.shape)[li]
        live = keep.any(axis=-1)
        if masks.real_rows is not None:
            live = live & np.broadcast_to(masks.real_rows, data.shape[:-1])[li]
        with np.errstate(all="ignore"):
            held += float(np.where(live, one.sum(axis=-1), 0.0).sum())
            hidden += float(np.where(live[..., None] & ~keep, one, 0.0).sum())
        rows += int(live.sum())
    return held, hidden, rows


def mask_warnings(w: Weights, masks: Mask, options: MaskOptions, command: str) -> list[str]:
    """``hidden_weight_warning`` for weights held whole (compare, rollout): [] or one line."""
    if masks.keep is None:
        return []
    held, hidden, rows = hidden_weight(w.data, masks)
    text = hidden_weight_warning(w.source, options, held, hidden, rows,
                                 captured=w.capture is not None and options.mask is None
                                 and options.key_padding_mask is None, command=command)
    return [text] if text else []
