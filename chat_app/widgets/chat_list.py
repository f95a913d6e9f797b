"""ChatList: the saved conversations, to open, rename or delete (Ctrl+O, or /chats).

Contract: a modal screen over the app's Store (UI thread, as every store call). It opens with
the cursor in a filter line: what is typed there keeps only the chats whose title or text holds
it (as you type), while Up/Down, PgUp/PgDn, Home/End and Enter act on the list. One row per
conversation: its title (the user's, else its first message), when it was last written, its
model and how many messages it has; the open one is marked. The title column gives way (long
titles end in "…") so the model and message count fit at 80 columns. Home/End go to the first/last
row (not the first/last column: End then Enter opened the first chat). Enter opens the chat under the
cursor: the screen is dismissed with its id, and the app switches to it (None: nothing to
open). F2 renames it in place (Enter keeps the title, Esc drops the edit, an empty title
goes back to the first message); Ctrl+D asks, and `y` deletes it (in the list itself, Tab
from the filter, `r` and `d` do the same). However many chats there are, the list holds a page
of them (PAGE rows, one LIMITed query: chat_app.history) and fetches the next page when the
cursor reaches its last row; the filter runs once typing pauses (DEBOUNCE_S), and at once when
a key acts on the list (Enter, the arrows, F2, Ctrl+D), so what it acts on is what was typed.
At 100,000 chats the list took about 5 minutes to open and ignored Ctrl+Q and SIGTERM meanwhile;
now about 1 ms to open and at most about 0.25 s a filter (a term no chat holds reads every
chat's text once). A chat another instance holds
is refused with a notice; every store failure is a notice, never an exception. Titles, first
messages and model names are shown as plain text, control characters visible (chat_app.labels).
"""

from __future__ import annotations

import time

from textual import on
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import DataTable, Input, Static

from chat_app.history import ChatInfo
from chat_app.labels import plain, printable
from chat_app.store import Store, StoreError
from chat_app.widgets.status_bar import shorten

HINT = "type to filter · Enter opens · F2 renames · Ctrl+D deletes · Esc closes"
BOX = 100  # the list's width, at most (chat.tcss: ChatList #chats)
MODEL = 20  # the model column's width
# What is not the title: the mark, "YYYY-MM-DD HH:MM", the model, "msgs"; a cell's padding (2
# each, 5 columns); the box's borders (2) and a scrollbar (2).
OTHERS = 1 + 16 + MODEL + 5 + 5 * 2 + 2 + 2
PAGE = 100  # rows fetched at a time: three screens of them
DEBOUNCE_S = 0.15  # the filter runs once typing pauses this long


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


class ChatTable(DataTable):
    """The rows: Home and End move the cursor to the first and last row (a DataTable's own
    scroll sideways, leaving the cursor where it was)."""

    BINDINGS = [Binding("home", "scroll_top", show=False), Binding("end", "scroll_bottom", show=False)]


class FilterInput(Input):
    """The filter line: it takes what is typed; the keys that move in a list move in the list."""

    BINDINGS = [Binding(key, f"screen.move('{action}')", show=False) for key, action in (
        ("up", "cursor_up"), ("down", "cursor_down"), ("pageup", "page_up"), ("pagedown", "page_down"),
        ("home", "scroll_top"), ("end", "scroll_bottom"))]


