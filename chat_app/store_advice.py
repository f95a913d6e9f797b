"""What the store says when its files fail, and where an unsaved chat goes at quit.

Contract: `advice(path, e)` is the one line a failed read or write of chat.db shows: what went
wrong and what to do, naming every file that matters (for a read-only database: chat.db, its
-wal and -shm files where they exist, and the folder when it is not writable). `lock_advice`
is the line for a lock that cannot be taken (the chat then goes on unlocked). `identity(path)`
tells one file from another (a chat.db deleted or replaced while open). `rescue(markdown,
folder)` writes an `unsaved-<time>.md` in the data folder, else the current directory, else
the temp folder, and returns one line naming it (or saying that it could not); a write that
fails midway (a full disk: ENOSPC at write or at close) leaves no file behind in that folder,
empty or cut short, before the next folder is tried. Nothing here raises.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

ENV_DIR = "TINYLLM_CHAT_DATA_DIR"


def advice(path: Path, e: Exception) -> str:
    """One line: what went wrong with the file at `path`, and what to do about it."""
    text = str(e)
    low = text.lower()
    if "readonly" in low or "read-only" in low or "permission" in low:
        files = [str(p) for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p == path or p.exists()]
        folder = "" if os.access(path.parent, os.W_OK) else f" and the folder (chmod u+w {path.parent})"
        todo = (f"make them writable (chmod u+w {' '.join(files)}){folder} "
                f"or set {ENV_DIR} to another folder")
    elif "malformed" in low or "not a database" in low or "corrupt" in low:
        todo = f"move it away (mv {path} {path}.broken) and restart to begin a fresh history"
    elif "full" in low or "no space" in low:
        todo = "free some disk space"
    elif "locked" in low or "busy" in low:
        todo = "another program holds it; close that program"
    else:
        todo = f"check the file, or set {ENV_DIR} to another folder"
    return f"chat history {path}: {text}; {todo}. The chat is kept in memory (/export PATH saves it)"


def lock_advice(locks: Path, e: OSError) -> str:
    """One line: the lock folder cannot be used; the chat is saved, unlocked."""
    todo = (f"remove it (rm {locks}; it is made again)" if locks.exists() and not locks.is_dir()
            else f"make it a writable folder (chmod u+w {locks})")
    return (f"chat locks {locks}: {e.strerror or e}; {todo}. The chat is saved without a lock: "
            "another tinyllm-chat could open the same chat")


def identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def rescue(markdown: str, folder: Path) -> str:
    """Write the unsaved chat somewhere; one line naming where (or that it could not)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    failures = []
    for where in (lambda: folder, Path.cwd, lambda: Path(tempfile.gettempdir())):
        try:  # each folder found only when tried: the current directory may be gone, the temp one unusable
            target = _create(where(), stamp, markdown)
        except OSError as e:
            failures.append(f"{e.strerror or e}")
            continue
        return f"tinyllm-chat: the chat history could not be saved; this run's chat is in {target}"
    return ("tinyllm-chat: the chat history could not be saved, and neither could a copy "
            f"({'; '.join(failures)}): this run's unsaved messages are lost")


def _create(folder: Path, stamp: str, text: str) -> Path:
    """A new file unsaved-<stamp>.md (-2, -3, ... when that name is taken) holding text; where
    the write fails after the file was made, the file is removed (a full data folder kept a
    0-byte unsaved-*.md while the copy went to the current folder: issue 52)."""
    for n in range(1, 100):
        target = folder / (f"unsaved-{stamp}.md" if n == 1 else f"unsaved-{stamp}-{n}.md")
        try:
            f = open(target, "x", encoding="utf-8")
        except FileExistsError:
            continue
        try:
            with f:  # close() flushes: a full disk may fail there too
                f.write(text)
        except BaseException:
            try:
                target.unlink()
            except OSError:
                pass  # (a folder that lets nothing be removed: the error below says enough)
            raise
        return target
    raise FileExistsError(f"{folder}/unsaved-{stamp}*.md: too many")
