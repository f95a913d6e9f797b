"""AttachmentBar: the chips above the input, one per file (or big paste) the next message carries.

Contract: the prompt (chat_app.widgets.prompt_input) owns the attachments and mounts this bar
just above itself; `show(attachments)` draws them, each as a chip: its name, its size in tokens
(an estimate, "~N tokens": chat_app.attachments.estimate) and a "×" that, clicked, calls
`remove(index)` (the prompt's: Backspace at the input's start removes the last one too). With
none it is not displayed, so it takes no row. Names are plain text, never markup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual.content import Content
from textual.style import Style
from textual.widgets import Static

from chat_app.attachments import Attachment
from chat_app.labels import printable

HINT = "click × or Backspace at the start of the input to remove"


class AttachmentBar(Static):
    DEFAULT_CSS = """
    AttachmentBar {
        display: none;
        height: auto;
        max-height: 4;
        padding: 0 1;
        color: $text-muted;
    }
    AttachmentBar.-shown {
        display: block;
    }
    """

    def __init__(self, remove: Callable[[int], None]) -> None:
        super().__init__("", markup=False)
        self._remove = remove
        self.chips: list[str] = []  # what each chip says (the tests read it)

    def show(self, attachments: Sequence[Attachment]) -> None:
        self.chips = [f"{printable(a.name)} · ~{a.tokens:,} token{'s' * (a.tokens != 1)}" for a in attachments]
        parts: list[str | Content | tuple[str, str | Style]] = []
        for i, chip in enumerate(self.chips):
            parts += [(f" {chip} ", "reverse"), (" × ", Style.from_meta({"@click": f"remove({i})"}) + Style(bold=True)),
                      " "]
        if attachments:
            total = sum(a.tokens for a in attachments)
            parts.append((f"(~{total:,} tokens in all; {HINT})" if len(attachments) > 1 else f"({HINT})", "dim"))
        self.update(Content.assemble(*parts))
        self.set_class(bool(attachments), "-shown")

    def action_remove(self, index: int) -> None:
        self._remove(index)
