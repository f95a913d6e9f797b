"""Settled: what the command line comes to once checked, before a model is opened.

Contract: chat_app.__main__.settle makes one, for the app's start (build_app) and the one-shot
run's (chat_app.oneshot), which both read it; a plain record, here so neither imports the
other for it. Imports neither Textual nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chat_app.server_session import ServerSession
    from chat_app.store import Resumed, Store


@dataclass
class Settled:
    store: Store | None  # None: --no-save with no chat to continue (the one-shot run only)
    resumed: Resumed | None  # --resume's (or --chat's) chat
    name: str  # the model's
    path: str | Path  # a local model's (a server's: its spec)
    server: ServerSession | None  # a server model, connected (closed unless keep_server)
    local: dict  # open_session's arguments for a local model
    fallback: str | None  # the chat's own model is open: the one it would have had without --resume
