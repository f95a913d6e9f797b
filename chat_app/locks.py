"""One instance per conversation: an advisory lock file per conversation, `locks/<id>.lock`.

Contract: `claim(locks, id)` returns the open lock file (hold it while the chat is open; the
OS releases it when the process dies, kill -9 included), or None when another process holds
it. Where a lock cannot be made at all (a file named locks, a folder without write
permission) it raises the OSError, for the store to say so and go on unlocked. Windows has no
advisory locks here: every claim succeeds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one instance per conversation is not enforced
    fcntl = None  # type: ignore[assignment]


def claim(locks: Path, conversation: int) -> IO | None:
    if fcntl is None:
        return unlocked()
    locks.mkdir(exist_ok=True)
    f = open(locks / f"{conversation}.lock", "a")  # noqa: SIM115 (held while the chat is open)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f


def unlocked() -> IO:
    """What a chat holds where there is no lock: a file to close like a lock."""
    return open(os.devnull)  # noqa: SIM115
