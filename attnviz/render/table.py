"""Rich tables of attention weights and per-query statistics. Builds renderables; never prints.

**Fitting the width.** Every table is laid out for the width it is printed at (``Console.print`` hands
it the console's width: ``COLUMNS``, the terminal's, or 80 on a pipe; see ``attnviz.streams``). The
functions here return a ``Fitted``, which builds its rich ``Table`` at render time, with every column
given its exact width and ``no_wrap``, so that no line is wider than the console:

* **Key columns** (one per key of a map, or per position of a vector) that do not all fit are elided
  in the middle, the first and last ones kept around a ``…`` column, as rows are around a ``⋮`` row;
  the caption says which were left out and how to see more. ``max_cols``: None shows what fits, ``N``
  at most N (of those that fit), 0 every one (the table is then as wide as they need, wider than the
  terminal if need be: for ``less -S`` or a file).
* **Headers** are never folded: a key's label longer than its column ends in an ellipsis (a column is
  as wide as its numbers, and its header up to 24, 16 or 10 cells: the longest that costs no key
  column); a long fixed header gives way to a short name (``top-3 (key: weight)`` to
  ``top-3``, ``fully masked rows`` to ``masked``).
* **Row labels** (a position and its token) are cut with an ellipsis, never wrapped; the column is at
  most ``ROW_LABEL_CELLS`` cells, a fifth of the width on narrow terminals.
* **Top-k entries** (``2 sat: 0.034``) are never split across lines. When they do not fit on one line,
  the argmax column is left out first (it is the first top-k entry; the caption says so), then the
  entries' labels get shorter (9, then 6 cells), and only then do whole entries go on further lines.

Widths are terminal cells (``rich.cells.cell_len``): a CJK character counts two.

Long maps are elided: the first and last rows (and columns) are shown around a ``⋮`` row (``…``
column), and the caption says what was left out and how to see more.

Labels and titles come from users' files: they reach rich as ``Text`` (never parsed for markup or
emoji codes), shortened and with control characters made visible (``attnviz.text``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.cells import cell_len, get_character_cell_size
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.style import Style
from rich.table import Table
from rich.text import Text

from attnviz import text as inert
from attnviz.io import array_max
from attnviz.stats import RowStats

# viridis, sampled at 9 points: dark blue (low) to yellow (high); readable on dark and light terminals
_RAMP = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"]
MASKED = "·"
PAD = "pad"  # marks a query row at a padded position (left out of statistics and checks)
GAP = "…"  # the column standing for the key columns left out
ROW_LABEL_CELLS = 16  # the row-label column at most: a position and a 12-character label
HEADER_CELLS = 10  # a key column's header at most
ENTRY_LABEL_CELLS = (12, 9, 6)  # a top-k entry's label, as space allows


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal cells (a wide character counts two), its end replaced by an
    ellipsis when it was cut."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return inert.ELLIPSIS if width == 1 else ""
    kept, used = [], 0
    for ch in text:
        size = get_character_cell_size(ch)
        if used + size > width - 1:
            break
        kept.append(ch)
        used += size
    return "".join(kept) + inert.ELLIPSIS


def frame(columns: int) -> int:
    """Cells a table of ``columns`` columns spends besides its cells: a space either side of each cell
    and a rule between and around them (rich's default box, padding and edges)."""
    return 3 * columns + 1


def row_label_cells(width: int | None) -> int:
    """The widest row-label column for a table ``width`` cells wide."""
    return ROW_LABEL_CELLS if width is None else max(6, min(ROW_LABEL_CELLS, width // 5))


#: the head statistics that are weights (or sums of weights) on some keys: a column of them whose largest is below
#: ``NEGLIGIBLE`` of uniform attention's weight reads 0 (``column_decimals``)
WEIGHT_STATISTICS = frozenset({"diagonal", "previous", "first", "last", "max", "induction", "duplicate", "sink_mass",
                               "local_mass", "punctuation", "next"})

#: what the tables (and the HTML report) write for a number that is undefined (NaN)
UNDEFINED = "\u2013"


def number_text(value: float, precision: int) -> str:
    """A number as the tables write it: ``precision`` digits after the point, ``UNDEFINED`` for NaN (the HTML
    report's convention: one convention for both)."""
    return UNDEFINED if value != value else f"{value:.{precision}f}"


#: the most digits after the point a column of statistics is written with (``column_decimals``); a column whose
#: largest value needs more is written in scientific notation
MOST_DECIMALS = 8


#: a weight below this share of uniform attention's (1/n over n keys) is negligible: a column of such weights reads
#: 0 at ``--precision`` digits (at 947 tokens, 5e-6 on the last token of a sink head)
NEGLIGIBLE = 0.01


def column_decimals(values: Any, precision: int, uniform: float | None = None) -> int | None:
    """The digits after the point a column of ``values`` is written with: ``precision``, or more where the column's
    largest magnitude would show fewer than ``precision`` significant digits (at least one), so that a column of
    values about 3e-4 reads 0.000320, 0.000170, never a column of 0.000 over values that differ. A value far below
    the column's largest still reads 0.000 (negligible beside it), and so does a column of weights whose largest is
    below ``NEGLIGIBLE`` times ``uniform`` (uniform attention's weight, 1/n: given for columns of weights). None:
    the column's largest magnitude is below what ``MOST_DECIMALS`` digits show, and it is written in scientific
    notation (``column_texts``)."""
    data = np.abs(np.asarray(values, dtype=np.float64).ravel())
    finite = data[np.isfinite(data) & (data > 0)]
    if not finite.size or (uniform is not None and float(finite.max()) < NEGLIGIBLE * uniform):
        return precision
    digits = max(precision, 1)
    top = float(finite.max())
    # the position of the largest value's leading digit: 0 for 1.0 to 9.99, -4 for 3.2e-4
    lead = int(np.floor(np.log10(top)))
    if round(top, digits - 1 - lead) >= 10.0 ** (lead + 1):  # 9.9996 rounds up to 10.00: one place more
        lead += 1
    need = digits - 1 - lead
    if need > MOST_DECIMALS:
        return None
    return max(precision, need)


def column_texts(values: Any, precision: int, uniform: float | None = None) -> list[str]:
    """A column of numbers as the head tables write it: every value with the column's digits
    (``column_decimals``; ``uniform``: a column of weights over keys of that uniform weight), ``UNDEFINED`` for
    NaN or None."""
    data = np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    decimals = column_decimals(data, precision, uniform)
    if decimals is None:
        return [UNDEFINED if v != v else f"{v:.{max(precision, 1) - 1}e}" for v in data.tolist()]
    return [number_text(v, decimals) for v in data.tolist()]


def number_width(values: Any, precision: int) -> int:
    """Cells of the widest of ``values`` as the tables print them (``f"{x:.{precision}f}"``)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return 1
    finite = data[np.isfinite(data)]
    width = 4 if finite.size < data.size else 1  # nan, inf, -inf
    if finite.size:
        width = max(width, len(f"{finite.max():.{precision}f}"), len(f"{finite.min():.{precision}f}"))
    return width


def ends(n: int, m: int) -> list[int | None]:
    """``m`` of ``n`` positions: the first and the last ones around a ``None`` gap (all when ``m >= n``)."""
    if m >= n:
        return list(range(n))
    m = max(m, 1)
    head = (m + 1) // 2
    return [*range(head), None, *range(n - (m - head), n)]


def key_columns(n: int, width_of: Callable[[int], int], budget: int | None, limit: int | None) -> list[int | None]:
    """Which of ``n`` key columns to show: at most ``limit`` (None: no limit; 0: every one, whatever the
    width), and no more than fit in ``budget`` cells (None: any number), a column costing its width and
    3, the ``…`` column 4. At least one is shown."""
    if limit == 0:
        return list(range(n))
    cap = n if limit is None else min(limit, n)
    if budget is None:
        return ends(n, cap)
    if cap == n:
        total = 0
        for j in range(n):
            total += width_of(j) + 3
            if total > budget:
                break
        else:
            return list(range(n))
    shown = ends(n, 1)
    for m in range(2, cap + 1):
        candidate = ends(n, m)
        cost = sum(width_of(j) + 3 for j in candidate if j is not None) + (4 if None in candidate else 0)
        if cost > budget:
            break
        shown = candidate
    return shown


def table_width(table: Table) -> int:
    """The width of a table whose every column has its width set."""
    return sum(c.width or 0 for c in table.columns) + frame(len(table.columns))


class Fitted:
    """A table laid out for the width it is printed at: ``Console.print`` renders it at the console's
    width (``ConsoleOptions.max_width``). ``table(width)`` builds the rich ``Table`` itself (``None``:
    natural widths, nothing elided for want of space). A table that asked for every column
    (``max_cols=0``) and needs more than the width is printed at its own width, never squeezed. With
    ``whole_in_pipe``, a console whose width is a default for a pipe or a file (``width_known`` False) gets the
    table at its natural width: a pipe is not a terminal, nothing need be left out for it."""

    def __init__(self, build: Callable[[int | None], Table], whole_in_pipe: bool = False) -> None:
        self._build = build
        self._whole_in_pipe = whole_in_pipe

    def _width(self, console: Console, width: int) -> int | None:
        return None if self._whole_in_pipe and not getattr(console, "width_known", True) else width

    def table(self, width: int | None = None) -> Table:
        return self._build(width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self._build(self._width(console, options.max_width))
        need = table_width(table)
        options = options.update_width(need) if need > options.max_width else options
        plain = plain_table(table, console, options) if console.color_system is None else None
        yield from plain if plain is not None else console.render(table, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        need = table_width(self._build(self._width(console, options.max_width)))
        return Measurement(need, need)


def plain_table(table: Table, console: Console, options: ConsoleOptions) -> list[Any] | None:
    """The segments of ``table`` without colour (a console writing to a pipe or a file), made line by line
    here rather than cell by cell by rich: the same text to the character (``tests/test_tables.py`` compares
    the two on every table the commands print), in a tenth of the time (rich lays out each cell on its
    own: the head table of a BERT-base dump has 1,440). The title and caption are rich's. Only for
    what this is sure of: every column of a set width, all of them fitting; a header row and one line
    per cell, within its column (no wrapping, no cutting), of plain characters (no markup or emoji
    codes, no tabs or control characters); no footer, lines between rows, row styles or sections.
    Anything else: None, and rich renders the table."""
    from rich.segment import Segment
    from rich.style import Style

    if (table.show_footer or table.show_lines or table.leading or table.row_styles or not table.show_header
            or table.expand or table.width is not None or table.collapse_padding or not table.columns
            or any(row.style is not None or row.end_section for row in table.rows)):
        return None
    top, pad_right, bottom, pad_left = table.padding
    if top or bottom:
        return None
    last = len(table.columns) - 1
    pads = [(0 if i == 0 and not table.pad_edge else pad_left, 0 if i == last and not table.pad_edge else pad_right)
            for i in range(last + 1)]
    if any(c.width is None for c in table.columns):
        return None
    widths = [c.width + left + right for c, (left, right) in zip(table.columns, pads)]  # type: ignore[operator]
    extra = (2 if table.box and table.show_edge else 0) + (last if table.box else 0)
    if (min(widths) < 1 or sum(widths) > options.max_width - extra
            or (table.min_width is not None and sum(widths) < table.min_width - extra)):
        return None

    def plain(cell: Any, width: int, justify: str) -> str | None:
        """The cell's one line, justified as rich does it, or None when it is not plain enough."""
        if isinstance(cell, Text):
            text = cell.plain
            if cell.justify is not None:  # a text's own justification comes first
                justify = cell.justify
        elif isinstance(cell, str) and ":" not in cell and "[" not in cell:
            text = cell
        else:
            return None
        if not text.isprintable():
            return None
        size = len(text) if text.isascii() else cell_len(text)  # (an ASCII character is one cell)
        if size > width:
            return None
        if justify == "right" or justify == "center":
            stripped = text.rstrip()  # printable: only spaces go, a cell each
            size -= len(text) - len(stripped)
            text = stripped
            if justify == "right":
                return " " * (width - size) + text
            left = (width - size) // 2
            return " " * left + text + " " * (width - left - size)
        if justify == "full" or justify not in ("left", "default"):
            return None
        return text + " " * (width - size)

    columns = []
    for column, (left, right), width in zip(table.columns, pads, widths):
        inner = width - left - right
        lines = [plain(cell, inner, column.justify) for cell in (column.header, *column.cells)]
        if column.justify not in ("left", "right", "center", "default"):
            return None
        if any(line is None for line in lines):
            return None
        columns.append([" " * left + line + " " * right for line in lines])  # type: ignore[operator]
    box = table.box.substitute(options, safe=table.safe_box if table.safe_box is not None else console.safe_box) \
        if table.box else None
    out: list[str] = []
    rows = list(zip(*columns))
    if box is None:
        out += ["".join(row) for row in rows]
    else:
        edge = table.show_edge
        if edge:
            out.append(box.get_top(widths))
        for n, row in enumerate(rows):
            first, end = n == 0, n == len(rows) - 1
            lead, divider, close = ((box.head_left, box.head_vertical, box.head_right) if first else
                                    (box.foot_left, box.foot_vertical, box.foot_right) if end else
                                    (box.mid_left, box.mid_vertical, box.mid_right))
            out.append((lead if edge else "") + divider.join(row) + (close if edge else ""))
            if first:
                out.append(box.get_row(widths, "head", edge=edge))
        if edge:
            out.append(box.get_bottom(widths))
    render_options = options.update(width=sum(widths) + extra, highlight=table.highlight, height=None)

    def annotation(text: Any, style: Any, justify: Any) -> list[Any]:  # as rich's Table writes its title
        shown = console.render_str(text, style=style, highlight=False) if isinstance(text, str) else text
        return list(console.render(shown, options=render_options.update(justify=justify)))

    segments: list[Any] = []
    if table.title:
        segments += annotation(table.title, Style.pick_first(table.title_style, "table.title"), table.title_justify)
    for line in out:
        segments += [Segment(line), Segment.line()]
    if table.caption:
        segments += annotation(table.caption, Style.pick_first(table.caption_style, "table.caption"),
                               table.caption_justify)
    return segments


def _cells(text: str) -> int:
    """Cells of the widest line of ``text``."""
    return max((cell_len(line) for line in text.split("\n")), default=0)


#: the style of each colour of the ramp (styles are immutable: every cell of a colour shares its one)
_SHADES = tuple(Style(color="black" if i >= 5 else "white", bgcolor=colour) for i, colour in enumerate(_RAMP))


def shade(value: float, vmax: float) -> Style:
    """Background colour for a weight, from the ramp; black text on the light end. (Called once per cell
    of a table: a clip in plain Python and a shared style, not ``np.clip`` and a new ``Style``.)"""
    frac = 0.0 if vmax <= 0 else float(min(max(value / vmax, 0.0), 1.0))
    return _SHADES[int(round(frac * (len(_RAMP) - 1)))]


def pick(n: int, limit: int | None) -> list[int | None]:
    """Indices to show of ``n``: all, or the head and tail around a ``None`` gap."""
    if limit is None or n <= limit:
        return list(range(n))
    limit = max(limit, 2)
    head = (limit + 1) // 2
    tail = limit - head
    return [*range(head), None, *range(n - tail, n)]


def _elided(indices: list[int | None], n: int, what: str) -> str | None:
    if None not in indices:
        return None
    gap = indices.index(None)
    first_hidden = indices[gap - 1] + 1 if gap > 0 else 0  # type: ignore[operator]
    last_hidden = indices[gap + 1] - 1 if gap + 1 < len(indices) else n - 1  # type: ignore[operator]
    return f"{what} {first_hidden}-{last_hidden} of {n}"


def slice_label(index: Sequence[int], names: Sequence[str] = ()) -> str:
    """``slice [0, 2]``, or with names for the last leading axes ``batch 0, head 2``."""
    if not names:
        return f"slice {list(index)}"
    named = list(names)[-len(index):] if len(names) >= len(index) else (
        ["batch" if len(index) - len(names) == 1 else f"dim {i}" for i in range(len(index) - len(names))]
        + list(names))
    return ", ".join(f"{n} {int(i)}" for n, i in zip(named, index))


def axis_name(i: int, labels: Sequence[str] | None, width: int = 12) -> str:
    """``3 cat``: a position and its label, shortened to ``width`` and made visible."""
    if labels is None:
        return str(i)
    return f"{i} {inert.label(labels[i], width)}"


def _caption(value: str | None) -> Text | None:
    """Plain text for rich: a ``Text`` is never read as markup or emoji codes."""
    return None if value is None else Text(value, style="table.caption")


def _title(value: str | None) -> Text | None:
    return None if value is None else Text(inert.title(value), style="table.title")


def _key_header(labels: Sequence[str] | None, j: int) -> str:
    return inert.label(labels[j]) if labels is not None else str(j)


def _key_column_width(labels: Sequence[str] | None, j: int, number: int, cap: int = HEADER_CELLS) -> int:
    """A key column: as wide as its numbers, and its header up to ``cap`` cells."""
    return max(number, min(cell_len(_key_header(labels, j)), cap))


#: a key column's header at most, longest first: the longest that costs no key column is used
HEADER_CAPS = (inert.LABEL_WIDTH, 16, HEADER_CELLS)


def _fit_keys(n: int, labels: Sequence[str] | None, number: int, budgets: Sequence[int | None],
              limit: int | None) -> tuple[int, int, list[int | None]]:
    """The key columns shown, the header cap and which of ``budgets`` (cells for the key columns, best
    first): the most columns, then the longest headers, then the earliest budget."""
    def fit(budget: int | None, cap: int) -> list[int | None]:
        return key_columns(n, lambda j: _key_column_width(labels, j, number, cap), budget, limit)

    most = len(fit(budgets[-1], HEADER_CAPS[-1]))
    for cap in HEADER_CAPS:
        for b, budget in enumerate(budgets):
            cols = fit(budget, cap)
            if len(cols) >= most:
                return b, cap, cols
    return len(budgets) - 1, HEADER_CAPS[-1], fit(budgets[-1], HEADER_CAPS[-1])


def _add_key_columns(table: Table, cols: Iterable[int | None], labels: Sequence[str] | None, number: int,
                     cap: int = HEADER_CELLS) -> None:
    for j in cols:
        if j is None:
            table.add_column(Text(GAP), justify="center", no_wrap=True, width=1)
            continue
        w = _key_column_width(labels, j, number, cap)
        table.add_column(Text(clip(_key_header(labels, j), w)), justify="right", no_wrap=True, overflow="ellipsis",
                         width=w)


def weights_table(
    weights: np.ndarray,
    *,
    q_labels: Sequence[str] | None = None,
    k_labels: Sequence[str] | None = None,
    keep: np.ndarray | None = None,
    precision: int = 3,
    max_rows: int | None = None,
    max_cols: int | None = None,
    title: str | None = None,
    axis_names: tuple[str, str] = ("query", "key"),
    row_ids: Sequence[int] | None = None,
    total_rows: int | None = None,
    padded: np.ndarray | None = None,
) -> Fitted:
    """A table of one 2-D map ``[Lq, Lk]``, each cell shaded by its value. Masked cells show ``·``.

    ``row_ids``: ``weights`` holds only these rows of a map of ``total_rows`` (a long map computed in
    blocks keeps its first and last rows); the gap between them is elided like any other.
    ``padded`` (bool ``[Lq]``): query rows at padded positions, labelled ``pad`` and shown dim, unshaded.
    ``max_cols``: None, the key columns that fit; N, at most N of them; 0, all (see the module)."""
    grid: Any = weights if row_ids is None else _RowsView(weights, row_ids)
    lq, lk = grid.shape
    if row_ids is not None:
        lq = total_rows or lq
        chosen = [row_ids[p] for p in pick(len(row_ids), max_rows) if p is not None]
        rows: list[int | None] = []
        for rid in chosen:
            previous = rows[-1] if rows else None
            if previous is not None and rid != previous + 1:
                rows.append(None)
            rows.append(rid)
    else:
        rows = pick(lq, max_rows)
    shown = [i for i in rows if i is not None]
    vmax = array_max(weights) if lk else 1.0
    number = number_width(weights if row_ids is not None else weights[shown], precision)
    labels = {i: axis_name(i, q_labels) + (f" {PAD}" if padded is not None and padded[i] else "") for i in shown}
    corner = f"{inert.label(axis_names[0])} \\ {inert.label(axis_names[1])}"
    label_natural = max([*(cell_len(t) for t in labels.values()), min(cell_len(axis_names[0]), 8)])

    def build(width: int | None) -> Table:
        narrow = min(label_natural, row_label_cells(width))
        wider = max(narrow, min(cell_len(corner), row_label_cells(width)))  # room for "query \\ key"
        label_widths = [wider, narrow]  # the wider only when it costs no key column
        budgets = [None if width is None else width - 1 - (w + 3) for w in label_widths]
        which, cap, cols = _fit_keys(lk, k_labels, number, budgets, max_cols)
        label_w = label_widths[which]
        caption_parts = [p for p in (_elided(rows, lq, "rows"), _elided(cols, lk, "columns")) if p]
        caption = None
        if caption_parts:
            caption = "not shown: " + ", ".join(caption_parts) + " (--max-rows / --max-cols show more)"
        if keep is not None and not keep.all():
            caption = (caption + "; " if caption else "") + f"{MASKED} = masked"
        if padded is not None and padded.any():
            caption = (caption + "; " if caption else "") + f"{PAD} = a padded query row"
        table = Table(title=_title(title), caption=_caption(caption), caption_justify="left")
        head = corner if cell_len(corner) <= label_w else clip(inert.label(axis_names[0]), label_w)
        table.add_column(Text(head), style="bold", no_wrap=True, overflow="ellipsis", width=label_w)
        _add_key_columns(table, cols, k_labels, number, cap)
        for i in rows:
            if i is None:
                table.add_row("⋮", *["⋮" for _ in cols])
                continue
            cells: list[Text | str] = []
            pad = padded is not None and bool(padded[i])
            for j in cols:
                if j is None:
                    cells.append(GAP)
                elif keep is not None and not keep[i, j]:
                    cells.append(Text(MASKED, style="dim", justify="center"))
                else:
                    value = float(grid[i, j])
                    cells.append(Text(number_text(value, precision), style="dim" if pad else shade(value, vmax)))
            table.add_row(Text(labels[i]), *cells)
        return table

    return Fitted(build)


class _RowsView:
    """Some rows of a map, indexed by their row numbers in the whole map."""

    def __init__(self, data: np.ndarray, row_ids: Sequence[int]) -> None:
        self.data = data
        self.where = {int(i): n for n, i in enumerate(row_ids)}
        self.shape = (max(self.where) + 1 if self.where else 0, data.shape[-1])

    def __getitem__(self, index: tuple[int, int]) -> float:
        return float(self.data[self.where[index[0]], index[1]])


def stats_table(
    stats: RowStats,
    *,
    q_labels: Sequence[str] | None = None,
    k_labels: Sequence[str] | None = None,
    precision: int = 3,
    max_rows: int | None = None,
    title: str | None = None,
    row_name: str = "query",
    padded: np.ndarray | None = None,
    keep: np.ndarray | None = None,
) -> Fitted:
    """Per-query statistics of one 2-D map: entropy, normalised entropy, max, argmax, top-k, row sum.
    ``padded`` (bool ``[Lq]``): rows at padded positions, shown as ``pad`` (left out). ``keep`` (bool, broadcasting
    to ``[Lq, Lk]``): the keys a row may attend to; the top-k lists leave the others out.

    To fit the width, the argmax column (the first top-k entry) is left out first, then the top-k
    entries' labels are shortened, then whole entries wrap onto further lines; an entry is never split."""
    lq = stats.entropy.shape[0]
    rows = pick(lq, max_rows)
    elided = _elided(rows, lq, "rows")
    counted = ~stats.masked if padded is None else ~stats.masked & ~padded
    sparse = bool(((stats.support < stats.n_keys) & counted).any())  # exact zeros: say how many keys each row uses
    kept = None if keep is None else np.broadcast_to(keep, (lq, np.shape(keep)[-1]))
    cells = _StatsCells(_stats_records(stats, rows, q_labels, k_labels, precision, padded, sparse, kept), k_labels,
                        stats.top_index.shape[-1], sparse, row_name)

    def build(width: int | None) -> Table:
        fit = _fit_stats(cells, width)
        lines, top_w, top_header = _top_lines(cells, fit, width)
        notes = ["H: entropy in nats; H/ln n: normalised by the unmasked key count"]
        if not fit.argmax_shown:
            notes.append("argmax: the first top-k entry")
        if padded is not None and padded.any():
            notes.append(f"{PAD}: a padded query row, left out")
        if elided:
            notes.append(f"not shown: {elided} (--max-rows shows more)")
        table = Table(title=_title(title), caption="; ".join(notes), caption_justify="left")
        _add_stats_columns(table, cells, fit, top_header, top_w)
        _add_stats_rows(table, cells, fit, lines)
        return table

    return Fitted(build)


def _stats_records(stats: RowStats, rows: Sequence[int | None], q_labels: Sequence[str] | None,
                   k_labels: Sequence[str] | None, p: int, padded: np.ndarray | None,
                   sparse: bool, keep: np.ndarray | None = None) -> list[dict[str, Any]]:
    """Every cell of a ``stats_table`` as text, a record a row: its label, its kind (``row``,
    ``masked``, ``pad`` or ``gap``), the three numbers, argmax, top-k entries, sum and support."""
    records: list[dict[str, Any]] = []
    for i in rows:
        if i is None:
            records.append({"kind": "gap"})
            continue
        rec: dict[str, Any] = {"label": axis_name(i, q_labels),
                               "support": f"{int(stats.support[i])}/{int(stats.n_keys[i])}" if sparse else ""}
        if padded is not None and padded[i]:
            rec.update(kind="pad", support=PAD if sparse else "")
        elif stats.masked[i]:
            rec.update(kind="masked", sum=f"{stats.row_sum[i]:.{p}f}")
        else:
            rec.update(kind="row", numbers=[f"{stats.entropy[i]:.{p}f}", f"{stats.entropy_norm[i]:.{p}f}",
                                            f"{stats.max[i]:.{p}f}"],
                       argmax=axis_name(int(stats.argmax[i]), k_labels), sum=f"{stats.row_sum[i]:.{p}f}",
                       top=[(int(j), f"{w:.{p}f}") for j, w in zip(stats.top_index[i], stats.top_weight[i])
                            if keep is None or keep[i, int(j)]])
        records.append(rec)
    return records


class _StatsCells:
    """The records of a ``stats_table`` (``_stats_records``), the natural widths of its columns, and
    its top-k entries as text with their labels at most so many cells."""

    NUMBERS = ("H", "H/ln n", "max")

    def __init__(self, records: list[dict[str, Any]], k_labels: Sequence[str] | None, k: int, sparse: bool,
                 row_name: str) -> None:
        self.records, self.k_labels, self.sparse, self.row_name = records, k_labels, sparse, row_name
        filler = self.filler
        self.label_natural = max([cell_len(inert.label(row_name)),
                                  *(cell_len(r["label"]) for r in records if "label" in r)])
        self.number_w = [_width_of([r["numbers"][n] if r["kind"] == "row" else filler(r) for r in records],
                                   self.NUMBERS[n]) for n in range(3)]
        self.argmax_w = _width_of([r["argmax"] if r["kind"] == "row" else filler(r) for r in records], "argmax")
        self.sum_w = _width_of([r.get("sum", filler(r)) if r["kind"] != "gap" else "⋮" for r in records], "sum")
        self.support_w = _width_of([r.get("support", "⋮") for r in records], "support") if sparse else 0
        self.top_full, self.top_short = f"top-{k} (key: weight)", f"top-{k}"

    @staticmethod
    def filler(rec: dict[str, Any]) -> str:
        return "⋮" if rec["kind"] == "gap" else PAD if rec["kind"] == "pad" else "masked"

    def entry(self, j: int, weight: str, cells: int) -> str:
        if self.k_labels is None:
            return f"{j}: {weight}"
        return f"{j} {clip(inert.label(self.k_labels[j], 12), cells)}: {weight}"

    def entries(self, rec: dict[str, Any], cells: int) -> list[str]:
        return [self.entry(j, w, cells) for j, w in rec["top"]] if rec["kind"] == "row" else [self.filler(rec)]

    def one_line(self, cells: int) -> int:
        return max((cell_len("  ".join(self.entries(rec, cells))) for rec in self.records), default=1)

    def widest_entry(self, cells: int) -> int:
        return max((cell_len(e) for rec in self.records for e in self.entries(rec, cells)), default=1)


def _width_of(values: Iterable[str], header: str) -> int:
    return max([cell_len(header), *(cell_len(v) for v in values)])


@dataclass
class _StatsFit:
    """How a ``stats_table`` fits a width: the row labels' column, whether the argmax column is shown,
    the cells of a top-k entry's label, and the width its entries wrap at (None: one line a row)."""

    label_w: int
    argmax_shown: bool
    cells: int
    wrap_at: int | None


def _fit_stats(c: _StatsCells, width: int | None) -> _StatsFit:
    """The argmax column left out first, then the top-k entries' labels shortened, then whole entries on
    further lines (the row labels giving way first on a narrow terminal)."""
    label_w = min(c.label_natural, row_label_cells(width))
    argmax_shown, cells, wrap_at = True, ENTRY_LABEL_CELLS[0], None
    if width is not None:
        def room(argmax: bool) -> int:  # cells left for the top-k column
            columns = 6 + argmax + c.sparse
            argmax_w = min(c.argmax_w, ROW_LABEL_CELLS) if argmax else 0
            used = label_w + sum(c.number_w) + c.sum_w + c.support_w + argmax_w
            return width - used - frame(columns)

        tries = [(True, ENTRY_LABEL_CELLS[0])] + [(False, n) for n in ENTRY_LABEL_CELLS]
        fits = [(a, n) for a, n in tries if max(c.one_line(n), cell_len(c.top_short)) <= room(a)]
        if fits:
            argmax_shown, cells = fits[0]
        else:  # whole entries on further lines, each entry's label as long as the column allows
            argmax_shown = False
            short_by = c.widest_entry(3) - room(False)
            if short_by > 0:  # a narrow terminal: the row labels give way first
                label_w = max(min(c.label_natural, 6), label_w - short_by)
            wrap_at = max(room(False), cell_len(c.top_short))
            cells = next((n for n in (*ENTRY_LABEL_CELLS, 3) if c.widest_entry(n) <= wrap_at), 3)
    return _StatsFit(label_w, argmax_shown, cells, wrap_at)


def _top_lines(c: _StatsCells, fit: _StatsFit, width: int | None) -> tuple[list[list[str]], int, str]:
    """Each row's top-k entries (its lines, when they wrap), the top-k column's width and its header
    (the short one when the long one would widen the column)."""
    lines = [c.entries(rec, fit.cells) for rec in c.records]
    if fit.wrap_at is None:
        top_w = c.one_line(fit.cells)
    else:
        lines = [_pack(shown, fit.wrap_at).split("\n") for shown in lines]
        top_w = max((cell_len(line) for shown in lines for line in shown), default=1)
    if width is None or top_w >= cell_len(c.top_full):
        top_header = c.top_full
    else:
        top_header = c.top_short
    return lines, max(top_w, cell_len(top_header)), top_header


def _add_stats_columns(table: Table, c: _StatsCells, fit: _StatsFit, top_header: str, top_w: int) -> None:
    table.add_column(Text(clip(inert.label(c.row_name), fit.label_w)), no_wrap=True, overflow="ellipsis",
                     width=fit.label_w)
    for name, w in zip(c.NUMBERS, c.number_w):
        table.add_column(name, justify="right", no_wrap=True, width=w)
    if fit.argmax_shown:
        table.add_column("argmax", no_wrap=True, overflow="ellipsis", width=min(c.argmax_w, ROW_LABEL_CELLS))
    table.add_column(Text(top_header), no_wrap=True, overflow="ellipsis", width=top_w)
    table.add_column("sum", justify="right", no_wrap=True, width=c.sum_w)
    if c.sparse:
        table.add_column("support", justify="right", no_wrap=True, width=c.support_w)


def _add_stats_rows(table: Table, c: _StatsCells, fit: _StatsFit, lines: Sequence[Sequence[str]]) -> None:
    """A row a record: a gap's ``⋮`` across, masked and padded rows dim, the top-k entries on one line
    or as wrapped."""
    for rec, shown in zip(c.records, lines):
        kind = rec["kind"]
        if kind == "gap":
            table.add_row("⋮", *["⋮"] * (len(table.columns) - 1))
            continue
        dim = Text(c.filler(rec), style="dim")
        if kind == "row":
            cells: list[Text | str] = [*rec["numbers"], *([Text(rec["argmax"])] if fit.argmax_shown else [])]
            top: Text | str = Text("\n".join(shown) if fit.wrap_at is not None else "  ".join(shown))
        else:
            cells = [dim] * (3 + fit.argmax_shown)
            top = dim
        tail = [rec["sum"]] if kind != "pad" else [dim]
        table.add_row(Text(rec["label"]), *cells, top, *tail, *([rec["support"]] if c.sparse else []))


def _pack(items: Sequence[str], width: int) -> str:
    """``items`` joined by two spaces, a line break instead where the next would pass ``width`` cells."""
    lines: list[str] = []
    for item in items:
        if lines and cell_len(lines[-1]) + 2 + cell_len(item) <= width:
            lines[-1] += "  " + item
        else:
            lines.append(item)
    return "\n".join(lines)


def vector_table(
    values: np.ndarray,
    *,
    labels: Sequence[str] | None = None,
    precision: int = 3,
    max_cols: int | None = None,
    title: str | None = None,
) -> Fitted:
    """One row of values over an axis (a pooling distribution, the attention a token receives); its
    columns fitted to the width as a map's key columns are."""
    n = values.shape[0]
    vmax = float(np.max(values)) if values.size else 1.0
    number = number_width(values, precision)

    def build(width: int | None) -> Table:
        _, cap, cols = _fit_keys(n, labels, number, [None if width is None else width - 1], max_cols)
        elided = _elided(cols, n, "columns")
        table = Table(title=_title(title), caption=_caption(f"not shown: {elided} (--max-cols shows more)")
                      if elided else None, caption_justify="left")
        _add_key_columns(table, cols, labels, number, cap)
        table.add_row(*[GAP if j is None else Text(number_text(float(values[j]), precision),
                                                   style=shade(float(values[j]), vmax)) for j in cols])
        return table

    return Fitted(build)


def slice_summary_table(stats: RowStats, *, precision: int = 3, max_rows: int | None = None,
                        names: Sequence[str] = ()) -> Fitted:
    """One row per batch/head slice: means over its unmasked query rows. To fit the width, the last
    header gives way to a short name (``masked``), then the slice names are cut with an ellipsis."""
    lead = stats.entropy.shape[:-1]
    slices = list(np.ndindex(*lead))
    rows = pick(len(slices), max_rows)
    elided = _elided(rows, len(slices), "slices")
    p = precision
    records: list[list[str]] = []
    for r in rows:
        if r is None:
            records.append(["⋮"] * 5)
            continue
        one = stats.select(slices[r])
        live = ~one.masked
        name = inert.label(slice_label(slices[r], names), 80)
        if not live.any():
            records.append([name, "masked", "masked", "masked", str(int(one.masked.sum()))])
            continue
        records.append([name, f"{one.entropy[live].mean():.{p}f}", f"{one.entropy_norm[live].mean():.{p}f}",
                        f"{one.max[live].mean():.{p}f}", str(int(one.masked.sum()))])
    headers = ["slice", "H", "H/ln n", "max", "fully masked rows"]
    natural = [max([cell_len(h), *(cell_len(rec[c]) for rec in records)]) for c, h in enumerate(headers)]

    def build(width: int | None) -> Table:
        widths, last = list(natural), headers[-1]
        if width is not None and sum(widths) + frame(5) > width:
            last = "masked"
            widths[4] = max(cell_len(last), *(cell_len(rec[4]) for rec in records))
            widths[0] = max(8, min(widths[0], width - frame(5) - sum(widths[1:])))
        table = Table(title="per-slice summary (means over query rows)",
                      caption=f"not shown: {elided} (--max-rows shows more)" if elided else None,
                      caption_justify="left")
        for c, (name, w) in enumerate(zip([*headers[:4], last], widths)):
            table.add_column(name, justify="left" if c == 0 else "right", no_wrap=True, overflow="ellipsis", width=w)
        for rec in records:
            table.add_row(Text(rec[0]), *[Text(v, style="dim") if v == "masked" else v for v in rec[1:]])
        return table

    return Fitted(build)
