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
from the filter, `r` and `d` do the same). A chat another instance holds
is refused with a notice; every store failure is a notice, never an exception. Titles, first
messages and model names are shown as plain text, control characters visible (chat_app.labels).
"""

from __future__ import annotations

import time

from textual import on
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
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
        getattr(self.query_one(DataTable), f"action_{action}")()

    @on(Input.Changed, "#filter")
    def filtered(self) -> None:
        self.refill()

    @on(Input.Submitted, "#filter")
    def filter_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.open()

    def on_resize(self) -> None:
        row = self.query_one(DataTable).cursor_row
        self.refill()
        self.query_one(DataTable).move_cursor(row=row)

    @property
    def title_width(self) -> int:
        return max(10, min(BOX, self.app.size.width) - OTHERS)

    def refill(self) -> None:
        table, width = self.query_one(DataTable), self.title_width
        table.clear(columns=True)
        for label, cells in (("", 1), ("title", width), ("when", 16), ("model", MODEL), ("msgs", 5)):
            table.add_column(label, width=cells)
        try:
            chats = self.store.chats(self.query_one("#filter", Input).value)
        except StoreError as e:
            self.notify(printable(str(e)), severity="error", markup=False)
            chats = []
        self.chats = chats
        for c in chats:
            title = plain(c.title)
            title.truncate(width, overflow="ellipsis")  # in cells: a wide character counts two
            table.add_row("▶" if c.here else "", title, when(c.updated), plain(shorten(c.model, MODEL)),
                          str(c.n_messages), key=str(c.id))
        matching = self.query_one("#filter", Input).value
        if chats:
            self.note("")
        else:
            self.note(f"No saved chat holds “{matching}”." if matching else
                      "No saved chats yet: the first message of a chat saves it.")

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
            self.refill()
            self.query_one(DataTable).move_cursor(row=row)
        self.query_one("#filter").focus()

    def action_delete(self) -> None:
        if self.picked is not None:
            self._deleting = self.picked.id
            self.query_one(DataTable).focus()  # y answers (the filter would take it as text)
            self.note(f"Delete “{self.picked.title}”? y deletes it, any other key keeps it.")

    def action_confirm(self) -> None:
        cid, self._deleting = self._deleting, None
        if cid is not None and self._change(self.store.delete, cid):
            self.refill()
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
