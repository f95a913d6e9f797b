"""A real tinyllm-chat in a pseudo-terminal, its screen read through pyte (for tests/chat_app/test_pty.py).

Contract: `Terminal(argv, env)` starts the program on a new pty, which becomes its controlling
terminal, at a fixed size; a reader thread feeds all it writes into a pyte screen and keeps
the raw bytes (`raw`, for what pyte does not model: the alternate screen, modes). Tests send
the bytes a terminal sends (`send`), wait on what the screen shows (`wait`: polls, with a
deadline that only stops a hung test, never a sleep), resize it (`resize`: TIOCSWINSZ and
SIGWINCH, as a terminal does), wait for its exit (`exit_code`) and end it (`close`: kills
the process group it leads, if still there). On a failed wait the screen is in the message.
Of the app it knows only where the input box is (`input_text`).
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import termios
import threading
import time
from collections.abc import Callable

import pyte

DEADLINE_S = 60.0  # far past any loaded machine; only a hung or broken app reaches it


class Terminal:
    def __init__(self, argv: list[str], env: dict[str, str], cols: int = 100, rows: int = 30) -> None:
        self.screen = pyte.Screen(cols, rows)
        self._stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self._lock = threading.Lock()
        self.returncode: int | None = None
        master, slave = os.openpty()
        _set_size(slave, cols, rows)  # before the program can ask
        self.pid = os.fork()
        if self.pid == 0:  # the child: the pty is its session's terminal, then the program
            try:
                os.close(master)
                os.login_tty(slave)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        os.close(slave)
        self.fd = master
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: every process holding the pty's other end has gone
                return
            if not data:
                return
            with self._lock:
                self.raw += data
                self._stream.feed(data)

    # ---- what the user does -------------------------------------------------------------

    def send(self, data: str | bytes) -> None:
        os.write(self.fd, data.encode() if isinstance(data, str) else data)

    def resize(self, cols: int, rows: int) -> None:
        with self._lock:
            self.screen.resize(rows, cols)
        _set_size(self.fd, cols, rows)  # the kernel signals the foreground group too
        os.kill(self.pid, signal.SIGWINCH)

    def wipe(self) -> None:
        """A blank screen, as a terminal's new alternate screen is (pyte keeps no alternate screen)."""
        with self._lock:
            self.screen.reset()

    # ---- what the user sees -------------------------------------------------------------

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.screen.display)

    def lines(self) -> list[str]:
        with self._lock:
            return list(self.screen.display)

    def input_text(self) -> str:
        """The prompt's text: the rows between the input box's top and bottom edges."""
        lines = self.lines()
        top = max((i for i, line in enumerate(lines) if "▔▔▔▔" in line), default=None)
        if top is None:
            return ""
        inside = []
        for line in lines[top + 1:]:
            if "▁▁▁▁" in line:
                break
            inside.append(line.split("▌")[0].strip().strip("▊▎").strip())  # "▌": a notice over it
        return "\n".join(inside).strip("\n")

    def wait(self, condition: Callable[[], bool] | str, what: str = "", deadline: float = DEADLINE_S) -> float:
        """Poll until condition() holds (a str: until the screen shows it); the seconds it took."""
        if isinstance(condition, str):
            text, what = condition, what or repr(condition)
            condition = lambda: text in self.text()  # noqa: E731
        start = time.monotonic()
        while not condition():
            if self.exit_code(wait=False) is not None or time.monotonic() - start > deadline:
                state = f"exited with {self.returncode}" if self.returncode is not None else "timed out"
                raise AssertionError(f"{state} waiting for {what or condition}; screen:\n{self.text()}\n"
                                     f"last output: {bytes(self.raw[-600:])!r}")
            time.sleep(0.02)
        return time.monotonic() - start

    def exit_code(self, wait: bool = True, deadline: float = DEADLINE_S) -> int | None:
        """The program's exit code; None while it runs (wait=False) or past the deadline."""
        end = time.monotonic() + deadline
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self._reader.join(timeout=5)  # the last frames: the terminal as it was left
            elif not wait or time.monotonic() > end:
                return None
            else:
                time.sleep(0.02)
        return self.returncode

    def modes(self) -> dict[str, bool]:
        """Which terminal modes the program left on: alternate screen, cursor shown, mouse, paste."""
        raw = bytes(self.raw)
        return {name: raw.rfind(f"\x1b[?{n}h".encode()) > raw.rfind(f"\x1b[?{n}l".encode())
                for name, n in (("alt_screen", 1049), ("cursor", 25), ("mouse", 1000), ("paste", 2004))}

    def echo_on(self) -> bool:
        """The pty's line discipline echoes and reads lines again (the program restored it)."""
        lflag = termios.tcgetattr(self.fd)[3]
        return bool(lflag & termios.ECHO) and bool(lflag & termios.ICANON)

    def close(self) -> None:
        if self.exit_code(wait=False) is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)  # the group this terminal's program leads
            except ProcessLookupError:
                pass
            self.exit_code()
        os.close(self.fd)


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
