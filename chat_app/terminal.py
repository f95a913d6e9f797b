"""Terminal input that a paste, a lone Esc or a bad byte cannot turn into keystrokes or a dead app.

Work-arounds for Textual 8.2.8's Linux driver and its xterm parser:
- The parser replays escape sequences found INSIDE a bracketed paste as keys, so a pasted
  "\\x1b[A\\x11" quits and a pasted "\\r" sends. `PasteGuard` sits in front of the parser and
  turns every ESC inside a paste (but the paste's own end marker) into "␛", so a paste reaches
  the app as one Paste event of text. (PromptInput also makes what is left of control
  characters harmless.)
- The input thread decodes stdin as strict UTF-8: one invalid byte killed it and the app
  exited. `SafeLinuxDriver` decodes with errors="replace" (U+FFFD).
- `XTermParser.feed("")` means end of file: the parser is dead after it and the next key
  raises ParseError (a held-back lone ESC once fed it "" and killed the app). `SafeParser`
  never feeds "".
- Its SIGTSTP and SIGCONT handlers did the screen's work inside the signal handler: the app
  hung when one landed inside a write to the screen, and a stray SIGCONT started a second
  input thread. `SafeLinuxDriver` takes job control from `chat_app.job_control`.

The guard's promises:
- Outside a paste it passes every character on at once, unchanged: a lone ESC reaches the
  parser, which reports it as the escape key once ESCDELAY (0.1 s) passes without a next
  character (its tick(), after the input thread's select times out); ESC + a character in
  one burst stays Alt+key, arrows stay arrows. A start marker split across reads is found
  in a shadow of the last characters passed on; the shadow is cleared when the parser gives
  up waiting on a sequence, so an Esc, then "[200~" typed after it, is not a paste.
- Inside a paste it holds back only a tail that may begin the end marker.
- A paste's end marker may be one the pasted text held (tmux passes "\\x1b[201~" in a paste
  on): after it, everything is held until the input goes idle (the input thread's select
  timeout, 0.1 s without a byte: `idle()`). Another end marker in that burst, or a start
  marker after some text, means the first end marker was pasted text: all of it goes on as
  paste text, ESC made visible, and the next end marker is judged the same way. Only what
  follows the LAST end marker of the burst is keys. A start marker right after an end
  marker is a second paste. A paste that never ends holds the input in it (Textual's parser
  does the same).
`driver_class()` is the driver for this platform: SafeLinuxDriver (its parser:
`SafeLinuxDriver.parser_class`) where Textual uses its Linux driver, else None (Textual's own).
"""

from __future__ import annotations

import os
import selectors
import sys
from codecs import getincrementaldecoder
from collections.abc import Iterable

from chat_app.job_control import JobControl

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
VISIBLE_ESC = "\u241b"


def visible(text: str) -> str:
    return text.replace("\x1b", VISIBLE_ESC)


class PasteGuard:
    """A stateful filter over the decoded input stream (pieces may split anywhere)."""

    def __init__(self) -> None:
        self.state = "keys"  # "keys" | "paste" | "ended" (an end marker seen, not yet known real)
        self._shadow = ""  # keys: the last characters passed on (they may begin a start marker)
        self._held = ""  # paste: a tail that may begin the end marker; ended: the marker and what followed

    def feed(self, data: str) -> str:
        out: list[str] = []
        while data:
            if self.state == "keys":
                seen = self._shadow + data
                at = seen.find(PASTE_START)
                if at < 0:
                    out.append(data)
                    self._shadow = seen[-(len(PASTE_START) - 1):]
                    break
                cut = at + len(PASTE_START) - len(self._shadow)  # data up to the marker's end
                out.append(data[:cut])
                data, self._shadow, self.state = data[cut:], "", "paste"
            elif self.state == "paste":
                data, self._held = self._held + data, ""
                at = data.find(PASTE_END)
                if at < 0:
                    keep = _partial_suffix(data, PASTE_END)
                    out.append(visible(data[:len(data) - keep]))
                    self._held = data[len(data) - keep:]
                    break
                out.append(visible(data[:at]))
                data, self._held, self.state = data[at + len(PASTE_END):], PASTE_END, "ended"
            else:  # "ended": self._held starts with the end marker
                held, data = self._held + data, ""
                body = held[len(PASTE_END):]
                end, start = body.find(PASTE_END), body.find(PASTE_START)
                if start == 0:  # a second paste right after the first
                    out.append(PASTE_END + PASTE_START)
                    data, self._held, self.state = body[len(PASTE_START):], "", "paste"
                elif end >= 0 and (start < 0 or end < start):  # the first end marker was pasted text
                    out.append(visible(held[:len(PASTE_END) + end]))
                    data, self._held = body[end + len(PASTE_END):], PASTE_END
                elif start > 0:  # text, then a start marker: no one types that; all pasted text
                    out.append(visible(held[:len(PASTE_END) + start + len(PASTE_START)]))
                    data, self._held, self.state = body[start + len(PASTE_START):], "", "paste"
                else:
                    self._held = held
        return "".join(out)

    def idle(self) -> str:
        """The input went quiet: an end marker still held was the paste's real end."""
        if self.state != "ended":
            return ""
        body, self._held, self.state = self._held[len(PASTE_END):], "", "keys"
        return PASTE_END + self.feed(body)

    def sequence_ended(self) -> None:
        """The parser stopped waiting on an escape sequence: what was passed on is no marker."""
        self._shadow = ""


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
            return self._feed(self.guard.feed(data))

        def idle(self) -> Iterable:
            return self._feed(self.guard.idle())

        def _feed(self, text: str) -> Iterable:
            return super().feed(text) if text else ()  # "" would be the end of file

        def tick(self) -> Iterable:
            waiting = self._timeout_time is not None  # on the character after an ESC
            events = list(super().tick())
            if waiting and self._timeout_time is None:  # it gave up: a lone ESC is the escape key
                self.guard.sequence_ended()
            return events

    class SafeLinuxDriver(JobControl, LinuxDriver):
        parser_class = SafeParser

        def run_input_thread(self) -> None:
            """Textual's loop, with the guard in front of the parser and a lenient decoder."""
            selector = selectors.SelectSelector()
            selector.register(self.fileno, selectors.EVENT_READ)
            parser = self.parser_class(self._debug)
            decode = getincrementaldecoder("utf-8")(errors="replace").decode

            def process(ready, final: bool = False) -> None:
                for i, (_key, mask) in enumerate(ready):
                    if mask & selectors.EVENT_READ:
                        text = decode(os.read(self.fileno, 1024 * 4), final=final and i == len(ready) - 1)
                        if not text:
                            break
                        for event in parser.feed(text):
                            self.process_message(event)
                if not ready:  # select timed out: the input is idle
                    for event in parser.idle():
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

    return SafeLinuxDriver
