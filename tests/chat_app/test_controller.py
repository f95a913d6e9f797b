"""The chat's controller without Textual: a view of plain objects, a real SQLite store, and the
worker's events handed in as the worker would send them (chat_app.controller, turn, replies)."""

from __future__ import annotations

import asyncio
import queue
from types import SimpleNamespace

import pytest

from chat_app.controller import ChatController
from chat_app.events import Failed, Finished, Loaded, LoadFailed, Prefilled, Started, Token
from chat_app.jobs import NewChat, Send
from chat_app.model_switch import NOT_SENT, WAITING
from chat_app.store import Store
from chat_app.turn import Turn, TurnState
from tinyllm.session.chat_events import StepStats
from tinyllm.session.session_protocol import Capabilities

STATS = StepStats(window=64, position=9, max_len=256, tokens=2, tok_per_s=100.0, ttft_ms=5.0, graphs=None)


class Shown:
    """A message on a plain screen."""

    def __init__(self, text: str = "", saved=None) -> None:
        self.text, self.saved, self.border_subtitle, self.marks, self.is_attached = text, saved, "", [], True
        self.finished: str | None = None

    def mark(self, note: str) -> None:
        self.marks.append(note)

    async def remove(self) -> None:
        self.is_attached = False

    async def write(self, text: str) -> None:
        self.text += text

    def resume(self) -> None:
        self.finished = None

    async def finish(self, reason: str) -> None:
        self.finished = reason


class Conversation:
    has_focus = False

    def __init__(self) -> None:
        self.items: list[Shown] = []
        self.notes: list[str] = []

    async def add_user(self, text, saved=None):
        self.items.append(Shown(text, saved))
        return self.items[-1]

    async def add_reply(self, title, text="", note="", saved=None):
        self.items.append(Shown(text, saved))
        return self.items[-1]

    async def add_note(self, text, saved=None):
        return await self.add_user(text, saved)

    def add_system_note(self, text, severity="information"):
        self.notes.append(text)

    def shown(self, saved):
        return next((w for w in self.items if w.saved is saved), None)

    def last_reply(self):
        return self.items[-1]

    async def clear(self) -> None:
        self.items = []


class View:
    def __init__(self) -> None:
        self.conversation = Conversation()
        self.prompt = SimpleNamespace(text="", given_back=[], give_back=lambda t: self.prompt.given_back.append(t))
        self.status = SimpleNamespace(fields={}, show=lambda **f: self.status.fields.update(f))
        self.load_progress = SimpleNamespace(start=lambda name: None, finish=lambda: None)
        self.said: list[tuple[str, str]] = []

    def say(self, message, severity="information"):
        self.said.append((message, severity))

    def note(self, message, severity="information"):
        self.conversation.add_system_note(message, severity)

    def titled(self, name):
        pass


def session(**over) -> SimpleNamespace:
    s = SimpleNamespace(
        name="tiny", device="cpu", weights="fp32", graphs_available=False, use_graph=False, max_len=256,
        model_max_len=256, context=range(0), step_kind="plain", family="llama", thinking=None, log_error="",
        context_note="", ended="", messages=[], stops=0, capabilities=Capabilities(False, False, 256),
        path="/m/tiny", params=SimpleNamespace(greedy=True))
    s.stop = lambda: setattr(s, "stops", s.stops + 1)
    for k, v in over.items():
        setattr(s, k, v)
    return s


@pytest.fixture
def chat(data_dir):
    """A controller over a real store and a plain view, its worker never started: jobs wait in its queue."""
    store = Store.open(data_dir)
    ctl = ChatController(lambda **_: None, store, spawn=lambda serve: None, deliver=lambda event: None)
    ctl.attach(View())
    yield ctl
    store.close()


def jobs(ctl: ChatController) -> list:
    out = []
    while True:
        try:
            out.append(ctl.core.worker.jobs.get_nowait())
        except queue.Empty:
            return out


def run(coro):
    return asyncio.run(coro)


def saved(ctl: ChatController) -> list[tuple[str, str, bool]]:
    return [(m.role, m.content, m.partial) for m in ctl.core.store.messages()]


def test_a_turn_moves_only_as_its_table_says():
    turn = Turn()
    turn.move(TurnState.PREFILLING)
    assert turn.busy
    with pytest.raises(AssertionError, match="PREFILLING to WAITING"):
        turn.move(TurnState.WAITING)
    turn.move(TurnState.STREAMING)
    turn.end()
    assert turn.state is TurnState.IDLE and not turn.busy


