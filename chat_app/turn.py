"""One turn's lifecycle: the one record of where a sent message and its reply stand.

Contract: `Turn.state` is one of `TurnState`, and only these moves happen (`Turn.move`
refuses any other with an AssertionError, a bug, never a user's doing):

    IDLE --wait--> WAITING            a message sent while the first model opens (chat_app.models)
    IDLE | WAITING --begin--> PREFILLING   a reply's job is queued; its prompt is read
    PREFILLING --started--> STREAMING      the reply has begun (its first event is next)
    PREFILLING | STREAMING --stop--> STOPPING   Esc: the session stops at its next step
    any --end--> IDLE                 the reply finished, failed or was refused; the wait ended

`busy` (a reply is asked for and has not ended) is PREFILLING, STREAMING or STOPPING. The
record also holds what the turn made: the user's row saved when it was sent (`asked`), the
message shown (`shown`), the reply's widget, row and text so far. Imports neither Textual nor
torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class TurnState(Enum):
    IDLE = "idle"
    WAITING = "waiting for the model"
    PREFILLING = "prefilling"
    STREAMING = "streaming"
    STOPPING = "stopping"


MOVES = {  # state -> the states it may move to
    TurnState.IDLE: {TurnState.WAITING, TurnState.PREFILLING, TurnState.IDLE},
    TurnState.WAITING: {TurnState.PREFILLING, TurnState.IDLE},
    TurnState.PREFILLING: {TurnState.STREAMING, TurnState.STOPPING, TurnState.IDLE},
    TurnState.STREAMING: {TurnState.STOPPING, TurnState.IDLE},
    TurnState.STOPPING: {TurnState.STOPPING, TurnState.IDLE},
}
BUSY = {TurnState.PREFILLING, TurnState.STREAMING, TurnState.STOPPING}


@dataclass
class Turn:
    state: TurnState = TurnState.IDLE
    asked: Any = None  # the user's message, saved to the chat when it was sent (chat_app.store.Saved)
    shown: Any = None  # ... and shown (chat_app.view.ShownUser), its reply not begun yet
    reply: Any = None  # the reply streaming (chat_app.view.ShownReply)
    row: Any = None  # ... its row in the store
    text: list[str] = field(default_factory=list)  # ... its text as the session gave it
    saved_at: float = 0.0  # when the reply's text was last written to the store (0: not yet)

    @property
    def busy(self) -> bool:
        return self.state in BUSY

    def move(self, to: TurnState) -> None:
        assert to in MOVES[self.state], f"a turn does not go from {self.state.name} to {to.name}"
        self.state = to

    def end(self) -> None:
        """The reply ended (or never began): IDLE, and nothing of it kept but the user's row."""
        self.move(TurnState.IDLE)
        self.reply, self.row, self.text, self.saved_at = None, None, [], 0.0
