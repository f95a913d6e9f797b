"""LoadProgress: one line above the status bar while a model opens.

`start(name)` shows it: "Opening NAME…" and a bar that pulses until the model's loader reports
(the child process imports torch first). `advance(done, total)` makes the bar determinate:
tensors read of all. `finish()` hides it; the bar keeps its last numbers (tests read them).
The name is shown as plain text, its control characters visible (chat_app.labels).
"""

from __future__ import annotations

from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from chat_app.labels import plain


class LoadProgress(Horizontal):
    DEFAULT_CSS = """
    LoadProgress {
        height: 1;
        padding: 0 1;
        display: none;
    }
    LoadProgress Label {
        width: auto;
        max-width: 60%;
        margin-right: 2;
    }
    """

    def __init__(self) -> None:
        super().__init__()
        self.name_shown = ""
        self.label = Label("")
        self.bar = ProgressBar(total=None, show_eta=False)

    def compose(self):
        yield self.label
        yield self.bar

    def start(self, name: str) -> None:
        self.name_shown = name
        self.label.update(plain(f"Opening {name}…"))
        self.bar.update(total=None, progress=0)
        self.display = True

    def advance(self, done: int, total: int) -> None:
        self.label.update(plain(f"Loading {self.name_shown}: {done:,}/{total:,} tensors"))
        self.bar.update(total=total, progress=done)

    def finish(self) -> None:
        self.display = False
