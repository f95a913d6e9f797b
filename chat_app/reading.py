"""Keys for reading and copying, as a mixin of ChatApp.

Contract: PgUp/PgDn (and Home/End while the input is empty) scroll the conversation from the
input; Tab moves focus to the conversation, where messages and code blocks are picked and
copied (chat_app.widgets.conversation). Ctrl+T copies the last reply from anywhere. Ctrl+C
copies what is selected (the input's selection, or text selected with the mouse), else what
is picked in the conversation; with nothing to copy it says how to copy and never offers to
quit (Ctrl+Q quits). Copying goes through `copy_to_clipboard` (OSC 52: SSH and tmux too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chat_app.widgets.conversation import lines
from chat_app.widgets.prompt_input import PromptInput
from chat_app.widgets.reply import Reply

if TYPE_CHECKING:
    from chat_app.app import ChatApp

READING_KEYS = [
    ("PgUp / PgDn", "scroll the conversation (Home / End too, while the input is empty)"),
    ("Tab / Shift+Tab", "focus the conversation / the input"),
    ("Up / Down (conversation)", "pick a message or one code block; Home / End: the first / last"),
    ("C or Enter (conversation)", "copy what is picked (OSC 52: works over SSH and in tmux)"),
]


class Reading:
    def on_prompt_input_scrolled(self: ChatApp, event: PromptInput.Scrolled) -> None:
        c = self.conversation
        {"pageup": c.scroll_page_up, "pagedown": c.scroll_page_down,
         "home": c.scroll_home, "end": c.scroll_end}[event.key](animate=False)

    def action_copy_reply(self: ChatApp) -> None:
        replies = self.query(Reply)
        text = replies.last().text if replies else ""
        if not text:
            self.say("No reply to copy yet.")
            return
        self.copy_to_clipboard(text)
        self.say(f"Copied the last reply ({lines(text)}).")

    def action_help_quit(self: ChatApp) -> None:
        """Ctrl+C that nothing selected took (Textual's default offers to quit here)."""
        if self.conversation.picked_text() is not None:
            self.conversation.action_copy_picked()
        else:
            self.say("Nothing selected to copy: Ctrl+T copies the last reply; Tab, then Up/Down and C "
                     "copy a message or code block. Ctrl+Q quits.")
