"""Job control for the app's terminal driver: SIGTSTP (Ctrl+Z, `kill -TSTP`) and SIGCONT (`fg`,
`bg`, `kill -CONT`) at any moment.

Contract: `JobControl` is a mixin for Textual's LinuxDriver (before it in the bases); its
`__init__` puts two handlers in place of Textual's. SIGTSTP puts the screen away (the terminal
as the shell left it) and stops the process; the SIGCONT after it brings the screen back, drawn
whole (the app's resume signal). Any other SIGCONT changes nothing.

Textual 8.2.8's handlers did the screen's work inside the signal handler, and a handler runs in
the main thread wherever that thread is:
- inside a write to the screen (the writer queue's lock held), the handler's own first write
  waited on that lock forever: the app hung instead of stopping (CI, 2026-12-07);
- any SIGCONT started the screen again, also on top of a running one: a second input thread and
  writer, and the next Ctrl+Q hung until one more key.
Here a handler only decides, at once, and queues the screen's work on the event loop
(`call_soon_threadsafe`: no lock, safe in a handler); repeats collapse into one queued call. What
is decided at once, as Textual did:
- while the app is suspended (App.suspend: $EDITOR has the terminal, and the loop waits on it),
  SIGTSTP stops the process there and then, with the editor, so the shell gets its prompt back;
- where no screen is up (not yet, or no more: the app is exiting) or the loop has closed, it
  stops the process and nothing comes back on SIGCONT.
After `bg`, the screen cannot come back: Textual's start finds the terminal not its own (SIGTTOU)
and stops the process again. The screen stays put away, and the SIGCONT of `fg` tries again.
"""

from __future__ import annotations

import os
import signal


class JobControl:
    # Textual's LinuxDriver provides these.
    _auto_restart: bool
    _loop: object
    _key_thread: object

    def __init__(self, *args, **kwargs) -> None:
        self._put_away = False  # the screen was put away for a SIGTSTP: the next SIGCONT brings it back
        self._stop_queued = self._resume_queued = False
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]  # puts Textual's handlers in place
        signal.signal(signal.SIGTSTP, self._on_sigtstp)
        signal.signal(signal.SIGCONT, self._on_sigcont)

    @property
    def _screen_up(self) -> bool:
        """Application mode runs: its input thread does (none before the start, joined by every
        stop, and none started by a start that `bg` stopped)."""
        thread = self._key_thread
        return thread is not None and thread.is_alive()  # type: ignore[attr-defined]

    # ---- in the signal handler: decide, queue --------------------------------------------

    def _on_sigtstp(self, *_) -> None:
        if self._auto_restart and self._screen_up:
            if self._stop_queued or self._queue(self._put_away_and_stop):
                self._stop_queued = True
                return
        os.kill(os.getpid(), signal.SIGSTOP)

    def _on_sigcont(self, *_) -> None:
        if self._put_away and not self._resume_queued and self._queue(self._bring_back):
            self._resume_queued = True

    def _queue(self, work) -> bool:
        try:
            self._loop.call_soon_threadsafe(work)  # type: ignore[attr-defined]
            return True
        except RuntimeError:  # the loop has closed
            return False

    # ---- on the loop: the screen's work ---------------------------------------------------

    def _put_away_and_stop(self) -> None:
        self._stop_queued = False
        if not self._screen_up:  # gone meanwhile (the app exits): nothing to put away
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        self._put_away = self._auto_restart
        self._sigtstp_application()  # type: ignore[attr-defined]  # Textual's: puts it away, stops; returns on SIGCONT

    def _bring_back(self) -> None:
        self._resume_queued = False
        if self._put_away and self._auto_restart:
            self.resume_application_mode()  # type: ignore[attr-defined]
            self._put_away = not self._screen_up
