"""The jobs the app gives the session's worker (chat_app.worker), one dataclass each.

Contract: a job is a frozen dataclass that says what it asks for; the worker runs them in
order. `Reply` jobs stream a reply (`run(session)` returns the session's events: Send, Edit,
Regenerate, ContinueReply); `Task` jobs return nothing (`run(session)`: NewChat, SetSystem,
LoadMessages). The worker's own (they need its state, not only the session's): `Params` (a
chat's /set values over the launch's), `OpenChat` (a barrier: every job queued before it
has run when the app opens the chat), `Restart` (a new model process in place of one that
ended, loaded with `messages`) and `SwitchModel` (another model, opened beside the old one).
Each job's events (chat_app.events) carry the job itself, so whoever handles them reads its
fields, never a name and an untyped argument. Imports neither torch nor Textual.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tinyllm.decode.sampling_params import SamplingParams
    from tinyllm.session.session_protocol import Event, ModelProcess

Pairs = list[tuple[str, str]]  # (role, text) of a conversation, its system prompt first


@dataclass(frozen=True)
class Job:
    """Any job."""


@dataclass(frozen=True)
class Reply(Job):
    """A job that streams a reply."""

    def run(self, session: ModelProcess) -> Iterator[Event]:
        raise NotImplementedError


@dataclass(frozen=True)
class Send(Reply):
    text: str

    def run(self, session: ModelProcess) -> Iterator[Event]:
        return session.send(self.text)


@dataclass(frozen=True)
class Edit(Reply):  # the last user message replaced by `text` (chat_app.editing)
    text: str

    def run(self, session: ModelProcess) -> Iterator[Event]:
        return session.edit(self.text)


@dataclass(frozen=True)
class Regenerate(Reply):  # params None: the chat's own (a last user turn without a reply)
    params: SamplingParams | None = None

    def run(self, session: ModelProcess) -> Iterator[Event]:
        return session.regenerate(self.params) if self.params is not None else session.regenerate()


@dataclass(frozen=True)
class ContinueReply(Reply):
    def run(self, session: ModelProcess) -> Iterator[Event]:
        return session.continue_reply()


@dataclass(frozen=True)
class Task(Job):
    """A session job that returns nothing."""

    def run(self, session: ModelProcess) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class NewChat(Task):
    def run(self, session: ModelProcess) -> None:
        session.new_chat()


@dataclass(frozen=True)
class SetSystem(Task):  # "": no system prompt
    text: str

    def run(self, session: ModelProcess) -> None:
        session.set_system(self.text)


@dataclass(frozen=True)
class LoadMessages(Task):
    messages: Pairs

    def run(self, session: ModelProcess) -> None:
        session.load_messages(self.messages)


@dataclass(frozen=True)
class Params(Job):  # a chat's /set values ("thinking" among them) over the launch's
    settings: dict[str, str]


@dataclass(frozen=True)
class OpenChat(Job):  # the barrier before a saved chat opens
    chat: int


@dataclass(frozen=True)
class Restart(Job):
    messages: Pairs


@dataclass(frozen=True)
class SwitchModel(Job):  # path: a path, an hf: spec or a server
    path: str
    system: str | None
    keep_chat: bool  # a saved chat's own model: in that chat, not a new one

