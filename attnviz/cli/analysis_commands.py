"""``attnviz rollout`` (attention rollout across layers) and ``attnviz repeat-test`` (the repeated
random sequence that probes for induction heads). NumPy only, no TensorFlow: weights a model saved,
read as ``inspect`` reads them (``attnviz.analysis`` holds the mathematics)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import typer

from attnviz.choices import HEAD_COMBINE
from attnviz.cli.inspect_commands import (
    BatchOpt,
    Cmap,
    JsonFile,
    JsonOpt,
    KeyPaddingOpt,
    Layout,
    MaskConvention,
    MaskKind,
    MaskOpt,
    MaxCols,
    MaxRows,
    NoTable,
    Precision,
    Quiet,
    Reduce,
    Title,
)
from attnviz.cli.options import (
    LABELS,
    OUTPUT,
    NormOpt,
    VmaxOpt,
    VminOpt,
    check_html_path,
    check_png_path,
    check_scale,
    checked_option,
    figure_scale,
    parser_for,
    staged_outputs,
)
from attnviz.cli.streams import out_console, stdout

ROLLOUT = "Rollout"


def rollout_command(
    weights: Annotated[str, typer.Argument(metavar="WEIGHTS", show_default=False,
                                           help="attention weights of every layer, as inspect reads them: "
                                                "[layers, batch, heads, L, L] (.npy, .npz of one array per "
                                                "layer, FILE:KEY with a glob over layers, ...)")],
    layout: Layout = None,
    labels: Annotated[str | None, typer.Option("--labels", metavar="TOKENS", rich_help_panel=LABELS,
                                               help="the tokens (both axes): a text file (one a line), JSON list "
                                                    "or a,b,c")] = None,
    batch: BatchOpt = None,
    heads: Annotated[Literal[HEAD_COMBINE], checked_option(  # type: ignore[valid-type]
        Literal[HEAD_COMBINE], "--heads", rich_help_panel=ROLLOUT,  # type: ignore[valid-type]
        help="how each layer's heads are combined (the paper: mean)")] = "mean",
    residual: Annotated[float, checked_option(float, "--residual", min=0, max=1, rich_help_panel=ROLLOUT,
                                              help="r in A' = (1 - r) A + r I, the residual connection's share "
                                                   "(the paper: 0.5; 0: attention alone)")] = 0.5,
    start_layer: Annotated[int, checked_option(int, "--start-layer", min=0, rich_help_panel=ROLLOUT,
                                               help="begin the product at this layer")] = 0,
    all_layers: Annotated[bool, typer.Option("--all-layers", rich_help_panel=ROLLOUT,
                                             help="also give the cumulative map after each layer (JSON "
                                                  "rollout.cumulative; the PNG shows them all)")] = False,
    mask: MaskOpt = None,
    key_padding_mask: KeyPaddingOpt = None,
    mask_convention: MaskConvention = "keep",
    mask_kind: MaskKind = "bool",
    png: Annotated[str | None, typer.Option("--png", metavar="FILE", rich_help_panel=OUTPUT,
                                            help="a heatmap of the rollout (.png, .svg or .pdf)")] = None,
    html: Annotated[str | None, typer.Option("--html", metavar="FILE.html", rich_help_panel=OUTPUT,
                                             help="an offline HTML page of the rollout of every batch entry (and "
                                                  "each layer's with --all-layers): hover a cell to read it")] = None,
    title: Title = None,
    cmap: Cmap = None,
    reduce: Reduce = "mean",
    vmin: VminOpt = None,
    vmax: VmaxOpt = None,
    norm: NormOpt = "linear",
    precision: Precision = 3,
    max_rows: MaxRows = 40,
    max_cols: MaxCols = None,
    json_out: JsonOpt = False,
    json_file: JsonFile = None,
    no_table: NoTable = False,
    quiet: Quiet = False,
) -> None:
    """Attention rollout across layers (Abnar & Zuidema 2020).

    Per layer the heads are combined (--heads), the residual connection is added as
    A' = (1 - r) A + r I (--residual r), rows are renormalised, and the layers are multiplied from
    the first (or --start-layer) up: R = A'_last ... A'_first. Row i of R estimates how much of
    position i's representation after the last layer comes from each input token, if attention alone
    mixed tokens. It is a model of information flow from the attention weights only (no value
    vectors, MLPs or layer norms), not a gradient attribution. Padded tokens (--mask,
    --key-padding-mask) are left out and the rows renormalised among the real ones.
    """
    from attnviz.cli.inspect_commands import _run_checked

    _run_checked(run_rollout, locals())


def run_rollout(o: dict[str, Any]) -> bool:
    import numpy as np

    from attnviz import analysis
    from attnviz import inspect as insp
    from attnviz.cli.app import _stderr
    from attnviz.cli.inspect_commands import Selection, _labels, _save_json, read_masks
    from attnviz.errors import InputError, shape_str
    from attnviz.io import check_outputs
    from attnviz.render.scale import check_cmap

    check_png_path(o["png"])
    check_html_path(o["html"])
    check_cmap(o["cmap"])
    check_scale(o["vmin"], o["vmax"], o["norm"])
    err = _stderr()
    w = insp.load_weights(o["weights"], o["layout"])
    layers, batches, _, lq, lk = w.shape
    if lq != lk:
        raise InputError(f"{w.source}: rollout multiplies self-attention maps [L, L] across layers; these are "
                         f"[{lq}, {lk}] (read as [layers, batch, heads, Lq, Lk] = {shape_str(w.shape)}).")
    if o["start_layer"] >= layers:
        from attnviz.errors import UsageError

        raise UsageError(f"--start-layer {o['start_layer']}: the weights have {layers} layer(s) "
                         f"(0..{layers - 1}).")
    paths = list(w.paths)
    tokens, _ = _labels(None, None, o["labels"], lq, lk, paths)
    _, bi, _ = Selection(0, o["batch"], 0).index(w.shape)
    o.update(check_mask=None)
    masks, _ = read_masks(o, w, paths, check=False)
    if not insp.all_finite(w.data, rows=masks.real_rows):
        bad = insp.check_finite(w.data, rows=masks.real_rows).failures
        raise InputError(f"{w.source}: {bad} non-finite value(s); attnviz inspect --check-finite locates them.")
    entries = [bi] if o["batch"] is not None else list(range(batches))
    real_tokens = None if masks.real_keys is None else np.broadcast_to(masks.real_keys, w.shape[:-2] + (lk,))
    results = {}
    for b in entries:
        real = None if real_tokens is None else real_tokens[0, b, 0]
        results[b] = analysis.rollout(w.data[:, b], heads=o["heads"], residual=o["residual"],
                                      start_layer=o["start_layer"], real=real, all_layers=o["all_layers"])
    shown = results[bi]
    padded = None if real_tokens is None else ~real_tokens[0, bi, 0]
    targets = check_outputs({"--png": o["png"], "--json-file": o["json_file"], "--html": o["html"]}, paths)
    span = f"layers {shown.layers[0]}-{shown.layers[-1]}" if len(shown.layers) > 1 else f"layer {shown.layers[0]}"
    how = f"heads {o['heads']}, residual {o['residual']:g}, {span}"
    with staged_outputs(targets) as staged:
        files: dict[str, str] = {}
        if "--png" in staged:
            from attnviz.render.heatmap import heatmap_figure, save_figure
            from attnviz.render.mosaic import slices_mosaic

            name = o["title"] or f"attention rollout of {w.source}"
            scale = figure_scale(o["vmin"], o["vmax"], o["norm"], False)
            if o["all_layers"]:
                maps = np.stack([_cumulative(results[b]) for b in entries])  # [B, n, L, L]
                fig = slices_mosaic(maps, title=f"{name} ({how}), cumulative after each layer",
                                    names=["batch", "after layer"], cmap=o["cmap"], reduce=o["reduce"], scale=scale)
            else:
                fig = heatmap_figure(shown.result, title=f"{name}, batch {bi} ({how})", q_labels=tokens,
                                     k_labels=tokens, cmap=o["cmap"], reduce=o["reduce"], ylabel="token (output)",
                                     xlabel="input token", colorbar_label="rollout", scale=scale)
            save_figure(fig, staged["--png"])
            files["png"] = o["png"]
        if "--html" in staged:
            from attnviz.io import save_text

            save_text(staged["--html"], _rollout_html(results, entries, tokens, o, how, f"{w.source} "
                                                      f"{shape_str(w.file_shape)} read as [layers, batch, heads, L, L] "
                                                      f"= {shape_str(w.shape)}"))
            files["html"] = o["html"]
        document = None
        if o["json_out"] or o["json_file"]:
            from attnviz import __version__
            from attnviz.render.report import plain, to_json

            if o["json_file"]:
                files["json"] = o["json_file"]
            rollout_doc: dict[str, Any] = {
                "heads": o["heads"], "residual": o["residual"], "start_layer": o["start_layer"],
                "layers": shown.layers, "batch": entries,
                "shape": [len(entries), lq, lk], "data": np.stack([results[b].result for b in entries]),
            }
            if o["all_layers"]:
                rollout_doc["cumulative"] = {
                    "shape": [len(entries), len(shown.layers), lq, lk],
                    "data": np.stack([_cumulative(results[b]) for b in entries])}
            document = to_json(plain({
                "attnviz": __version__, "command": "rollout", "source": w.source,
                "file_shape": list(w.file_shape), "weights_shape": list(w.shape), "labels": tokens,
                "mask": masks.described, "rollout": rollout_doc, "files": files}))
            _save_json(document, staged)
        staged.commit()
    if not o["quiet"]:
        err.print(f"rollout: {w.source} {shape_str(w.file_shape)} read as [layers, batch, heads, L, L] = "
                  f"{shape_str(w.shape)}; {how}", markup=False, style="dim")
        if masks.described:
            err.print(f"masks: {', '.join(masks.described)}; padded tokens left out", markup=False, style="dim")
        for what, path in files.items():
            err.print(f"saved {what} to {path}", markup=False, style="dim")
    if o["json_out"] and document is not None:
        stdout().write(document + "\n")
    elif not (o["json_out"] or o["no_table"] or o["quiet"]):
        from attnviz.render.table import weights_table

        console = out_console()
        keep = None if padded is None else ~(padded[:, None] | padded[None, :])
        data = np.nan_to_num(shown.result)
        console.print(weights_table(data, q_labels=tokens, k_labels=tokens, keep=keep, precision=o["precision"],
                                    max_rows=o["max_rows"] or None, max_cols=o["max_cols"], padded=padded,
                                    axis_names=("output", "input"),
                                    title=f"attention rollout, batch {bi} [{lq}, {lk}] ({how})"), crop=False)
    return False


def _rollout_html(results: dict[int, Any], entries: list[int], tokens: list[str] | None, o: dict[str, Any], how: str,
                  subtitle: str) -> str:
    """The HTML report of a rollout: one row per batch entry; one column (the result), or one per layer
    (the cumulative maps) with --all-layers."""
    import numpy as np

    from attnviz.render.html import grid_report

    first = results[entries[0]]
    columns = first.layers if o["all_layers"] else [first.layers[-1]]

    def get(r: int, c: int) -> tuple[np.ndarray, np.ndarray | None]:
        one = results[entries[r]]
        data = _cumulative(one)[c] if o["all_layers"] else one.result
        real = ~np.isnan(data)
        return np.nan_to_num(data), None if real.all() else real

    name = o["title"] or "attention rollout"
    return grid_report(get, len(entries), len(columns), first.result.shape, title=f"{name} ({how})", subtitle=subtitle,
                       row_labels=[str(b) for b in entries], col_labels=[str(li) for li in columns], row_name="batch",
                       col_name="after layer", q_labels=tokens, k_labels=tokens, q_name="output",
                       k_name="input", cmap=o["cmap"], reduce=o["reduce"], colorbar_label="rollout", vmin=o["vmin"],
                       vmax=o["vmax"], norm=o["norm"])


def _cumulative(result: Any) -> Any:
    assert result.cumulative is not None  # asked for with --all-layers
    return result.cumulative


def repeat_test_command(
    length: Annotated[int, typer.Argument(metavar="N", show_default=False, parser=parser_for(int, min=1),
                                          help="tokens in the random sequence (repeated once: 2N in all)")],
    vocab_size: Annotated[int, checked_option(int, "--vocab-size", min=1, metavar="V",
                                              help="draw token ids from 0..V-1 (the model's vocabulary size)")],
    seed: Annotated[int | None, checked_option(int | None, "--seed", min=0,
                                               help="random seed (repeatable probes)")] = None,
    ids: Annotated[str | None, typer.Option("--save-ids", metavar="FILE.npy",
                                            help="save the ids [1, 2N] (int64), ready as a model's input_ids")] = None,
    labels: Annotated[str | None, typer.Option("--save-labels", metavar="FILE.txt",
                                               help="save one label a line (the id), for inspect --labels")] = None,
    json_out: Annotated[bool, typer.Option("--json",
                                           help="print a JSON object (ids, n, vocab_size, seed)")] = False,
) -> None:
    """Write the standard induction-head probe: N distinct random token ids, then the same N again.

    Run the model on it with output_attentions, save the attentions, then
    `attnviz inspect attn.npz --labels probe.txt --sort induction`: in the second half, an induction
    head attends to the token after the earlier occurrence of the current token.
    """
    from attnviz.cli.app import user_errors

    with user_errors():
        _repeat_test(length, vocab_size, seed, ids, labels, json_out)


def _repeat_test(length: int, vocab: int, seed: int | None, ids: str | None, labels: str | None,
                 json_out: bool) -> None:
    import json

    from attnviz import analysis
    from attnviz.errors import UsageError
    from attnviz.io import check_outputs, save_npy, save_text

    if length < 1:
        raise UsageError(f"N {length}: the sequence needs at least 1 token.")
    if length > vocab:
        raise UsageError(f"N {length}: more distinct tokens than --vocab-size {vocab}.")
    if ids is not None and not ids.lower().endswith(".npy"):
        raise UsageError(f"--save-ids {ids}: the file must end in .npy.")
    sequence = analysis.repeated_sequence(length, vocab, seed)
    targets = check_outputs({"--save-ids": ids, "--save-labels": labels}, [])
    with staged_outputs(targets) as staged:
        if "--save-ids" in staged:
            save_npy(staged["--save-ids"], sequence[None, :])
        if "--save-labels" in staged:
            save_text(staged["--save-labels"], "".join(f"{i}\n" for i in sequence))
        staged.commit()
    values = [int(i) for i in sequence]
    stdout().write((json.dumps({"ids": values, "n": length, "vocab_size": vocab, "seed": seed}) if json_out
                    else " ".join(str(i) for i in values)) + "\n")


# ---------------------------------------------------------------------------------------------------
# What inspect adds from attnviz.analysis: token-aware head scores and received attention

TOKEN_NOTE = "induction and duplicate-token scores need the tokens: --labels (self-attention, Lq = Lk)"
TOP_RECEIVERS = 8  # tokens listed in the received-attention table and JSON


def add_token_scores(stats: dict[str, Any], data: Any, tokens: list[str] | None, real_rows: Any,
                     tags: bool) -> str | None:
    """Put the ``induction`` and ``duplicate`` scores of ``data [L, B, H, L, L]`` into the head
    statistics and their tags into ``stats["tag"]`` (with ``tags``: the rows are distributions);
    returns a note when they cannot be computed (no tokens)."""
    from attnviz import analysis

    if tokens is None:
        return TOKEN_NOTE
    scores = analysis.token_scores(data, tokens, real_rows)
    stats["induction"], stats["duplicate"] = scores["induction"], scores["duplicate"]
    if not tags:
        return None
    for idx, extra in zip(*_nonempty(analysis.token_tags(scores))):
        have = str(stats["tag"][idx])
        stats["tag"][idx] = extra if have in ("", "broad") else f"{have}, {extra}"
    if not int(scores["repeated"].max(initial=0)):
        return "no token occurs twice in --labels: induction and duplicate-token scores are undefined"
    return None


def _nonempty(tags: Any) -> tuple[list[tuple[int, ...]], list[str]]:
    import numpy as np

    where = [idx for idx in np.ndindex(*tags.shape) if tags[idx]]
    return where, [str(tags[idx]) for idx in where]


def received_summary(data: Any, keep: Any, real_rows: Any, tokens: list[str] | None, causal: bool,
                     layer_ids: list[int]) -> dict[str, Any]:
    """The attention each key token receives (``attnviz.analysis.received``) of ``data [L, B, H, Lq, Lk]``,
    averaged over batch entries: ``per_head [L, H, Lk]``, ``per_layer [L, Lk]`` (mean over heads),
    ``mean [Lk]`` (over layers and heads), and the ``top`` receivers by ``mean``."""
    import warnings

    import numpy as np

    from attnviz import analysis

    values = analysis.received(data, keep, real_rows, causal)
    with warnings.catch_warnings():  # a token no query may see is NaN everywhere: the mean stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        per_head = np.nanmean(values, axis=1)
        per_layer = np.nanmean(per_head, axis=1)
        mean = np.nanmean(per_layer, axis=0)
    order = [int(j) for j in np.argsort(-np.nan_to_num(mean, nan=-np.inf), kind="stable")[:TOP_RECEIVERS]
             if not np.isnan(mean[j])]
    top = []
    for j in order:
        column = np.nan_to_num(per_head[:, :, j], nan=-np.inf)
        li, hi = np.unravel_index(int(np.argmax(column)), column.shape)
        top.append({"position": j, "token": tokens[j] if tokens is not None else None, "mean": float(mean[j]),
                    "max": float(per_head[li, hi, j]), "layer": int(li), "head": int(hi)})
    return {"causal": causal, "layers": layer_ids, "mean": mean, "per_layer": per_layer, "per_head": per_head,
            "top": top}


def received_table(summary: dict[str, Any], precision: int) -> Any:
    """The top receivers as a small table (fits any terminal: four short columns)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from attnviz.render.text import label as visible_label

    seen = "the queries that may attend to it" + (" (j <= i: causal weights)" if summary["causal"] else "")
    table = Table(title="tokens that receive the most attention", box=box.SIMPLE_HEAD, padding=(0, 1),
                  caption=f"received: mean weight from {seen}, averaged over heads and layers; "
                          "max: the largest over heads, at layer:head", caption_justify="left", min_width=72)
    table.add_column("key", no_wrap=True, overflow="ellipsis", max_width=24)
    table.add_column("received", justify="right", no_wrap=True)
    table.add_column("max", justify="right", no_wrap=True)
    table.add_column("at", justify="right", no_wrap=True)
    for entry in summary["top"]:
        token = entry["token"]
        label = str(entry["position"]) if token is None else f"{entry['position']} {visible_label(token, 16)}"
        table.add_row(Text(label), f"{entry['mean']:.{precision}f}", f"{entry['max']:.{precision}f}",
                      f"{summary['layers'][entry['layer']]}:{entry['head']}")
    return table


def received_figure(summary: dict[str, Any], tokens: list[str] | None, *, title: str, cmap: str | None,
                    reduce: str, scale: Any) -> Any:
    """A strip heatmap: one row per layer, one column per key token, the attention it receives
    (mean over heads)."""
    from attnviz.render.heatmap import heatmap_figure

    return heatmap_figure(summary["per_layer"], title=title, q_labels=[str(li) for li in summary["layers"]],
                          k_labels=tokens, cmap=cmap or "magma", reduce=reduce, ylabel="layer", xlabel="key token",
                          colorbar_label="received (mean over heads)", scale=scale)
