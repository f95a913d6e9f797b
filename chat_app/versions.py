"""Reply versions: moving between the versions of a message, the app's VersionSwitcher.

Contract: Ctrl+R and an edit keep the reply or the turn they replace as another version of it
(chat_app.store: each message has a parent, the chat its leaf; chat_app.branches). A message
with other versions says which it is on its border ("‹ 2/3 ›", `label`). `step(message, ±1)`
shows the version before or after it: the store's branch goes through that version (and on
through its newest replies), the screen shows the new branch from there down, and the
session loads it, so the next turn continues from what is shown. Keys: Left/Right on a
picked message (the conversation), Ctrl+Left/Ctrl+Right in an empty prompt (the last reply's
versions; where it has none, your last message's). Refused with a notice while a reply runs
or the model loads; past the first or the last version a notice says so. `/edits`
(`show_versions`) lists the other versions of the branch shown, as a note. This module
never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chat_app.showing import load_session, show_messages

if TYPE_CHECKING:
    from chat_app.core import ChatCore
    from chat_app.store import Saved

KEYS = "Ctrl+Left/Right in an empty prompt, or Left/Right on a picked message"


class VersionSwitcher:
    def __init__(self, core: ChatCore) -> None:
        self.core = core

    def ready(self) -> bool:
        """No reply runs and the model is open; else a notice says so."""
        if self.core.session is None or self.core.busy:
            self.core.say("Wait for the reply (or the model) before switching versions.", "warning")
            return False
        return True

    async def step_last(self, step: int) -> None:
        """Ctrl+Left/Right in an empty prompt: the last reply's versions, else the last
        message's of yours."""
        if not self.ready():
            return
        said = [m for m in self.core.store.messages() if m.role != "system"]
        for role in ("assistant", "user"):
            last = next((m for m in reversed(said) if m.role == role), None)
            if last is not None and len(self.core.store.versions(last)) > 1:
                await self.step(last, step)
                return
        self.core.say("No other versions here: Ctrl+R writes another reply, Up in an empty prompt edits "
                     "your last message; both keep the one they replace.")

    async def step(self, message: Saved, step: int) -> None:
        """Show the version of `message` `step` away, and the branch under it."""
        core = self.core
        if not self.ready():
            return
        shown = core.store.versions(message)
        at = shown.index(message) + step
        if not 0 <= at < len(shown):
            edge = "first" if at < 0 else "last"
            core.say(f"That is the {edge} of {len(shown)} versions." if len(shown) > 1 else
                    "This message has no other versions.")
            return
        cut = core.store.messages().index(message)
        core.save(core.store.switch, shown[at])  # in memory at once; a failed write is retried (chat_app.saving)
        conversation = core.view.conversation
        widget = conversation.shown(message)
        if widget is None:  # not shown as this message (it should be): the whole chat again
            await conversation.clear()
            cut = 0
        else:
            await conversation.remove_from(widget)
        await show_messages(core, core.store.messages()[cut:])
        load_session(core, core.store.messages())
        picked = conversation.shown(shown[at])
        if picked is not None and conversation.has_focus:
            conversation.pick(picked)
        core.forget_stats()

    def show_versions(self) -> None:
        """/edits: the other versions of the branch shown, as a note."""
        core = self.core
        lines = []
        for m in core.store.messages():
            others = core.store.versions(m)
            if len(others) < 2 or m.role == "system":
                continue
            who = "you" if m.role == "user" else "reply"
            lines.append(f"{who}, {others.index(m) + 1} of {len(others)} (shown): {first_line(m.content)}")
            lines += [f"  {i}: {first_line(o.content)}" for i, o in enumerate(others, 1) if o is not m]
        if not lines:
            core.note("No other versions in this chat: Ctrl+R writes another reply, Up in an empty prompt "
                     "edits your last message; both keep the one they replace.")
            return
        core.note("\n".join([f"Versions of the messages shown ({KEYS} moves between them):"] + lines))


def first_line(text: str, width: int = 80) -> str:
    """A reply in a line of /edits: its first line, at most `width` characters, and its length."""
    line = text.strip().split("\n", 1)[0]
    if not line:
        return "(no reply)"
    if line == text.strip() and len(line) <= width:
        return line
    return f"{line[:width - 1].rstrip()}… ({len(text):,} characters)"
