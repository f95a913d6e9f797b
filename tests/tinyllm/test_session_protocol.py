"""tinyllm.session.session_protocol: torch-free; one JOBS table whose names are Session methods that
ChatSession and RemoteSession both have; the server answers each Call by its id as JOBS says."""

import multiprocessing as mp
import pickle
import subprocess
import sys
import threading
from typing import get_args

import pytest

from chat_app.remote_session import RemoteSession
from tinyllm.session.chat_events import Finished, Token
from tinyllm.session.session_protocol import (
    JOBS,
    Call,
    Done,
    Events,
    Job,
    Loaded,
    ModelProcess,
    Progress,
    Quit,
    Runs,
    Session,
    SessionState,
    Started,
)
from tinyllm.tools.testing import make_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", max_seq_len=256)


def members(protocol: type) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")}


def test_the_protocol_imports_no_torch():
    code = ("import sys\nimport tinyllm.session.session_protocol, chat_app.remote_session\n"
            "assert 'torch' not in sys.modules, 'the protocol imported torch'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_job_is_a_session_method_of_both_sessions(ckpt):
    from tinyllm.session.chat import open_session

    assert set(get_args(Job)) == set(JOBS)
    assert set(JOBS) <= members(Session) and all(callable(getattr(Session, job)) for job in JOBS)
    session = open_session(ckpt, "cpu", compile=None)
    assert all(hasattr(session, name) for name in members(Session)), members(Session) - set(dir(session))
    assert all(hasattr(RemoteSession, name) for name in members(Session) | members(ModelProcess) - {"path",
                                                                                                  "log_error"})
    state = SessionState.of(session)
    assert pickle.loads(pickle.dumps(state)) == state and state.context_len == len(session.context)


def test_the_server_answers_each_call_by_its_id(ckpt):
    from tinyllm.session.chat_server import serve

    parent, child = mp.Pipe()
    server = threading.Thread(target=serve, args=(child, dict(path=ckpt, device="cpu", compile=None)), daemon=True)
    server.start()
    while not isinstance(msg := parent.recv(), Loaded):
        assert isinstance(msg, Progress)
    parent.send(Call(1, "set_param", ("max_tokens", "4")))
    answer = parent.recv()
    assert answer == Done(1, None, answer.state) and answer.state.params.max_tokens == 4
    parent.send(Call(2, "set_param", ("top_k", "-1")))  # refused: its ValueError's message
    assert parent.recv().error.startswith("top_k must be")
    parent.send(Call(3, "send", ("Hello",)))
    assert isinstance(started := parent.recv(), Started) and started.id == 3
    events = []
    while isinstance(msg := parent.recv(), Events):
        assert msg.id == 3
        events += msg.events
    assert isinstance(events[-1], Finished) and msg.state.last_stats == events[-1].stats
    assert any(isinstance(e, Token) for e in events)
    assert msg == Done(3, None, msg.state) and [m.role for m in msg.state.messages] == ["user", "assistant"]
    parent.send(Call(4, "continue_reply"))
    while not isinstance(msg := parent.recv(), Done):
        pass
    assert msg.error is None and len(msg.state.messages) == 2
    parent.send(Call(5, "send", (" ",)))  # refused before it starts: no Started
    assert parent.recv() == Done(5, "empty message", None)
    assert JOBS["new_chat"] is Runs.TASK
    parent.send(Call(6, "new_chat"))
    assert (done := parent.recv()).id == 6 and done.state.messages == []
    parent.send(Quit())
    server.join(60)
    assert not server.is_alive()


def test_an_edit_through_the_child_process_replies_as_a_fresh_chat(ckpt):
    """Issue 34, item 7: the job `edit` (a REPLY) across the pipe replaces the last turn and its
    reply; the greedy reply equals a fresh ChatSession's that sent the edited message."""
    from tinyllm.session.chat import open_session

    assert JOBS["edit"] is Runs.REPLY
    remote = RemoteSession(dict(path=ckpt, device="cpu", compile=None))
    fresh = open_session(ckpt, "cpu", compile=None)
    try:
        for s in (remote, fresh):
            s.set_param("max_tokens", "12")
        with pytest.raises(ValueError, match="no message to edit"):
            remote.edit("Hi")
        list(remote.send("Hello!"))
        list(remote.send("What is the capital of France?"))
        with pytest.raises(ValueError, match="empty message"):  # refused before it starts: nothing changed
            remote.edit(" ")
        assert len(remote.messages) == 4
        events = list(remote.edit("Tell me a joke."))
        list(fresh.send("Hello!"))
        expected = list(fresh.send("Tell me a joke."))
        assert isinstance(events[-1], Finished) and events[-1].text == expected[-1].text
        assert [(m.role, m.content) for m in remote.messages] == [(m.role, m.content) for m in fresh.messages]
        assert len(remote.context) == len(fresh.context)
    finally:
        remote.close()
