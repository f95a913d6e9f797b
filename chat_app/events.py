"""What the app's worker tells the UI thread, besides the session's own events.

Loaded, Started, Done and Failed are the app's; Prefilled, Token and Finished are the
session's, imported by `session_events()` only once a session exists (the library is loaded
by then), so importing the app stays torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tinyllm.chat import ChatSession


@dataclass
class Loaded:
    session: ChatSession


@dataclass
class Started:  # the session's reply has begun (its first event is next)
    kind: str
    text: str


@dataclass
class Done:  # a job without a reply finished
    kind: str
    arg: Any


@dataclass
class Failed:
    kind: str
    arg: Any
    message: str


class Never:  # matches nothing: the session's events before a session exists
    pass


def session_events() -> tuple[type, type, type]:
    """The session's event classes (Prefilled, Token, Finished). Imported only once a session
    exists, when the library is loaded anyway: importing this module stays torch-free."""
    from tinyllm.chat import Finished, Prefilled, Token

    return Prefilled, Token, Finished