def test_a_message_is_saved_first_then_streams_and_is_saved_whole(chat):
    run(chat.models.loaded(session(), switched=False))
    accepted = []
    run(chat.submitted("Hello", None, lambda: accepted.append(saved(chat))))
    assert accepted == [[("user", "Hello", False)]]  # in the chat before the input gave it up
    assert chat.core.turn.state is TurnState.PREFILLING and jobs(chat) == [Send("Hello")]
    run(chat.handle([Started(Send("Hello")), Prefilled(5, 1.0), Token("Hi", STATS), Token(" there", STATS)]))
    assert chat.core.turn.state is TurnState.STREAMING
    assert chat.core.view.conversation.items[-1].text == "Hi there"  # one write of the batch's two tokens
    assert saved(chat)[-1] == ("assistant", "Hi there", True)  # its first text (the batch) at once, partial
    run(chat.handle([Finished("eos", "Hi there", STATS)]))
    assert chat.core.turn.state is TurnState.IDLE
    assert saved(chat) == [("user", "Hello", False), ("assistant", "Hi there", False)]


def test_esc_before_the_reply_begins_stops_it_again_at_its_prefill(chat):
    s = session()
    run(chat.models.loaded(s, switched=False))
    run(chat.submitted("Hello", None, lambda: None))
    chat.stop()
    assert chat.core.turn.state is TurnState.STOPPING and s.stops == 1
    run(chat.handle([Started(Send("Hello")), Prefilled(5, 1.0)]))
    assert chat.core.turn.state is TurnState.STOPPING and s.stops == 2
    run(chat.handle([Finished("stopped", "", STATS)]))
    assert chat.core.turn.state is TurnState.IDLE


def test_a_refused_message_leaves_the_chat_and_goes_back_to_the_input(chat):
    run(chat.models.loaded(session(), switched=False))
    run(chat.submitted("Too long", None, lambda: None))
    shown = chat.core.view.conversation.items[-1]
    run(chat.handle([Failed(Send("Too long"), "message too long")]))
    assert saved(chat) == [] and not shown.is_attached
    assert chat.core.view.prompt.given_back == ["Too long"]
    assert chat.core.turn.state is TurnState.IDLE and ("message too long", "error") in chat.core.view.said


def test_a_message_waits_for_the_first_model_and_goes_once_it_has_loaded(chat):
    run(chat.submitted("Early", None, lambda: None))
    shown = chat.core.view.conversation.items[-1]
    assert chat.core.turn.state is TurnState.WAITING and shown.marks == [WAITING]
    assert saved(chat) == [("user", "Early", False)] and jobs(chat) == []
    run(chat.submitted("Another", None, lambda: None))  # one waits at a time
    assert "already waiting" in chat.core.view.said[-1][0]
    run(chat.handle([Loaded(session())]))
    assert chat.core.turn.state is TurnState.PREFILLING and shown.marks == [WAITING, ""]
    assert jobs(chat) == [Send("Early")]


def test_a_waiting_message_comes_back_when_the_model_does_not_load(chat):
    run(chat.submitted("Early", None, lambda: None))
    run(chat.handle([LoadFailed(MemoryError("out of memory"), "could not load the model: out of memory")]))
    shown = chat.core.view.conversation.items[-1]
    assert chat.core.turn.state is TurnState.IDLE and shown.marks[-1] == NOT_SENT
    assert saved(chat) == [] and chat.core.view.prompt.given_back == ["Early"]


def test_a_model_refused_as_bad_input_ends_the_app_with_code_2(chat):
    exits = []
    chat.core.view.exit_app = exits.append
    run(chat.handle([LoadFailed(ValueError("no such file"), "could not load the model: no such file")]))
    assert exits == [2] and chat.core.bad_input == "no such file"


def test_a_served_session_says_its_capabilities_not_a_sentinel(chat):
    run(chat.models.loaded(session(capabilities=Capabilities(served=True, graphs=False, context=0)), switched=False))
    chat.toggle_graphs()
    assert "does not apply here" in chat.core.view.said[-1][0]
    assert chat.about()[1].startswith("Served by")


def test_ctrl_n_stops_the_reply_then_starts_a_new_chat(chat):
    s = session()
    run(chat.models.loaded(s, switched=False))
    run(chat.submitted("Hello", None, lambda: None))
    jobs(chat)
    chat.new_chat()
    assert s.stops == 1 and jobs(chat) == [NewChat()]
