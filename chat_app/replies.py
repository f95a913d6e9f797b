"""Replies: a message sent, and the reply that streams back, from Enter to its last token.

Contract: the turn (chat_app.turn) moves here. A message sent is saved to the chat before
anything else happens to it (`ask()`, before it is shown or the model is asked: killed right
after Enter, --resume still shows it), shown at once (`send()`; the status bar says
"prefilling" while its prompt is read) and taken back into the input, and out of the chat, if
the session refuses it. A reply replaces what is on screen only once it has begun
(`started()`, at the worker's Started), so a send, an edit or a regenerate that fails before
that changes nothing. Its text is written as it comes (`write()`: the pieces of one batch,
one Markdown update); it is saved as partial at its first text and then at least every
SAVE_EVERY_S (`tick()`), and whole (stopped or not) at its Finished. A failed reply keeps
what streamed, marked; a refused message goes back to the input. Esc before the reply began
stops it again at its Prefilled. Ctrl+R (`regenerate()`) and Ctrl+F (`continue_reply()`) are
asked for here too. Imports neither Textual nor torch.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from chat_app.core import ENDED
from chat_app.jobs import ContinueReply, Edit, Regenerate, Reply, Send, SetSystem
from chat_app.showing import mark
from chat_app.store import Saved
from chat_app.turn import TurnState

if TYPE_CHECKING:
    from chat_app.core import ChatCore
    from chat_app.editing import Editor
    from chat_app.events import Failed, Finished, Prefilled, Started

SAVE_EVERY_S = 1.0  # a streaming reply is written to the store at least this often


class Replies:
    def __init__(self, core: ChatCore, editor: Editor) -> None:
        self.core, self.editor = core, editor
        self._regen_told: object = None  # the store's chat that Ctrl+R's greedy notice was shown for

    # ---- asking ---------------------------------------------------------------------------

    def ask(self, text: str) -> Saved:
        """Save a message being sent to the open chat, first of all (before the input gives it
        up, before it is shown or the model is asked). Killed 50 ms after Enter, the message was
        only in the prompt history, and --resume showed nothing (issue 52): it was saved when its
        reply began. Its reply's Started finds the row; a refusal takes it back (`Store.drop`)."""
        core = self.core
        core.turn.asked = Saved("user", text)
        core.save(core.store.add, core.turn.asked)
        return core.turn.asked

    def take_back(self) -> None:
        """The message `ask()` saved was not sent after all (the session refused it, or no model
        loaded): out of the chat again, as it goes back into the input."""
        asked, self.core.turn.asked = self.core.turn.asked, None
        if asked is not None:
            self.core.save(self.core.store.drop, asked)

    async def send(self, text: str) -> None:
        """Send a message (saved by `ask()` first): shown at once, before its reply begins (a
        prompt of thousands of tokens is read for seconds, which showed nothing before,
        2026-12-06), taken back from the conversation if the session refuses it. Busy, and said
        so on the status bar, before the message is drawn: no frame shows the message under "ready"."""
        core = self.core
        core.turn.move(TurnState.PREFILLING)
        core.view.status.show(state="prefilling")
        core.turn.shown = await core.view.conversation.add_user(text, saved=core.turn.asked)
        core.begin(Send(text))

    def regenerate(self) -> None:
        """Ctrl+R: the last reply written again, as a new sample (SamplingParams.regenerating: a
        fresh seed; a greedy chat samples at regen_temperature, and says so once per chat). The
        chat's settings stay for its next message. A last user turn with no reply (a resumed
        chat) gets its reply with the chat's own settings."""
        core = self.core
        core.saver.user_acted()
        if not core.ready_for_reply():
            return
        s = core.session
        assert s is not None
        if not (s.messages and s.messages[-1].role == "assistant"):
            core.begin(Regenerate())
            return
        core.begin(Regenerate(s.params.regenerating(secrets.randbits(63))))
        if s.params.greedy and self._regen_told is not core.store.chat:
            self._regen_told = core.store.chat  # once per chat (Ctrl+N and opening a chat make another)
            t = s.params.regen_temperature
            core.say(f"The chat is greedy: Ctrl+R samples at temperature {t}; /set regen_temperature to change."
                     if t else "The chat is greedy and regen_temperature is 0: Ctrl+R writes the same reply "
                     "again; /set regen_temperature 0.8 to sample a new one.")

    def continue_reply(self) -> None:
        core = self.core
        core.saver.user_acted()
        if core.session is not None and not (core.session.messages and core.session.messages[-1].role == "assistant"):
            core.say("No reply to continue yet.", "warning")
        elif core.ready_for_reply():
            core.begin(ContinueReply())

    # ---- the reply streaming ----------------------------------------------------------------

    def save_partial(self) -> None:
        """Write the streaming reply's text so far to the store (marked partial)."""
        turn = self.core.turn
        if turn.row is not None:
            turn.saved_at = time.monotonic()
            self.core.save(self.core.store.update, turn.row, "".join(turn.text), partial=True)

    async def write(self, pieces: list[str]) -> None:
        turn = self.core.turn
        if pieces and turn.reply is not None:
            text = "".join(pieces)
            await turn.reply.write(text)
            turn.text.append(text)
            if turn.saved_at == 0.0:  # the reply's first text is saved at once
                self.save_partial()

    def tick(self) -> None:
        """After each batch: a streaming reply unsaved for SAVE_EVERY_S is saved."""
        turn = self.core.turn
        if turn.row is not None and time.monotonic() - turn.saved_at >= SAVE_EVERY_S:
            self.save_partial()

    async def started(self, item: Started) -> None:
        core = self.core
        turn, conversation, store = core.turn, core.view.conversation, core.store
        if turn.state is TurnState.PREFILLING:
            turn.move(TurnState.STREAMING)
        job = item.job
        if isinstance(job, Regenerate):  # the old reply stays, another version (chat_app.versions)
            await conversation.drop_last_reply()
            last = [m for m in store.messages() if m.role != "system"][-1:]
            if last and last[0].role == "assistant":
                core.save(store.branch, last[0])
        elif isinstance(job, Edit):  # the edit takes the place of the last turn (chat_app.editing)
            await self.editor.turn_replaced(job.text)
        elif isinstance(job, ContinueReply):  # the last reply goes on: same widget, same row
            turn.reply = conversation.last_reply()
            turn.reply.resume()
            turn.row = [m for m in store.messages() if m.role == "assistant"][-1]
            turn.text, turn.saved_at = [turn.row.content], 0.0
            core.view.status.show(state="generating")
            return
        elif isinstance(job, Send):
            shown, turn.shown = turn.shown, None  # shown when it was sent (or while the model loaded)
            asked, turn.asked = turn.asked, None  # saved when it was sent (ask())
            if asked is None or asked.content != job.text or store.messages()[-1:] != [asked]:
                asked = Saved("user", job.text)  # the chat changed since (Ctrl+N while the model loaded)
                core.save(store.add, asked)
            if shown is None or not shown.is_attached:
                shown = await conversation.add_user(job.text)
            shown.saved = asked
        turn.row, turn.text, turn.saved_at = Saved("assistant", "", partial=True, model=core.model_name), [], 0.0
        core.save(store.add, turn.row)
        turn.reply = await conversation.add_reply(core.model_name, saved=turn.row)
        mark(turn.reply, store, turn.row)
        core.view.status.show(state="generating")

    def prefilled(self, item: Prefilled) -> None:
        core = self.core
        core.prefill_tokens = item.n_tokens
        if core.turn.state is TurnState.STOPPING and core.session is not None:  # Esc came before the reply began
            core.session.stop()
        if item.dropped:
            core.say(f"Context full: the oldest {item.dropped} messages no longer reach the model "
                     "(they stay on screen and in the saved chat).", "warning")

    async def finished(self, item: Finished) -> None:
        core = self.core
        turn = core.turn
        if turn.reply is not None:
            await turn.reply.finish(item.reason)
        row = turn.row
        turn.end()
        if row is not None:
            core.save(core.store.update, row, item.text, partial=False, stopped=item.reason == "stopped")
        core.show_stats(item.stats, "ready")
        if item.reason == "repeating":
            core.say("The reply was saying the same thing again and again: it was stopped there. Ctrl+F "
                     "continues it; /set repeat_stop off turns this off.", "warning")
        if item.reason == "context_full":
            core.say(f"The reply filled the context ({item.stats.max_len} positions); "
                     "the next turn drops the oldest messages.", "warning")

    async def failed(self, item: Failed) -> None:
        """A job failed: said (a note for /system's, the command's answer); a reply's keeps what
        streamed, marked, or its message goes back to the input."""
        core = self.core
        ended = core.ended()  # a reply cut short by it, or a job refused after it: said once, with what comes next
        said = core.note if isinstance(item.job, SetSystem) else core.say
        said(f"{item.message}; the next message starts it again" if ended else item.message, "error")
        if not isinstance(item.job, Reply):
            return
        turn = core.turn
        if turn.reply is not None:  # it failed mid-reply: keep what streamed, marked
            await turn.reply.finish("error")
            if turn.row is not None:
                core.save(core.store.update, turn.row, "".join(turn.text), partial=False, stopped=True)
        elif isinstance(item.job, Send):
            self.take_back()  # saved when it was sent: out of the chat, back into the input
            shown, turn.shown = turn.shown, None
            if shown is not None and shown.is_attached:
                await shown.remove()
            core.view.prompt.give_back(item.job.text)  # refused before it was shown (or while it waited)
        elif isinstance(item.job, Edit):
            self.editor.edit_refused(item.job.text)
        turn.end()
        core.view.status.show(state=ENDED if ended else "ready")
