"""A reply held in the model's child process, for tests: it waits after its text until a
stop arrives, so a test that stops it mid-way (Esc, Ctrl+N) cannot see it end first, on any CPU.

`held_in_child(app, replies)` makes the app open HeldInChild sessions: RemoteSessions whose
child runs `serve_held(replies)` instead of tinyllm.chat_server.main. That wraps the child's
ChatSession so each of its first `replies` replies (send, regenerate, continue_reply; a
refused one counts too) waits after each token with text until stop() is called, or set_graphs()
(Ctrl+G), which lets it go on to its end. A stop that came before the reply still counts;
quitting stops, so it releases the reply too. The server
sends the batch holding a reply's first text at once, so the app sees that text while the
reply waits. `session.replies = 0` before a restart: the next child holds nothing.
Production code knows nothing of this but `RemoteSession._command`, the child's command line.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

from chat_app.remote_session import RemoteSession, python
from tinyllm.chat_events import Token


class HeldInChild(RemoteSession):
    def __init__(self, open_kwargs: dict[str, Any], progress=None, *, replies: int = 1, **changes: Any):
        self.replies = replies  # read when a child starts (restart() starts another)
        super().__init__(open_kwargs, progress, **changes)

    def _command(self, fd: int) -> list[str]:
        return python(f"from tests.chat_app.held_child import serve_held; serve_held({self.replies})", fd)


def held_in_child(app, replies: int = 1):
    """The app, whose child processes hold their first `replies` replies until stopped."""
    opener = app.open_session  # partial(RemoteSession, open_kwargs)
    app.open_session = partial(HeldInChild, *opener.args, **opener.keywords, replies=replies)
    return app


# ---- in the child ----------------------------------------------------------------------------

def serve_held(replies: int) -> None:
    import tinyllm.chat as chat
    from tinyllm import chat_server

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
