"""StoreWriter: every write the app makes to its Store, and what the user hears of failures.

Contract: `save(write, *args)` runs one store write on the UI thread; a StoreError is a notice,
never a crash, shown again for each thing the user does that fails to save (`user_acted()`
marks one: a message, a command, Ctrl+R) or when the error changes, never once per streamed
token. The first write that works again after a failure says so. `notices()` passes on what
the store itself has to say (chat.db deleted and written again, no locks). This module never
imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chat_app.store import Store, StoreError


class StoreWriter:
    def __init__(self, store: Store, say: Callable[[str, str], None]) -> None:
        self.store, self.say = store, say
        self.failing = False  # the last write failed
        self._told: str | None = None  # the error shown since the user last acted

    def save(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            write(*args, **kwargs)
        except StoreError as e:
            self.failed(str(e))
            return
        finally:
            self.notices()
        if self.failing:
            self.failing, self._told = False, None
            self.say("The chat history is saved again.", "information")

    def failed(self, message: str) -> None:
        self.failing = True
        if message != self._told:
            self._told = message
            self.say(message, "error")

    def notices(self) -> None:
        while self.store.notices:
            self.say(self.store.notices.pop(0), "warning")

    def user_acted(self) -> None:
        """A message, command or key that writes: a store failure is worth showing again."""
        self._told = None
