"""Attachments: a text file (or what came on stdin) read for a message, and wrapped as one.

Contract:
- `read_file(path) -> str` reads a regular text file of at most `MAX_BYTES` (1 MiB: more than the
  context of every model shipped or tested here holds; a bigger one is not a chat message) as
  UTF-8. Refused with a ValueError of one line that names the file and says why: missing or
  unreadable (the OS's reason), a folder, a special file (a FIFO, a socket, a device) or any
  path under /dev or /proc (never opened for reading: a FIFO would block, /dev/zero never
  ends), past the limit, binary (a NUL byte) or not UTF-8. The file is opened without
  blocking and checked on the descriptor it is read from, so a path swapped for a FIFO after
  the check cannot hang it.
- `read_stream(stream, name) -> str`: the same checks (size, binary, UTF-8) on what a stream
  holds, read to its end (stdin when it is not a terminal).
- `fenced(name, text) -> str`: the text as a message carries a file: its name on a line of its
  own, then a fenced code block whose fence is longer than any run of backticks in the text
  (CommonMark's rule), so a file that holds ``` cannot end its block early.
This module imports no torch and no textual.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

MAX_BYTES = 1024 * 1024  # one file's (and stdin's) limit
_BACKTICKS = re.compile(r"`{3,}")


def read_file(path: str | Path) -> str:
    name = str(path)
    real = os.path.realpath(os.path.expanduser(name))
    if real == "/dev" or real.startswith(("/dev/", "/proc/")):
        raise ValueError(f"{name}: a special file ({real}); attach a regular text file")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise ValueError(f"cannot read {name}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise ValueError(f"{name} is a folder; attach its files one by one (-f PATH each)")
        raise ValueError(f"{name}: a special file ({_kind(mode)}); attach a regular text file")
    with os.fdopen(fd, "rb") as f:
        try:
            return _text(f, name)
        except OSError as e:
            raise ValueError(f"cannot read {name}: {e.strerror or e}") from None


def read_stream(stream: BinaryIO, name: str) -> str:
    return _text(stream, name)


def _text(f: BinaryIO, name: str) -> str:
    data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{name} is over the limit of {MAX_BYTES:,} bytes (1 MiB) a message may carry")
    if b"\0" in data:
        raise ValueError(f"{name} is binary (it holds NUL bytes); attach text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name} is not UTF-8 text (byte {e.start:,}); attach text") from None


def fenced(name: str, text: str) -> str:
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=2)
    fence = "`" * (longest + 1)
    body = text if text.endswith("\n") or not text else text + "\n"
    return f"{name}\n{fence}\n{body}{fence}"


def _kind(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "not a regular file")
