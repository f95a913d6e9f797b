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

In the app (`/read PATH`, `@PATH`, a big paste: chat_app.widgets.prompt_input):
- `Attachment(name, text, source)`: one file (or a paste) held for the next message; `source`
  is the file's real path ("" for a paste or stdin); `tokens` is an
  estimate, `estimate(text)`: one token per TOKEN_BYTES bytes of UTF-8, rounded up (the UI
  process has no tokenizer; the session counts exactly when the message is sent, and refuses
  one past the context with how far over it is).
- `merged(attachments, more) -> list`: `attachments`, then `more`. A file attached again (the
  same real path; for a paste, the same name) gives way to its new read; another file whose name
  is taken is named by more of its path ("/a/x.txt", then "/b/x.txt": "x.txt" and "b/x.txt"), so
  a message never carries two files of one name.
- `gather(pattern) -> (attachments, skipped)`: a path is `read_file`'s (refused as it refuses);
  each is named as typed, or, where the pattern is absolute, from the folder that holds it
  ("/home/me/src" gives "src/a.py"; "/etc/hosts" "hosts"): a message never starts with "/",
  which the app reads as a /command;
  a folder is its text files, walked in name order, hidden entries left out; a glob (`*`, `?`,
  `[`, `**`) its matches. Under a folder or a glob, binary, unreadable and special files are
  skipped and named (`skipped`); more than MAX_FILES files, or nothing left to attach, is a
  ValueError of one line. `check_total(attachments)`: a message's attachments hold at most
  MAX_BYTES together (the same 1 MiB as one file: past every model's context here).
- `compose(attachments, text)`: the message as sent and saved: each attachment `fenced`, then
  the typed text, blank lines between (as -p puts -f's files before its prompt).
  `split(message) -> (attachments, text)` undoes it: the leading fenced blocks `compose` wrote
  (shown as chips again when a message comes back to the input, and as one line each in the
  conversation).
- `mentions(text)`: the `@PATH` words of a message (after a space or at its start; a word that
  names nothing on disk is left alone, as `@alice` is), which are attached when it is sent.
This module imports no torch and no textual.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

MAX_BYTES = 1024 * 1024  # one file's (and stdin's) limit; in the app, all of a message's attachments together
MAX_FILES = 50  # the files a folder or a glob may attach at once
TOKEN_BYTES = 4  # the estimate: ~4 bytes of UTF-8 a token (English and code, BPE tokenizers: 3.5-4.5)
_GLOB = re.compile(r"[*?\[]")
_MENTION = re.compile(r"(?<!\S)@(\S+)")
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


# ---- the app's attachments ------------------------------------------------------------------


def estimate(text: str) -> int:
    """About how many tokens `text` is (no tokenizer here): its UTF-8 bytes / TOKEN_BYTES, rounded up."""
    return -(-len(text.encode("utf-8", "surrogatepass")) // TOKEN_BYTES)


@dataclass(frozen=True)
class Attachment:
    name: str  # what the message calls it: the path as given, or "pasted text"
    text: str
    source: str = field(default="", compare=False)  # the file's real path ("": a paste, stdin)
    tokens: int = field(init=False, compare=False)  # estimate(text)
    size: int = field(init=False, compare=False)  # its UTF-8 bytes

    def __post_init__(self) -> None:
        size = len(self.text.encode("utf-8", "surrogatepass"))
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "tokens", -(-size // TOKEN_BYTES))


def gather(pattern: str) -> tuple[list[Attachment], list[str]]:
    """What `/read PATTERN` attaches: (the attachments, the files skipped: "name (why)")."""
    path = os.path.expanduser(pattern)
    absolute = os.path.isabs(pattern)
    if _GLOB.search(pattern) and not os.path.exists(path):
        names = sorted(glob.glob(path, recursive=True))
        if not names:
            raise ValueError(f"nothing matches {pattern}")
        found = [n for n in names if not os.path.isdir(n)][:MAX_FILES + 1]
        root = os.path.dirname(path[:_GLOB.search(path).start()]) or "/"  # type: ignore[union-attr]
        shown = {n: os.path.relpath(n, os.path.dirname(root)) if absolute else n for n in found}
    elif os.path.isdir(path) and not os.path.realpath(path).startswith(("/dev/", "/proc/")):
        found = _walk(path)
        top = os.path.basename(os.path.normpath(path)) if absolute else pattern
        shown = {n: os.path.join(top, os.path.relpath(n, path)) for n in found}
    else:
        return [Attachment(os.path.basename(path) if absolute else pattern, read_file(pattern),
                           os.path.realpath(path))], []
    if len(found) > MAX_FILES:
        raise ValueError(f"{pattern} holds more than {MAX_FILES} files, the most one /read attaches; "
                         "name fewer (a glob: folder/*.py)")
    attached, skipped = [], []
    for name in found:
        try:
            attached.append(Attachment(shown[name], read_file(name), os.path.realpath(name)))
        except ValueError as e:
            skipped.append(f"{shown[name]} ({_why(str(e))})")
    if not attached:
        raise ValueError(f"{pattern} holds no text file to attach" +
                         (f" (skipped: {', '.join(skipped)})" if skipped else ""))
    check_total(attached)
    return attached, skipped


def _walk(folder: str) -> list[str]:
    """A folder's files in name order, hidden files and folders left out; at most MAX_FILES + 1."""
    out: list[str] = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [os.path.join(top, f) for f in sorted(files) if not f.startswith(".")]
        if len(out) > MAX_FILES:
            break
    return out[:MAX_FILES + 1]


def _why(message: str) -> str:
    for word in ("binary", "not UTF-8", "special file", "over the limit", "cannot read"):
        if word in message:
            return {"special file": "a special file", "over the limit": "over 1 MiB",
                    "cannot read": "unreadable"}.get(word, word)
    return message


def check_total(attachments: list[Attachment]) -> None:
    total = sum(a.size for a in attachments)
    if total > MAX_BYTES:
        raise ValueError(f"the attachments would hold {total:,} bytes, over the {MAX_BYTES:,} (1 MiB) "
                         "a message may carry; attach less")


def merged(attachments: list[Attachment], more: list[Attachment]) -> list[Attachment]:
    """`attachments`, then `more`: the same file again replaces it, a new file never shares a name."""
    out = list(attachments)
    for a in more:
        out = [b for b in out if not (b.source == a.source if a.source and b.source else b.name == a.name)]
        taken = {b.name for b in out}
        if a.name in taken:
            a = Attachment(_free_name(a, taken), a.text, a.source)
        out.append(a)
    return out


def _free_name(a: Attachment, taken: set[str]) -> str:
    """A name for `a` that none of `taken` has: more of its path's last parts, else a number."""
    parts = [p for p in a.source.split(os.sep) if p]
    for n in range(2, len(parts) + 1):  # joined without the leading "/": a message never starts with one
        name = os.path.join(*parts[-n:])
        if name not in taken:
            return name
    return next(f"{a.name} ({i})" for i in range(2, len(taken) + 3) if f"{a.name} ({i})" not in taken)


def compose(attachments: list[Attachment], text: str) -> str:
    return "\n\n".join([*(fenced(a.name, a.text) for a in attachments), *([text] if text.strip() else [])])


def split(message: str) -> tuple[list[Attachment], str]:
    """The leading fenced blocks of a message `compose` wrote, and the text after them."""
    found: list[Attachment] = []
    rest = message
    while True:
        name, nl, after = rest.partition("\n")
        fence, nl2, body = after.partition("\n")
        if not (nl and nl2 and name.strip() and "`" not in name and len(fence) >= 3 and fence.strip("`") == ""):
            break
        if body.startswith(fence) and body[len(fence):len(fence) + 1] in ("", "\n"):
            end, text = 0, ""  # an empty file
        else:
            end = body.find("\n" + fence)
            while end >= 0 and body[end + 1 + len(fence):end + 2 + len(fence)] not in ("", "\n"):
                end = body.find("\n" + fence, end + 1)
            if end < 0:
                break
            text, end = body[:end + 1], end + 1
        tail = body[end + len(fence):]
        if tail and not tail.startswith("\n\n"):
            break
        found.append(Attachment(name, text))
        rest = tail[2:]
        if not tail:
            break
    return found, (message if not found else rest)


def mentions(text: str) -> list[str]:
    """The `@PATH` words of `text` that name a file, a folder or a glob's matches (in order,
    each once); a trailing . , ; : ! ? ) is not part of a path that exists without it."""
    out: list[str] = []
    for word in _MENTION.findall(text):
        for candidate in (word, word.rstrip(".,;:!?)")):
            path = os.path.expanduser(candidate)
            if candidate and (os.path.lexists(path) or _GLOB.search(candidate) and glob.glob(path, recursive=True)):
                if candidate not in out:
                    out.append(candidate)
                break
    return out
