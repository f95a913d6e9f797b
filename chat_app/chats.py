"""Going back to saved chats: `--resume`, the chat list (Ctrl+O, /chats; the palette too), and
showing a saved chat; the app's ChatSwitcher.

Contract: opening a chat stops the reply that runs (its text is saved first, into the chat it
belongs to) and then, in order on the worker: the store opens the chosen conversation (a
barrier job "open", so every write of the old chat lands before), its own model is opened
where another is open (chat_app.model_switch), the screen shows it (each
reply under the model that wrote it, system prompts where they were set), the session loads
its messages and system prompt, and its /set values apply over the launch's settings (the
launch's settings come back for a chat that has none). A saved value that is not one a reply
can use (out of range, unknown: tinyllm.decode.sampling_params) is skipped with a notice and dropped
from the chat; the rest apply. A chat another instance holds, or a store that cannot be read,
is a notice and changes nothing. A message row chat.db holds that is not text (a BLOB, a
number: a file edited by hand) is skipped with a notice counting them. Deleting the open chat from the
list starts a new one. This module never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chat_app.store import Resumed, Saved, StoreError
from chat_app.widgets.chat_list import ChatList
from chat_app.worker import THINKING
from tinyllm.decode.sampling_params import SamplingParams

if TYPE_CHECKING:
    from chat_app.app import ChatApp


class ChatSwitcher:
    def __init__(self, app: ChatApp) -> None:
        self.app = app

    def show_list(self) -> None:
        self.app.push_screen(ChatList(self.app.store), self.chosen)

    def chosen(self, cid: int | None) -> None:
        """A chat picked (the chat list, the palette): open it; None: nothing to open."""
        app = self.app
        if app.store.conversation is None and app.session is not None and app.session.messages:
            app.action_new_chat()  # the open chat was deleted from the list
        if cid is None or cid == app.store.conversation:
            return
        if app.session is None:
            app.say("The model is still loading (or failed to load).", "warning")
            return
        app.action_stop()
        app.queue_job("open", cid)

    async def open_chat(self, cid: int) -> None:
        """The worker reached the "open" barrier: switch the store, the screen, the session."""
        app = self.app
        try:
            saved = app.store.open_chat(cid)
        except (StoreError, ValueError) as e:
            app.say(f"could not open that chat: {e}", "error")
            return
        finally:
            app.saver.notices()
        await app.conversation.clear()
        app.models.reopen_chat_model()  # first: the chat's messages then load into its model
        await self.show_saved(saved)
        app.status.show(tok_s=None, ttft_ms=None, window=None)  # the last reply's numbers were another chat's
        app.say(f"Opened a saved chat ({sum(m.role != 'system' for m in saved)} messages).")

    async def resume_last_chat(self, resumed: Resumed) -> None:
        """Show what --resume found: main() opened the chat in the store, and its model."""
        app = self.app
        saved, held = resumed.saved, resumed.held
        app.saver.notices()
        if resumed.error:
            app.saver.failed(resumed.error)
            return
        if resumed.notice:
            app.say(resumed.notice, "warning")
        if held:
            app.say("The last chat is open in another tinyllm-chat; "
                    + ("this is the one before it." if saved else "this is a new one."), "warning")
        if not saved:
            if not held:
                app.say("No saved chat to resume; this is a new one.")
            return
        await self.show_saved(saved)
        app.say(f"Resumed the last chat ({sum(m.role != 'system' for m in saved)} messages).")

    async def show_saved(self, saved: list[Saved]) -> None:
        """Show a chat the store just opened and load it into the session (by jobs, in order)."""
        app = self.app
        store = app.store
        if store.skipped:
            app.say(f"Skipped {store.skipped} unreadable message(s) of this chat (not text in chat.db); "
                    "the rest are here.", "warning")
        await self.show_messages(saved)
        self.load_session(store.messages())
        for name, value in store.settings.items():
            if name == THINKING and value in ("on", "off"):  # the template's switch (chat_app.worker)
                continue
            try:
                SamplingParams().with_value(name, value)  # what /set checks
            except ValueError as e:
                app.say(f"Skipped a setting saved with this chat: {e}", "warning")
                app.save(store.drop_setting, name)
        app.queue_job("params", store.settings)


    async def show_messages(self, saved: list[Saved]) -> None:
        """Show messages of the open chat's branch below what is shown (each widget holding its
        message, a message with other versions saying which it is). A branch that ends on a
        user message (its reply never began: a crash) gets an empty reply, so turns alternate."""
        app = self.app
        store, conversation = app.store, app.conversation
        said = [m for m in store.messages() if m.role != "system"]
        if said and said[-1].role == "user":
            store_reply = Saved("assistant", "", stopped=True, model=app.model_name)
            app.save(store.add, store_reply)
            saved = [*saved, store_reply]
        for m in saved:
            if m.role == "user":
                widget = await conversation.add_user(m.content, saved=m)
            elif m.role == "system":
                widget = await conversation.add_note(system_note(m.content), saved=m)
            else:
                note = "partial" if m.partial else "stopped" if m.stopped else ""
                widget = await conversation.add_reply(m.model or store.chat_model, m.content, note, saved=m)
            if m.role != "system":
                app.versions.mark(widget, m)

    def load_session(self, branch: list[Saved]) -> None:
        """The session's conversation becomes `branch` (a job, in order with the others)."""
        pairs = [("system", self.app.store.system or "")]
        self.app.queue_job("load_messages", pairs + [(m.role, m.content) for m in branch if m.role != "system"])


def system_note(text: str) -> str:
    return f"system prompt: {text}" if text else "system prompt cleared"
