"""Keys for reading and copying (the app's bindings and handlers call these).

Contract: PgUp/PgDn (and Home/End while the input is empty) scroll the conversation from the
input; Tab moves focus to the conversation (unless it completes a /command in the input:
chat_app.widgets.prompt_input), where messages and code blocks are picked and copied
(chat_app.widgets.conversation). Ctrl+T copies the last reply from anywhere. Ctrl+C
copies what is selected (the input's selection, or text selected with the mouse), else what
is picked in the conversation; with nothing to copy it says how to copy and never offers to
quit (Ctrl+Q quits). Copying goes through `copy` (the app's copy_to_clipboard, OSC 52: SSH
and tmux too).
"""

from __future__ import annotations

from collections.abc import Callable

from chat_app.widgets.conversation import Conversation, lines
from chat_app.widgets.reply import Reply

READING_KEYS = [
    ("PgUp / PgDn", "scroll the conversation (Home / End too, while the input is empty)"),
    ("Tab (in a /command)", "complete the command and its argument; again: the next choice"),
    ("Tab / Shift+Tab", "focus the conversation / the input"),
    ("Up / Down (conversation)", "pick a message or one code block; Home / End: the first / last"),
    ("C or Enter (conversation)", "copy what is picked (OSC 52: works over SSH and in tmux)"),
    ("Left / Right (conversation)", "the picked message's earlier / later version"),
]


def scroll(conversation: Conversation, key: str) -> None:
    """PgUp/PgDn/Home/End from the input: the conversation scrolls."""
    c = conversation
    {"pageup": c.scroll_page_up, "pagedown": c.scroll_page_down,
     "home": c.scroll_home, "end": c.scroll_end}[key](animate=False)


def copy_reply(conversation: Conversation, copy: Callable[[str], None], say: Callable[[str], None]) -> None:
    replies = conversation.query(Reply)
    text = replies.last().text if replies else ""
    if not text:
        say("No reply to copy yet.")
        return
    copy(text)
    say(f"Copied the last reply ({lines(text)}).")


def copy_or_hint(conversation: Conversation, say: Callable[[str], None]) -> None:
    """Ctrl+C that nothing selected took (Textual's default offers to quit here)."""
    if conversation.picked_text() is not None:
        conversation.action_copy_picked()
    else:
        say("Nothing selected to copy: Ctrl+T copies the last reply; Tab, then Up/Down and C "
            "copy a message or code block. Ctrl+Q quits.")