class ChatList(ModalScreen[int | None]):
    BINDINGS = [Binding("escape", "close", "Close"), Binding("r,f2", "rename", "Rename"),
                Binding("d,delete", "delete", "Delete"), Binding("ctrl+d", "delete", "Delete", priority=True),
                Binding("y", "confirm", "Yes", show=False)]

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.chats: list[ChatInfo] = []  # row order
        self.more = False  # the store holds more rows than the list has fetched
        self._filter_timer: Timer | None = None  # a filter typed, not yet run
        self._width = 0  # the title column's, as drawn
        self._deleting: int | None = None  # asked to delete this one; y confirms

    def compose(self):
        with Vertical(id="chats") as box:
            box.border_title = "Chats"
            box.border_subtitle = HINT
            yield FilterInput(id="filter", placeholder="type to filter: a title or any text of a chat")
            yield ChatTable(cursor_type="row", zebra_stripes=True)
            yield Input(id="rename", placeholder="a title (empty: its first message)")
            yield Static("", id="chats-note", markup=False)

    def on_mount(self) -> None:
        self.refill()
        self.query_one("#filter").focus()

    def action_move(self, action: str) -> None:
        self.settle()
        getattr(self.query_one(DataTable), f"action_{action}")()

    @on(Input.Changed, "#filter")
    def filtered(self) -> None:
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self._filter_timer = self.set_timer(DEBOUNCE_S, self.settle)

    @property
    def filtering(self) -> bool:
        """A filter was typed that has not run yet."""
        return self._filter_timer is not None

    def settle(self) -> None:
        """Run the filter typed, if it has not run yet."""
        if self._filter_timer is not None:
            self._filter_timer.stop()
            self._filter_timer = None
            self.refill()

    @on(Input.Submitted, "#filter")
    def filter_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.settle()
        self.open()

    def on_resize(self) -> None:
        if self.title_width == self._width:  # as drawn (the first resize comes with the mount)
            return
        row = self.query_one(DataTable).cursor_row
        self.refill(len(self.chats))
        self.query_one(DataTable).move_cursor(row=row)

    @property
    def title_width(self) -> int:
        return max(10, min(BOX, self.app.size.width) - OTHERS)

    def refill(self, rows: int = PAGE) -> None:
        """The list from its first row again: at least `rows` of them (a page or more)."""
        table, self._width = self.query_one(DataTable), self.title_width
        table.clear(columns=True)
        for label, cells in (("", 1), ("title", self._width), ("when", 16), ("model", MODEL), ("msgs", 5)):
            table.add_column(label, width=cells)
        self.chats, self.more = [], False
        self.fetch(max(rows, PAGE))
        matching = self.query_one("#filter", Input).value
        if self.chats:
            self.note("")
        else:
            self.note(f"No saved chat holds “{matching}”." if matching else
                      "No saved chats yet: the first message of a chat saves it.")

    def fetch(self, rows: int = PAGE) -> None:
        """The next `rows` rows at the end of the list (one query, LIMIT rows + 1: the one more
        says whether there are more)."""
        table, width = self.query_one(DataTable), self.title_width
        try:
            chats = self.store.chats(self.query_one("#filter", Input).value, rows + 1, len(self.chats))
        except StoreError as e:
            self.notify(printable(str(e)), severity="error", markup=False)
            chats = []
        self.more, chats = len(chats) > rows, chats[:rows]
        self.chats += chats
        for c in chats:
            title = plain(c.title)
            title.truncate(width, overflow="ellipsis")  # in cells: a wide character counts two
            table.add_row("▶" if c.here else "", title, when(c.updated), plain(shorten(c.model, MODEL)),
                          str(c.n_messages), key=str(c.id))

    @on(DataTable.RowHighlighted)
    def highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.more and event.cursor_row >= len(self.chats) - 1:  # the last row fetched: the next page
            self.fetch()

    def note(self, text: str) -> None:
        self.query_one("#chats-note", Static).update(plain(text))

    @property
    def picked(self) -> ChatInfo | None:
        row = self.query_one(DataTable).cursor_row
        return self.chats[row] if 0 <= row < len(self.chats) else None

    @property
    def current(self) -> int | None:
        return None if self.picked is None else self.picked.id

    @on(DataTable.RowSelected)
    def open(self) -> None:
        self.settle()
        if self.current is not None:
            self.dismiss(self.current)

    def action_close(self) -> None:
        rename = self.query_one("#rename", Input)
        if rename.display:  # Esc leaves the rename, not the list
            rename.display = False
            self.query_one("#filter").focus()
            return
        self.dismiss(None)

    def action_rename(self) -> None:
        self.settle()
        if self.picked is None:
            return
        rename = self.query_one("#rename", Input)
        rename.value = printable(self.picked.title)
        rename.display = True
        rename.focus()

    @on(Input.Submitted, "#rename")
    def renamed(self, event: Input.Submitted) -> None:
        event.stop()
        chat, row = self.picked, self.query_one(DataTable).cursor_row
        event.input.display = False
        title = event.value
        if chat is not None and title == printable(chat.title):  # unchanged: kept as stored, controls and all
            title = chat.title
        if chat is not None and self._change(self.store.rename, chat.id, title):
            self.refill(len(self.chats))
            self.query_one(DataTable).move_cursor(row=row)
        self.query_one("#filter").focus()

    def action_delete(self) -> None:
        self.settle()
        if self.picked is not None:
            self._deleting = self.picked.id
            self.query_one(DataTable).focus()  # y answers (the filter would take it as text)
            self.note(f"Delete “{self.picked.title}”? y deletes it, any other key keeps it.")

    def action_confirm(self) -> None:
        cid, self._deleting = self._deleting, None
        if cid is not None and self._change(self.store.delete, cid):
            self.refill(len(self.chats))
            self.note("Deleted.")
        self.query_one("#filter").focus()

    def on_key(self, event) -> None:
        if self._deleting is not None and event.key != "y":
            self._deleting = None
            self.note("")
            self.query_one("#filter").focus()

    def _change(self, change, *args) -> bool:
        try:
            change(*args)
        except (StoreError, ValueError) as e:
            self.notify(printable(str(e)), severity="error", markup=False)
            return False
        return True
