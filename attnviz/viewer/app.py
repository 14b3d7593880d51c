"""The viewer's Textual application over a ``ViewerModel``: the selected map (half-blocks, as ``--show``
draws them) with a cursor, the layer x head grid of thumbnails, the head's statistics and tags, and a
line saying what is under the cursor.

Keys (``KEYS``; ``?`` shows them): arrows or ``h``/``j``/``k``/``l`` move between heads (left, right) and
layers (up, down); ``b``/``B`` to the next or previous batch entry; shift+arrows or ``H``/``J``/``K``/``L``
move the cursor (the mouse too); ``/`` finds a token; ``s`` sorts the heads by the next statistic; ``m`` draws
blocks as their maxima (again: means); ``r`` shows the rollout (again: the head); ``q`` quits. It fits 80 x 24:
the thumbnails show as many layers as fit, around the selected one. The model is a ``ViewerModel`` over
weights, or a ``attnviz.viewer.summary.SummaryViewerModel`` over a summary capture (its pooled maps).
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Footer, Input, Static

from attnviz.viewer.model import ViewerModel


def _text(lines: list[list[Any]]) -> Group:
    """Lines of rich segments as texts Textual draws."""
    out = []
    for line in lines:
        text = Text(no_wrap=True, overflow="crop")
        for segment in line:
            text.append(segment.text, segment.style)
        out.append(text)
    return Group(*out)


class MapView(Widget):
    """The selected map, laid out for the widget's size."""

    def __init__(self, model: ViewerModel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.picture: Any = None

    def render(self) -> Any:
        width, height = max(self.size.width, 12), max(self.size.height, 4)
        self.picture = self.model.picture(width, height)
        return _text(self.picture.lines(width))

    def on_mouse_move(self, event: Any) -> None:
        """The cursor follows the mouse over the map's cells."""
        picture = self.picture
        if picture is None or not picture.placed or picture.placed[0] is None:
            return
        placed = picture.placed[0]
        top, left = picture.origin
        row, col = (event.y - top) * 2 // placed.s, (event.x - left) // placed.s
        if 0 <= row < placed.cells.shape[0] and 0 <= col < placed.cells.shape[1]:
            gq, gk = self.model.drawn_blocks(picture)
            self.model.cursor = (min(row * gq, self.model.shape[0] - 1), min(col * gk, self.model.shape[1] - 1))
            self.app.refresh_all()  # type: ignore[attr-defined]


class Thumbnails(Widget):
    """The layer x head grid, the selected head marked."""

    def __init__(self, model: ViewerModel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model

    def render(self) -> Any:
        width, height = max(self.size.width, 12), max(self.size.height, 4)
        picture = self.model.thumbnails(width, height)
        return _text(picture.lines(width))


#: every key of the viewer and what it does (``?`` shows them; docs/terminal.md lists the same)
KEYS = (("left, right, h, l", "the previous or next head"), ("up, down, k, j", "the previous or next layer"),
        ("b, B", "the next or previous batch entry"), ("shift+arrows, H J K L", "move the cursor (the mouse too)"),
        ("/", "find a token (Enter: next; Escape: close)"), ("s", "walk the heads by the next statistic"),
        ("m", "blocks drawn as their mean or their max"), ("r", "the rollout of the entry; again: the head"),
        ("?", "these keys (again or Escape: close)"), ("q", "quit"))


class ViewerApp(App[None]):
    """``attnviz view``: walk every head of a model's attention with the keyboard."""

    AUTO_FOCUS = None  # the keys are the application's; the search box takes them only when '/' opens it
    ENABLE_COMMAND_PALETTE = False  # its ^p would be a key the viewer does not document
    CSS = """
    #title { height: 1; background: $boost; }
    #body { height: 1fr; }
    #map { width: 1fr; }
    #side { width: 40%; max-width: 60; min-width: 30; padding-left: 1; }
    #thumbs { height: 1fr; }
    #stats { height: auto; max-height: 9; }
    #keys { display: none; dock: top; height: auto; background: $panel; border: round $accent; padding: 0 1; }
    #keys.open { display: block; }
    #status { height: 1; background: $boost; }
    #search { display: none; }
    #search.open { display: block; }
    """
    #: the footer shows the keys a newcomer needs first (quit and the list of keys among them), to fit 80 columns
    BINDINGS = [
        Binding("q", "quit", "quit"), Binding("question_mark", "keys", "keys"),
        Binding("left,h", "head(-1)", "head", show=False), Binding("right,l", "head(1)", "head"),
        Binding("up,k", "layer(-1)", "layer", show=False), Binding("down,j", "layer(1)", "layer"),
        Binding("b", "batch(1)", "entry"), Binding("B", "batch(-1)", "entry", show=False),
        Binding("shift+left,H", "cursor(0,-1)", "cursor", show=False),
        Binding("shift+right,L", "cursor(0,1)", "cursor", show=False),
        Binding("shift+up,K", "cursor(-1,0)", "cursor", show=False),
        Binding("shift+down,J", "cursor(1,0)", "cursor", show=False),
        Binding("slash", "search", "find"), Binding("s", "sort", "sort"),
        Binding("m", "reduce", "mean/max", show=False), Binding("r", "rollout", "rollout"),
    ]

    def __init__(self, model: ViewerModel, title: str) -> None:
        super().__init__()
        self.model = model
        self.heading = title

    def compose(self) -> ComposeResult:
        yield Static(Text(self.heading, no_wrap=True, overflow="ellipsis"), id="title")
        yield Static(_keys_text(), id="keys")
        with Horizontal(id="body"):
            yield MapView(self.model, id="map")
            with Vertical(id="side"):
                yield Thumbnails(self.model, id="thumbs")
                yield Static(id="stats")
        yield Static(id="status")
        yield Input(placeholder="token to find (Enter: next match, Escape: close)", id="search")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_all()

    def refresh_all(self, message: str | None = None) -> None:
        self.query_one("#stats", Static).update(Text("\n".join(self.model.stats_lines()), no_wrap=True,
                                                     overflow="ellipsis"))
        self.query_one("#status", Static).update(Text(message or self.model.cursor_line(), no_wrap=True,
                                                      overflow="ellipsis"))
        self.query_one("#map", MapView).refresh()
        self.query_one("#thumbs", Thumbnails).refresh()

    def action_head(self, step: int) -> None:
        self.model.rollout = False
        self.model.move_head(step)
        self.refresh_all()

    def action_layer(self, step: int) -> None:
        self.model.rollout = False
        self.model.move_layer(step)
        self.refresh_all()

    def action_cursor(self, dq: int, dk: int) -> None:
        view = self.query_one("#map", MapView)
        g = self.model.drawn_blocks(view.picture) if view.picture is not None else (1, 1)
        self.model.move_cursor(dq, dk, g)
        self.refresh_all()

    def action_batch(self, step: int) -> None:
        if not self.model.move_batch(step):
            self.refresh_all("one batch entry only")
            return
        self.refresh_all(f"batch {self.model.entry}")

    def action_keys(self) -> None:
        self.query_one("#keys", Static).toggle_class("open")

    def action_sort(self) -> None:
        key = self.model.next_sort()
        self.refresh_all(f"heads walked by {key}" + (" (largest first)" if key != "head" else ""))

    def action_reduce(self) -> None:
        refused = self.model.next_reduce()
        self.refresh_all(refused or f"blocks drawn as their {'maxima' if self.model.reduce == 'max' else 'means'}")

    def action_rollout(self) -> None:
        refused = None if self.model.rollout else self.model.rollout_refused()
        if refused:
            self.refresh_all(refused)
            return
        self.model.rollout = not self.model.rollout
        self.refresh_all()

    def action_search(self) -> None:
        box = self.query_one("#search", Input)
        box.add_class("open")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        found = self.model.find(event.value)
        self.refresh_all(None if found else f"no token contains {event.value!r}")

    def on_key(self, event: Any) -> None:
        box = self.query_one("#search", Input)
        if event.key == "escape" and box.has_class("open"):
            box.remove_class("open")
            self.set_focus(None)
            event.stop()
        elif event.key == "escape" and self.query_one("#keys", Static).has_class("open"):
            self.query_one("#keys", Static).remove_class("open")
            event.stop()


def _keys_text() -> Text:
    """The list of keys ``?`` shows."""
    text = Text("keys\n", style="bold", no_wrap=False)
    for keys, what in KEYS:
        text.append(f"{keys:<20}", style="bold")
        text.append(f" {what}\n", style="")
    text.rstrip()
    return text
