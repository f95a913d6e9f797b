"""Fixtures for the app tests: one tiny random checkpoint per session, a tmp data folder per
test, and helpers that build the app from a command line and wait on conditions."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chat_app.__main__ import build_app, build_parser
from chat_app.app import ChatApp
from chat_app.widgets.prompt_input import PromptInput
from tinyllm.testing import make_tiny_checkpoint


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
    return folder


@pytest.fixture
def make_app(ckpt) -> Callable[..., ChatApp]:
    def make(*argv: str) -> ChatApp:
        compile = [] if "--compile" in argv else ["--compile", "off"]  # the plain step unless asked
        return build_app(build_parser().parse_args(["--model", str(ckpt), "--device", "cpu", *compile, *argv]))
    return make


async def wait_until(pilot, condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
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

    wait=False posts what Enter posts instead of pressing it: Pilot's key presses wait for
    the process to go idle (up to 2 s), which it does not while a reply streams."""
    app = pilot.app
    app.prompt.load_text(text)
    if not wait:
        app.prompt.post_message(PromptInput.Submitted(text))
        await pilot.pause(0.01)
        return
    await pilot.press("enter")
    await wait_until(pilot, lambda: not app._busy and not app.prompt.text, what=f"the reply to {text!r}")
    await pilot.pause()


def notices(app: ChatApp) -> list[str]:
    return [n.message for n in app._notifications]
