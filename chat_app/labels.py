"""Labels: text that did not come from this code, put on the screen as it is.

Contract: model names (a GGUF's general.name, config.json's "name"), chat titles and first
messages, system prompts, file names, what a user typed and a notice echoes, and a model's
reply go into the UI as plain text, never as markup (`[/b]` and `[bold]` show as typed and
cannot raise MarkupError), with every control character made visible: C0 controls (but tab
and newline) and DEL become their Unicode "control pictures" (ESC is "␛", so `\\e]52;...`
shows as "␛]52;..." and never reaches the terminal as an escape sequence: no title, no
clipboard, no cleared screen), C1 controls become U+FFFD.
- `printable(text) -> str`: the text with its control characters made visible. For strings
  that are shown with markup off already (a notice: `notify(..., markup=False)`, Markdown).
- `plain(text) -> Text`: that as a Rich Text, which no widget parses as markup: for border
  titles, table cells, Static and Label updates.
Text this code writes itself (bindings, hints, help) does not need them. What the app writes to a
file goes through `printable` too: the Markdown of `/export` and of an unsaved-*.md
(chat_app.history.markdown).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

# C0 controls (but tab and newline) and DEL become their Unicode "control pictures".
_VISIBLE = {c: 0x2400 + c for c in range(32) if chr(c) not in "\t\n"} | {0x7F: 0x2421}
_VISIBLE |= {c: 0xFFFD for c in range(0x80, 0xA0)}


def printable(text: str) -> str:
    return text.translate(_VISIBLE)


def plain(text: str) -> Text:
    from rich.text import Text  # here, not above: `tinyllm-chat -p` and the store need no rich (0.05 s)

    return Text(printable(text))
