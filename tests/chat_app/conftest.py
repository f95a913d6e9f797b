"""Fixtures for the app tests: one tiny random checkpoint per session, a tmp data folder per
test, and helpers that build the app from a command line and wait on conditions.

No test depends on timing. The session runs in a child process (chat_app.remote_session), so
nothing here reaches into it; two real interfaces keep a reply running while a test acts:
- what the APP sees: `Held` wraps the RemoteSession the app calls; the reply's events after
  its first token wait at a gate until the test releases them (or Esc, which also stops the
  child's reply). The child decodes on meanwhile; its events queue in the RemoteSession.
- what the SESSION does: `held_in_child(app)` (tests/chat_app/held_child.py) runs the app's
  child with its ChatSession wrapped: the first reply waits after its first text until a
  stop() (Esc, Ctrl+N) arrives, so a test that stops a reply mid-way cannot see it end first,
  on any CPU.
  `--ignore-eos` (a real CLI option) makes sure that first token is not the end."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chat_app.__main__ import build_app, build_parser
from chat_app.app import ChatApp
from chat_app.store import Saved, Store
from chat_app.widgets.prompt_input import PromptInput
from tests.chat_app.held_child import held_in_child  # noqa: F401 (the tests import it from here)
from tinyllm.session.chat_events import Token
from tinyllm.tools.testing import make_tiny_checkpoint


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # async tests run with anyio's pytest plugin (`pytestmark` in each module)


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> Path:
    # 2048 positions: a reply with a large max_tokens runs a few seconds (time to press Esc).
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", max_seq_len=2048)


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("TINYLLM_CHAT_DATA_DIR", str(folder))
    monkeypatch.setenv("TINYLLM_CHAT_CONFIG_DIR", str(tmp_path / "config"))  # never the user's config
    return folder


@pytest.fixture
def make_app(ckpt) -> Callable[..., ChatApp]:
    def make(*argv: str) -> ChatApp:
        compile = [] if "--compile" in argv else ["--compile", "off"]  # the plain step unless asked
        # The tiny random model loops: its replies run as long as a test asks (no repetition stop),
        # and the same as before DRY (tests that want them say so: argparse's last value wins).
        loops = ["--repeat-stop", "off", "--dry-multiplier", "0"]
        app = build_app(build_parser().parse_args(["--model", str(ckpt), "--device", "cpu", *compile, *loops, *argv]))
        # Notices stay up until the test reads them: a notice shown at mount must not expire
        # while the session's child process starts (seconds, on a loaded machine).
        app.NOTIFICATION_TIMEOUT = 3600
        return app
    return make


class Held:
    """The app's session (a RemoteSession) whose replies, as the app sees them, pause after
    their first token until `release()` (or stop(), which Esc calls and which stops the child's
    reply too; or close(), when the app quits): a reply that is certainly still running for
    the app, on any CPU."""

    def __init__(self, session) -> None:
        self._session = session
        self.gate = threading.Event()
        self.held = threading.Event()  # a reply is waiting at the gate now

    def __getattr__(self, name: str):
        return getattr(self._session, name)

    def release(self) -> None:
        self.gate.set()

    def stop(self) -> None:
        self.gate.set()
        self._session.stop()

    def close(self) -> None:  # the app quits: nothing waits at the gate any more
        self.gate.set()
        self._session.close()

    def send(self, text: str) -> Iterator:
        return self._hold(self._session.send(text))

    def regenerate(self, *params) -> Iterator:
        return self._hold(self._session.regenerate(*params))

    def _hold(self, events: Iterator) -> Iterator:
        for event in events:
            yield event
            if isinstance(event, Token) and not self.gate.is_set():
                self.held.set()
                self.gate.wait(timeout=300)
                self.held.clear()


@pytest.fixture
def make_held_app(make_app) -> Callable[..., tuple[ChatApp, list[Held]]]:
    """make_app, with the session wrapped in `Held` (or `wrapper`: the list gets it once it has loaded)."""
    def make(*argv: str, wrapper: Callable = Held) -> tuple[ChatApp, list[Held]]:
        app = make_app(*argv)
        opened: list[Held] = []
        real_open = app.open_session

        def open_held(**kwargs):
            opened.append(wrapper(real_open(**kwargs)))
            return opened[-1]

        app.open_session = open_held
        return app, opened
    return make


def saved_chat(data_dir: Path) -> list[Saved]:
    """The last conversation as another instance would resume it."""
    store = Store.open(data_dir)
    try:
        return store.resume_last()[0]
    finally:
        store.close()


def rows(data_dir: Path) -> list[tuple]:
    """Every message row in chat.db: (id, conversation, role, content, stopped, partial)."""
    with sqlite3.connect(data_dir / "chat.db") as db:
        return db.execute("SELECT id, conversation, role, content, stopped, partial FROM messages "
                          "ORDER BY id").fetchall()


async def wait_until(pilot, condition: Callable[[], bool], timeout: float = 300.0, what: str = "") -> None:
    """Wait on state. The timeout only stops a hung test; it is far past any loaded machine."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await pilot.pause(0.02)


async def loaded(pilot) -> ChatApp:
    app = pilot.app
    await wait_until(pilot, lambda: app.session is not None, what="the model to load")
    return app


async def send(pilot, text: str, wait: bool = True) -> None:
    """Put text into the prompt and press Enter, then wait for the reply to finish.

    wait=False posts what Enter posts instead of pressing it (Pilot's key presses wait for
    the process to go idle, up to 2 s, which it does not while a reply streams), and returns
    once the app has handled it: the reply is then queued (the app is busy) or refused."""
    app = pilot.app
    app.prompt.load_text(text)
    if not wait:
        handled = asyncio.Event()
        app.post_message(PromptInput.Submitted(text))  # straight to the app, which handles it
        app.call_later(handled.set)  # queued behind it
        await asyncio.wait_for(handled.wait(), 300)
        return
    await pilot.press("enter")
    await wait_until(pilot, lambda: not app.busy and not app.prompt.text, what=f"the reply to {text!r}")
    await pilot.pause()


async def regenerate(pilot, what: str = "the regenerated reply") -> None:
    """Ctrl+R, then wait until the session was asked for the reply and it ended. `not app.busy`
    alone can hold before the key does anything: Pilot's press returns before a binding's key
    has bubbled up to the app (on a loaded CI host a second Ctrl+R was then refused as busy)."""
    app = pilot.app
    session = app.session
    asked = threading.Event()
    inner = session.regenerate  # the RemoteSession's (or a test's own wrapper of it)

    def counted(*params):  # called on the app's worker thread, once the key's job runs
        asked.set()
        return inner(*params)

    session.regenerate = counted
    try:
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: asked.is_set() and not app.busy, what=what)
    finally:
        session.regenerate = inner


def notices(app: ChatApp) -> list[str]:
    return [n.message for n in app._notifications]


def notes(app: ChatApp) -> list[str]:
    """What commands said back: the notes in the conversation (chat_app.widgets.system_note)."""
    from chat_app.widgets.system_note import SystemNote

    return [n.text for n in app.query(SystemNote)]


@pytest.fixture
def stub() -> Iterator:
    """A stand-in OpenAI-compatible server (tests/chat_app/openai_stub.py), scripted by the test."""
    from tests.chat_app.openai_stub import OpenAIStub

    server = OpenAIStub()
    yield server
    server.close()
