"""Going back to saved chats: `--resume`, the chat list (Ctrl+O, /chats; the palette too), and
showing a saved chat; the app's ChatSwitcher.

Contract: opening a chat stops the reply that runs (its text is saved first, into the chat it
belongs to) and then, in order on the worker: the store opens the chosen conversation (a
barrier job "open", so every write of the old chat lands before), its own model is opened
where another is open (chat_app.model_switch), the screen shows it (chat_app.showing) (each
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

from chat_app.jobs import OpenChat, Params
from chat_app.showing import load_session, show_messages
from chat_app.store import Resumed, Saved, StoreError
from chat_app.worker import THINKING
from tinyllm.decode.sampling_params import SamplingParams

if TYPE_CHECKING:
    from chat_app.core import ChatCore
    from chat_app.model_switch import ModelSwitcher


class ChatSwitcher:
    def __init__(self, core: ChatCore, models: ModelSwitcher) -> None:
        self.core, self.models = core, models

    def show_list(self) -> None:
        self.core.view.show_chat_list(self.core.store, self.chosen)

    def chosen(self, cid: int | None) -> None:
        """A chat picked (the chat list, the palette): open it; None: nothing to open."""
        core = self.core
        if core.store.conversation is None and core.session is not None and core.session.messages:
            core.new_chat()  # the open chat was deleted from the list
        if cid is None or cid == core.store.conversation:
            return
        if core.session is None:
            core.say("The model is still loading (or failed to load).", "warning")
            return
        core.stop_reply()
        core.queue(OpenChat(cid))

    async def open_chat(self, cid: int) -> None:
        """The worker reached the OpenChat barrier: switch the store, the screen, the session."""
        core = self.core
        try:
            saved = core.store.open_chat(cid)
        except (StoreError, ValueError) as e:
            core.say(f"could not open that chat: {e}", "error")
            return
        finally:
            core.saver.notices()
        await core.view.conversation.clear()
        self.models.reopen_chat_model()  # first: the chat's messages then load into its model
        await self.show_saved(saved)
        core.view.status.show(tok_s=None, ttft_ms=None, window=None)  # the last reply's numbers were another chat's
        core.say(f"Opened a saved chat ({sum(m.role != 'system' for m in saved)} messages).")

    async def resume_last_chat(self, resumed: Resumed) -> None:
        """Show what --resume found: main() opened the chat in the store, and its model."""
        core = self.core
        saved, held = resumed.saved, resumed.held
        core.saver.notices()
        if resumed.error:
            core.saver.failed(resumed.error)
            return
        if resumed.notice:
            core.say(resumed.notice, "warning")
        if held:
            core.say("The last chat is open in another tinyllm-chat; "
                     + ("this is the one before it." if saved else "this is a new one."), "warning")
        if not saved:
            if not held:
                core.say("No saved chat to resume; this is a new one.")
            return
        await self.show_saved(saved)
        core.say(f"Resumed the last chat ({sum(m.role != 'system' for m in saved)} messages).")

    async def show_saved(self, saved: list[Saved]) -> None:
        """Show a chat the store just opened and load it into the session (by jobs, in order)."""
        core = self.core
        store = core.store
        if store.skipped:
            core.say(f"Skipped {store.skipped} unreadable message(s) of this chat (not text in chat.db); "
                     "the rest are here.", "warning")
        await show_messages(core, saved)
        load_session(core, store.messages())
        for name, value in store.settings.items():
            if name == THINKING and value in ("on", "off"):  # the template's switch (chat_app.worker)
                continue
            try:
                SamplingParams().with_value(name, value)  # what /set checks
            except ValueError as e:
                core.say(f"Skipped a setting saved with this chat: {e}", "warning")
                core.save(store.drop_setting, name)
        core.queue(Params(store.settings))
