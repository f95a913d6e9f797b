"""What the app's worker tells the UI thread, besides the session's own events.

Loaded, LoadFailed, Started, Done and Failed are the app's (each carries its job: chat_app.jobs);
Prefilled, Token and Finished are the session's, re-exported from tinyllm.session.chat_events
(plain dataclasses that import no torch, the same the session's child process sends), so
importing the app stays torch-free; Progress (the load's steps: tensors read, the CPU kernels'
build) is the one the child sends, from tinyllm.session.session_protocol (torch-free too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tinyllm.session.chat_events import Finished, Prefilled, Token
from tinyllm.session.session_protocol import Progress

__all__ = ["Done", "Failed", "Finished", "LoadFailed", "Loaded", "Prefilled", "Progress", "Started", "Token"]

if TYPE_CHECKING:
    from chat_app.jobs import Job, Reply
    from tinyllm.session.session_protocol import ModelProcess


@dataclass
class Loaded:
    session: ModelProcess
    switched: bool = False  # it replaces the model that was open (/model PATH)
    keep_chat: bool = False  # ... in the chat that is open (a saved chat's own model), not a new one


@dataclass
class LoadFailed:  # the first model could not be opened (a ValueError: bad input, main() says it)
    error: Exception
    message: str


@dataclass
class Started:  # the session's reply to `job` has begun (its first event is next)
    job: Reply


@dataclass
class Done:  # a job without a reply finished
    job: Job


@dataclass
class Failed:  # a job failed (a reply: before or while it streamed)
    job: Job
    message: str
