"""Edit and resend, the app's Editor: Up in an empty prompt loads the chat's last user message
for editing (chat_app.widgets.prompt_input), and Enter replaces that turn and its reply.

Contract:
- What Up edits (`last_message`) is the open chat's last user message as the store holds it
  (None where it has none: Up then walks the earlier prompts, as it always did).
- An edit sent (`send_edit`) is refused like a message, its text staying in the prompt as an
  edit, while a reply runs or the model loads. One whose message is no longer the chat's last
  (Ctrl+N, another chat opened since Up) is not an edit any more: a notice says so and its
  text stays, for Enter to send as a new message. Otherwise it is the session job `edit`
  (tinyllm.session.session_protocol): the model sees what it would have seen had the edited text been
  sent instead, so a greedy reply is a fresh chat's.
- The screen changes only once the new reply has begun (`turn_replaced`, which the Drawer
  calls at Started): the old
  message and its reply leave the conversation, the edit takes their place (its border says
  "edited"), and the store keeps the old turn, marked replaced (chat_app.store). An edit
  refused before it began comes back into the prompt, still an edit (`edit_refused`).
- `/edits` shows the turns edits replaced, as a note (never saved, never seen by the model);
  /export writes them whole, marked "(replaced by an edit)". A resumed chat shows only the
  turns that stand, an edit marked as such.
This module never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chat_app.labels import printable
from chat_app.store import Saved

if TYPE_CHECKING:
    from chat_app.app import ChatApp
    from chat_app.widgets.conversation import UserMessage
    from chat_app.widgets.prompt_input import PromptInput

EDITED = "edited · /edits shows the earlier version"  # the border of a message that replaced another


class Editor:
    def __init__(self, app: ChatApp) -> None:
        self.app = app

    def last_message(self) -> str | None:
        """The chat's last user message, as the prompt edits it; None: it has none."""
        said = [m for m in self.app.store.messages() if m.role == "user"]
        return printable(said[-1].content) if said else None

    def send_edit(self, event: PromptInput.Submitted) -> None:
        """Enter on an edit: the session's `edit` job, or a refusal that keeps the text."""
        app = self.app
        if self.last_message() != event.replaces:
            app.prompt.end_edit()
            app.say("The message you were editing is no longer the chat's last one: Enter sends your text "
                    "as a new message.", "warning")
        elif app.busy:
            app.say("A reply is still running: wait for it, then press Enter to replace your message "
                    "(Esc cancels the edit).", "warning")
        elif app.ready_for_reply():  # the model loaded, no reply running (as for a message)
            app.accept(event)
            app.drawer.begin("edit", event.text)

    async def turn_replaced(self, text: str) -> UserMessage:
        """The edit's reply has begun: the edit in place of the old turn, on screen and in the
        store (which keeps the old turn, marked replaced)."""
        app = self.app
        await app.conversation.drop_last_turn()
        app.save(app.store.replace_last_turn)
        widget = await app.conversation.add_user(text)
        widget.border_subtitle = EDITED
        app.save(app.store.add, Saved("user", text))
        return widget

    def edit_refused(self, text: str) -> None:
        """The edit was refused before its reply began (too long, say): back into the prompt,
        still an edit (unless something was typed there since: then as give_back puts it)."""
        prompt, last = self.app.prompt, self.last_message()
        if last is None or prompt.text.strip():
            prompt.give_back(text)
        else:
            prompt.edit_message(last, text)

    def show_edits(self) -> None:
        """/edits: the turns edits replaced, as a note."""
        app = self.app
        old = app.store.replaced()
        if not old:
            app.note("No edits in this chat. Up in an empty prompt edits your last message.")
            return
        lines = [f"Replaced by edits ({sum(m.role == 'user' for m in old)}), oldest first; "
                 "/export writes them whole:"]
        for m in old:
            if m.role == "user":
                lines.append(f"you: {m.content}")
            else:
                lines.append(f"  {m.model or app.store.chat_model}: {first_line(m.content)}")
        app.note("\n".join(lines))


def first_line(text: str, width: int = 80) -> str:
    """A reply in a line of /edits: its first line, at most `width` characters, and its length."""
    line = text.strip().split("\n", 1)[0]
    if not line:
        return "(no reply)"
    if line == text.strip() and len(line) <= width:
        return line
    return f"{line[:width - 1].rstrip()}… ({len(text):,} characters)"
