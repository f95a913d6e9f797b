"""HelpScreen: every key and every slash command, in one modal table (F1 or /help).

The rows come from the app (its bindings and command table), so the help cannot drift from
what the app does; its title names the model and its family ("SmolLM2-135M (llama)"), and
`about` (a first section, "Model") says what the session holds: its context, and why it is
less than the model's own where it is.
Esc, F1 or q closes it. Two columns: a description that wraps goes on under
itself (indented), never back at the left edge under the keys.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close help")]

    def __init__(self, keys: list[tuple[str, str]], commands: list[tuple[str, str]], model: str = "",
                 about: str = "") -> None:
        super().__init__()
        self.keys, self.commands, self.model = keys, commands, model  # model: "name (family)", in the title
        self.about = about

    def compose(self):
        width = max(len(name) for name, _ in self.keys + self.commands) + 3
        with VerticalScroll(id="help") as scroll:
            scroll.border_title = "tinyllm-chat help" + (f" · {self.model}" if self.model else "")
            scroll.border_subtitle = "Esc, F1 or q closes"
            if self.about:
                yield Static("Model", classes="section", markup=False)
                yield Static(self.about, markup=False)
            for title, rows in (("Keys", self.keys), ("Commands", self.commands)):
                yield Static(title, classes="section", markup=False)
                yield Static(two_columns(rows, width))


def two_columns(rows: list[tuple[str, str]], width: int) -> Table:
    """Names in a column `width` wide (never wrapped), what they do wrapping beside them."""
    grid = Table.grid()
    grid.add_column(width=width, no_wrap=True)
    grid.add_column(ratio=1)
    for name, does in rows:
        grid.add_row(Text(name), Text(does))
    return grid
