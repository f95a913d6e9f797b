"""HelpScreen: every key and every slash command, in one modal table (F1 or /help).

The rows come from the app (its bindings and command table), so the help cannot drift from
what the app does. Esc, F1 or q closes it.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close help")]

    def __init__(self, keys: list[tuple[str, str]], commands: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys, self.commands = keys, commands

    def compose(self):
        rows = ["# tinyllm-chat help", "", "| key | does |", "|---|---|"]
        rows += [f"| {key} | {does} |" for key, does in self.keys]
        rows += ["", "| command | does |", "|---|---|"]
        rows += [f"| `{cmd}` | {does} |" for cmd, does in self.commands]
        rows += ["", "Esc, F1 or q closes this help."]
        with VerticalScroll(id="help"):
            yield Markdown("\n".join(rows))
