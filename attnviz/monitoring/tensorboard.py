"""A recording's head statistics as a TensorBoard event file (``tf.summary``), put into its log directory whole.

What one recording writes, at TensorBoard's step ``step`` (``TAGS`` names them; docs/training.md lists them):

- scalars ``attnviz/layer_L/head_H/STAT``: each head's statistics as the file's head table reports them (exact
  weights: entropy, entropy_norm (H over uniform's), distance, diagonal, previous, first (the first token's weight,
  the attention sink), last, max, and with the tokens induction and duplicate; a summary: its sink_mass, local_mass
  ... ; a corpus file: its means over texts), and ``attnviz/layer_L/head_H/tag/TAG``, 1 where the head earns the
  tag (the table's ``tag`` column), else 0;
- scalars ``attnviz/tags/TAG``: how many heads earn each tag;
- images ``attnviz/grid`` (the layer x head grid inspect's ``--png`` draws) and ``attnviz/layer_L`` (a layer's heads
  in a row, cut from the grid's pixels: one figure drawn, not one a layer) where the file has maps (a summary: its
  pooled grid; a corpus file: its layer strips, ``attnviz/strips``);
- text ``attnviz/heads``: the head table as ``inspect`` prints it;
- ``attnviz/capture`` (the attnviz plugin's own data, ``attnviz.monitoring.plugin``): where the capture file of
  exact weights lies, for the head view of TensorBoard's attnviz dashboard.

Each recording is one event file: written by ``tf.summary`` in a temporary folder, copied into the log directory
under a hidden name TensorBoard does not read (no ``tfevents`` in it) and renamed into place, so that TensorBoard
never reads half a file and a failure (an unwritable folder, a full disk) leaves nothing in the log directory. The
files' names sort by wall-clock second then step (TensorBoard reads a run's files in the order of their names).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.errors import OutputError
from attnviz.monitoring.records import HeadRecord

#: the tags a recording writes (``{layer}``, ``{head}``, ``{stat}``, ``{tag}`` filled in)
TAGS = {"statistic": "attnviz/layer_{layer}/head_{head}/{stat}",
        "head tag": "attnviz/layer_{layer}/head_{head}/tag/{tag}",
        "tag count": "attnviz/tags/{tag}",
        "grid": "attnviz/grid",
        "layer": "attnviz/layer_{layer}",
        "table": "attnviz/heads",
        "capture": "attnviz/capture"}
#: the name of the plugin whose data ``attnviz/capture`` is (``attnviz.monitoring.plugin``)
PLUGIN = "attnviz"
#: the event files' names: TensorBoard reads a run's files in this order
EVENT_FILE = "events.out.tfevents.{time:010d}.attnviz.{step:012d}.{pid}.v2"


def check_log_dir(log_dir: str | os.PathLike[str]) -> Path:
    """``log_dir`` as a path whose files can be written: an existing folder that is writable, or one that can be
    made (its nearest existing parent writable). One line (``OutputError``) otherwise."""
    path = Path(log_dir)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path}: a TensorBoard log directory must be a folder; this is a file.")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: cannot write TensorBoard's event files there ({existing} is not writable).")
    return path


def pixels(figure: Any) -> np.ndarray:
    """A matplotlib figure drawn, as RGB ``uint8 [height, width, 3]`` (the pixels its PNG would hold)."""
    from attnviz.render.heatmap import agg_canvas

    canvas = agg_canvas(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def layer_bands(figure: Any, rgb: np.ndarray) -> list[np.ndarray]:
    """Each row of panels of a mosaic figure (``render.mosaic``: a model's grid, a row a layer) cut from its pixels
    ``rgb``: the row's panels with its number on the left, as drawn in the grid (one picture drawn, not one a
    layer).
    None for a figure that is not a mosaic (one map)."""
    found = getattr(figure, "attnviz_mosaic", None)
    if found is None:
        return []
    ax, layout = found
    box = ax.get_window_extent()
    height = rgb.shape[0]
    top = int(round(height - box.y1))  # the picture's first row among the figure's (drawn a pixel a cell)
    right = min(rgb.shape[1], int(round(box.x1)) + 4)
    left = max(0, int(round(box.x0)) - 24)  # the row's number, not the axis's name beside it
    half = layout.gap // 2
    bands = []
    for r in range(layout.rows):
        y = top + layout.origin(r, 0)[0]
        bands.append(np.ascontiguousarray(rgb[max(0, y - half):min(height, y + layout.panel[0] + layout.caption + half),
                                              left:right]))
    return bands


def write_record(log_dir: str | os.PathLike[str], record: HeadRecord, step: int, *, pictures: bool = True,
                 notes: list[str] | None = None, capture: str | os.PathLike[str] | None = None) -> Path:
    """Write ``record`` at TensorBoard's ``step`` as one event file in ``log_dir`` (made if needed); return its path.
    ``pictures=False`` writes the scalars and the table alone; ``notes`` are lines written under the table;
    ``capture``: the file of exact weights the record is of, named for the attnviz dashboard's head view."""
    folder = check_log_dir(log_dir)
    images = []
    for name, draw in record.pictures if pictures else []:
        figure = draw()
        rgb = pixels(figure)
        images.append((name, rgb))
        if name == "grid" and record.layer_rows:
            images += [(f"layer_{record.layers[r]}", band) for r, band in enumerate(layer_bands(figure, rgb))]
    with tempfile.TemporaryDirectory(prefix="attnviz-tensorboard-") as staged:
        where = None if capture is None else str(Path(capture).resolve())
        _write_events(staged, record, step, images, notes or [], where)
        made = [name for name in os.listdir(staged) if "tfevents" in name]
        if len(made) != 1:  # pragma: no cover - tf.summary writes one file per writer
            raise OutputError(f"{folder}: TensorBoard's writer made {len(made)} event files.")
        name = EVENT_FILE.format(time=int(time.time()), step=max(0, int(step)), pid=os.getpid())
        return _move_in(Path(staged) / made[0], folder, name)


