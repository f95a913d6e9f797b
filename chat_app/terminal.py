"""Terminal input that a paste or a bad byte cannot turn into keystrokes or a dead app.

Two work-arounds for Textual 8.2.8's Linux driver:
- Its xterm parser replays escape sequences found INSIDE a bracketed paste as keys, so a
  pasted "\\x1b[A\\x11" quits and a pasted "\\r" sends. `PasteGuard` sits in front of the
  parser and turns every ESC inside a paste (but the paste's own end marker) into "␛", so a
  paste reaches the app as one Paste event of text. (PromptInput also makes what is left of
  control characters harmless.)
- Its input thread decodes stdin as strict UTF-8: one invalid byte killed it and the app
  exited. `SafeLinuxDriver` decodes with errors="replace" (U+FFFD).
`driver_class()` is the driver for this platform: SafeLinuxDriver where Textual uses its
Linux driver, else None (Textual's own choice).
"""

from __future__ import annotations

import os
import selectors
import sys
from codecs import getincrementaldecoder
from collections.abc import Iterable

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
VISIBLE_ESC = "\u241b"


class PasteGuard:
    """A stateful filter over the decoded input stream (pieces may split anywhere)."""

    def __init__(self) -> None:
        self.in_paste = False
        self._held = ""  # a tail that may be the start of a marker

    def feed(self, data: str) -> str:
        data, self._held = self._held + data, ""
        out: list[str] = []
        while data:
            marker = PASTE_END if self.in_paste else PASTE_START
            at = data.find(marker)
            if at < 0:
                keep = _partial_suffix(data, marker)
                body, self._held = data[:len(data) - keep], data[len(data) - keep:]
                out.append(body.replace("\x1b", VISIBLE_ESC) if self.in_paste else body)
                break
            body = data[:at]
            out.append(body.replace("\x1b", VISIBLE_ESC) if self.in_paste else body)
            out.append(marker)
            self.in_paste = not self.in_paste
            data = data[at + len(marker):]
        return "".join(out)


def _partial_suffix(data: str, marker: str) -> int:
    """How many trailing characters of data could begin marker."""
    for n in range(min(len(marker) - 1, len(data)), 0, -1):
        if marker.startswith(data[-n:]):
            return n
    return 0


def driver_class():
    if sys.platform == "win32" or os.environ.get("TEXTUAL_DRIVER"):
        return None
    from textual._xterm_parser import XTermParser
    from textual.drivers.linux_driver import LinuxDriver

    class SafeParser(XTermParser):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.guard = PasteGuard()

        def feed(self, data: str) -> Iterable:
            return super().feed(self.guard.feed(data))

    class SafeLinuxDriver(LinuxDriver):
        def run_input_thread(self) -> None:
            """Textual's loop, with the guard in front of the parser and a lenient decoder."""
            selector = selectors.SelectSelector()
            selector.register(self.fileno, selectors.EVENT_READ)
            parser = SafeParser(self._debug)
            decode = getincrementaldecoder("utf-8")(errors="replace").decode

            def process(ready, final: bool = False) -> None:
                for i, (_key, mask) in enumerate(ready):
                    if mask & selectors.EVENT_READ:
                        text = decode(os.read(self.fileno, 1024 * 4), final=final and i == len(ready) - 1)
                        if not text:
                            break
                        for event in parser.feed(text):
                            self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)

            try:
                while not self.exit_event.is_set():
                    process(selector.select(0.1))
                selector.unregister(self.fileno)
                process(selector.select(0.1), final=True)
            finally:
                selector.close()
                try:
                    for _ in parser.feed(""):
                        pass
                except Exception:
                    pass

    return SafeLinuxDriver
