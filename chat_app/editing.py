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
- The screen changes only once the new reply has begun (`turn_replaced`, which
  chat_app.replies calls at Started): the old message and its reply leave the conversation, the edit takes
  their place, and the store keeps the old turn as another version of it (its border says
  which: "‹ 2/2 ›"; chat_app.versions moves between them). An edit refused before it began
  comes back into the prompt, still an edit (`edit_refused`).
This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from chat_app.jobs import Edit
from chat_app.labels import printable
from chat_app.showing import mark
from chat_app.store import Saved

if TYPE_CHECKING:
    from chat_app.core import ChatCore
    from chat_app.view import ShownUser


class Editor:
    def __init__(self, core: ChatCore) -> None:
        self.core = core

    def last_message(self) -> str | None:
        """The chat's last user message, as the prompt edits it; None: it has none."""
        said = [m for m in self.core.store.messages() if m.role == "user"]
        return printable(said[-1].content) if said else None

    def send_edit(self, text: str, replaces: str, accept: Callable[[], None]) -> None:
        """Enter on an edit of `replaces`: the session's `edit` job (`accept()`: the input gives
        the text up), or a refusal that keeps the text."""
        core = self.core
        if self.last_message() != replaces:
            core.view.prompt.end_edit()
            core.say("The message you were editing is no longer the chat's last one: Enter sends your text "
                    "as a new message.", "warning")
        elif core.busy:
            core.say("A reply is still running: wait for it, then press Enter to replace your message "
                     "(Esc cancels the edit).", "warning")
        elif core.ready_for_reply():  # the model loaded, no reply running (as for a message)
            accept()
            core.begin(Edit(text))

    async def turn_replaced(self, text: str) -> ShownUser:
        """The edit's reply has begun: the edit in place of the old turn, on screen and in the
        store (which keeps the old turn as another version)."""
        core = self.core
        await core.view.conversation.drop_last_turn()
        said = [m for m in core.store.messages() if m.role == "user"]
        if said:
            core.save(core.store.branch, said[-1])
        row = Saved("user", text)
        core.save(core.store.add, row)
        widget = await core.view.conversation.add_user(text, saved=row)
        mark(widget, core.store, row)
        return widget

    def edit_refused(self, text: str) -> None:
        """The edit was refused before its reply began (too long, say): back into the prompt,
        still an edit (unless something was typed there since: then as give_back puts it)."""
        prompt, last = self.core.view.prompt, self.last_message()
        if last is None or prompt.text.strip():
            prompt.give_back(text)
        else:
            prompt.edit_message(last, text)
