"""A reply held in the model's child process, for tests: it waits after its text until a
stop arrives, so a test that stops it mid-way (Esc, Ctrl+N) cannot see it end first, on any CPU.

`held_in_child(app, replies)` makes the app open HeldInChild sessions: RemoteSessions whose
child runs `serve_held(replies)` instead of tinyllm.session.chat_server.main. That wraps the child's
ChatSession so each of its first `replies` replies (send, regenerate, continue_reply; a
refused one counts too) waits after each token with text until stop() is called, or set_graphs()
(Ctrl+G), which lets it go on to its end. A stop that came before the reply still counts;
quitting stops, so it releases the reply too. The server
sends the batch holding a reply's first text at once, so the app sees that text while the
reply waits. `session.replies = 0` before a restart: the next child holds nothing.

`held_load(app, gate, kernels="", fail=False)` makes the app open HeldLoad sessions, whose child
holds its model's load until the file `gate` exists: the app is still loading by construction.
First it goes through the CPU kernels' step as `kernels` says: "" none; "real":
tinyllm.kernels.cpu_qgemv.available() as it is (the session's build: cached once built); "fake build":
available() with a compile that writes the first FAKE_OBJECTS object files, waits for the gate,
then fails (the build's progress and its failure as the app sees them, without a compiler's
minute; $TINYLLM_CACHE_DIR should be an empty folder of the test's). `fail`: after the gate,
the load fails as a machine's fault would (not bad input).
Production code knows nothing of this but `RemoteSession._command`, the child's command line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from chat_app.remote_session import RemoteSession, python
from tinyllm.session.chat_events import Token


class HeldInChild(RemoteSession):
    def __init__(self, open_kwargs: dict[str, Any], progress=None, *, replies: int = 1, **changes: Any):
        self.replies = replies  # read when a child starts (restart() starts another)
        super().__init__(open_kwargs, progress, **changes)

    def _command(self, fd: int) -> list[str]:
        return python(f"from tests.chat_app.held_child import serve_held; serve_held({self.replies})", fd)


def held_in_child(app, replies: int = 1):
    """The app, whose child processes hold their first `replies` replies until stopped."""
    opener = app.open_session  # partial(server_session.open_session, open_kwargs, servers, first): a local model's
    app.open_session = partial(HeldInChild, opener.args[0], replies=replies)
    return app


class HeldLoad(RemoteSession):
    def __init__(self, open_kwargs: dict[str, Any], progress=None, *, gate: Path, kernels: str = "",
                 fail: bool = False, **changes: Any):
        self.gate, self.kernels, self.fail = gate, kernels, fail
        super().__init__(open_kwargs, progress, **changes)

    def _command(self, fd: int) -> list[str]:
        args = f"{str(self.gate)!r}, {self.kernels!r}, {self.fail!r}"
        return python(f"from tests.chat_app.held_child import serve_held_load; serve_held_load({args})", fd)


def held_load(app, gate: Path, kernels: str = "", fail: bool = False):
    """The app, whose model processes hold their load until `gate` exists."""
    opener = app.open_session  # as held_in_child's
    app.open_session = partial(HeldLoad, opener.args[0], gate=gate, kernels=kernels, fail=fail)
    return app


# ---- in the child ----------------------------------------------------------------------------

FAKE_OBJECTS = 3  # the object files a "fake build" writes before it waits


def wait_for(gate: Path) -> None:
    while not gate.exists():  # the test's state, not a time: the loop ends when the test says
        time.sleep(0.01)


def serve_held_load(gate: str, kernels: str, fail: bool) -> None:
    import tinyllm.session.chat as chat
    from tinyllm.kernels import cpu_qgemv, kernel_build
    from tinyllm.session import chat_server

    open_session = chat.open_session

    def fake_compile(name, sources, flags, folder: Path) -> Path:
        for p in sources[:FAKE_OBJECTS]:
            (folder / f"{p.stem}.o").write_bytes(b"")
        wait_for(Path(gate))
        raise RuntimeError("no compiler in this test")

    def held(*args, **kwargs):
        if kernels == "fake build":
            kernel_build._compile = fake_compile
            cpu_qgemv._cpu_problem = lambda: None  # nothing runs on the CPU's AVX2 here
        if kernels:
            cpu_qgemv.available()
        wait_for(Path(gate))
        if fail:
            raise RuntimeError("the machine is out of memory (a test's fault)")
        return open_session(*args, **kwargs)

    chat.open_session = held
    chat_server.main()



def serve_held(replies: int) -> None:
    import tinyllm.session.chat as chat
    from tinyllm.session import chat_server

    open_session = chat.open_session
    chat.open_session = lambda *args, **kwargs: hold(open_session(*args, **kwargs), replies)
    chat_server.main()


def hold(session, replies: int):
    gate = threading.Event()  # set by stop(); cleared when a held reply ends
    left = [replies]
    stop = session.stop

    def stopped() -> None:
        gate.set()
        stop()

    def held(events: Iterator) -> Iterator:
        try:
            for event in events:
                yield event
                if isinstance(event, Token) and event.text:
                    gate.wait()
        finally:
            gate.clear()

    def holding(reply):
        def start(*args):
            left[0] -= 1
            events = reply(*args)
            return held(events) if left[0] >= 0 else events
        return start

    def switched(on: bool) -> None:  # the switch (Ctrl+G) lets a held reply go on
        switch(on)
        gate.set()

    switch = session.set_graphs
    session.stop, session.set_graphs = stopped, switched
    for name in ("send", "regenerate", "continue_reply"):
        setattr(session, name, holding(getattr(session, name)))
    return session