def _write_events(folder: str, record: HeadRecord, step: int, images: list[tuple[str, np.ndarray]],
                  notes: list[str], capture: str | None = None) -> None:
    """The summaries of ``record`` through ``tf.summary``, into a new event file in ``folder``."""
    from attnviz.device import quiet_tensorflow

    with quiet_tensorflow():
        import tensorflow as tf

    writer = tf.summary.create_file_writer(folder, max_queue=10**6, flush_millis=10**9)
    try:
        with writer.as_default(step=int(step)):
            for name, values in record.columns.items():
                values = np.asarray(values, dtype=np.float64)
                for (row, head), value in np.ndenumerate(values):
                    if value == value:  # NaN: a layer with fewer heads
                        tf.summary.scalar(TAGS["statistic"].format(layer=record.layers[row], head=head, stat=name),
                                          float(value))
            earned = {(idx, tag) for idx, text in np.ndenumerate(record.tags) for tag in _words(text)}
            real = _real_heads(record)
            for tag in record.rules:
                count = 0
                for row, head in real:
                    got = ((row, head), tag) in earned
                    count += got
                    tf.summary.scalar(TAGS["head tag"].format(layer=record.layers[row], head=head, tag=tag),
                                      float(got))
                tf.summary.scalar(TAGS["tag count"].format(tag=tag), float(count))
            for name, rgb in images:
                tag = TAGS["grid"] if name == "grid" else f"attnviz/{name}"
                tf.summary.image(tag, rgb[None], max_outputs=1)
            tf.summary.text(TAGS["table"], _table_markdown(record, notes))
            if capture is not None:
                from tensorboard.compat.proto.summary_pb2 import DATA_CLASS_TENSOR, SummaryMetadata

                metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN),
                                           data_class=DATA_CLASS_TENSOR)
                tf.summary.write(TAGS["capture"], tf.constant(capture), metadata=metadata)
    finally:
        writer.close()


def _real_heads(record: HeadRecord) -> list[tuple[int, int]]:
    """The (row, head) cells that are heads (a layer with fewer heads has NaN beyond its last)."""
    first = next(iter(record.columns.values()), None)
    if first is None:
        return [idx for idx, _ in np.ndenumerate(record.tags)]
    return [idx for idx, value in np.ndenumerate(np.asarray(first, dtype=np.float64)) if value == value]


def _words(text: Any) -> list[str]:
    from attnviz.inspection.tags import split_tags

    return split_tags(text)


def table_text(record: HeadRecord, width: int = 160) -> str:
    """The head table as ``inspect`` prints it, in plain characters."""
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, color_system=None, force_terminal=False, legacy_windows=False).print(
        record.table, crop=False)
    return out.getvalue()


def _table_markdown(record: HeadRecord, notes: list[str]) -> str:
    """The table as Markdown TensorBoard shows in a fixed-width block (indented four spaces), under a line saying
    whose it is."""
    lines = [f"head statistics of {record.source}", ""]
    lines += ["    " + line for line in table_text(record).rstrip("\n").splitlines()]
    lines += ["", *notes] if notes else []
    return "\n".join(lines)


def _move_in(made: Path, folder: Path, name: str) -> Path:
    """``made`` into ``folder`` as ``name``: copied under a hidden name TensorBoard does not read, then renamed; on
    failure (a full disk) nothing is left in ``folder``."""
    from attnviz.staging import hidden_file, umask

    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, part = hidden_file(folder, ".attnviz-", ".part")
    except OSError as exc:
        raise OutputError(f"{folder}: cannot write TensorBoard's event file ({exc.strerror or exc}).") from None
    try:
        with os.fdopen(fd, "wb") as out, open(made, "rb") as src:
            shutil.copyfileobj(src, out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(part, 0o666 & ~umask())
        target = folder / name
        os.replace(part, target)
    except OSError as exc:
        try:
            os.unlink(part)
        except OSError:
            pass
        raise OutputError(f"{folder}: cannot write TensorBoard's event file ({exc.strerror or exc}).") from None
    return target
