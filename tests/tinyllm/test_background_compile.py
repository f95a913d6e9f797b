"""BackgroundCompile.paused(), held by a reply from its prefill to its last token: on Python 3.12+
the compile thread stops in a profile hook (while the reply beats, at least once every PAUSE_MAX_S),
everywhere the switch interval drops; both are undone after. No test here waits on a clock: each waits on the compile
thread's state, with a deadline that only bounds a failure. The 3.12 tests skip on older
Pythons (CI's is 3.11); they run in a 3.12 venv and on the H200 (3.12)."""

import sys
import threading
import time

import pytest
import torch

from tinyllm.decode import background_compile as bc
from tinyllm.decode.background_compile import BackgroundCompile

DEADLINE_S = 600


@pytest.fixture(autouse=True)
def _no_other_compile_running():
    """The switch interval is global: a compile left running by an earlier test would restore
    its own when it ends, in the middle of these tests. Wait for any to end first."""
    for t in threading.enumerate():
        if t.name == "tinyllm-compile":
            t.join(DEADLINE_S)
            assert not t.is_alive(), "an earlier test's compile is still running"


def stalled_compile(monkeypatch):
    """Hold every compile thread just before it compiles: (arrived, go) events."""
    real, arrived, go = bc.compile_step, threading.Event(), threading.Event()

    def held(*args, **kwargs):
        arrived.set()
        go.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(bc, "compile_step", held)
    return arrived, go


def held_compile(model, monkeypatch) -> tuple[BackgroundCompile, threading.Event]:
    """A BackgroundCompile of `model` whose thread has reached its compile and waits there for
    the returned event."""
    arrived, go = stalled_compile(monkeypatch)
    c = BackgroundCompile(model, 1, 64, "eager")
    assert arrived.wait(DEADLINE_S)
    return c, go


@torch.no_grad()
def test_the_switch_interval_is_short_while_compiling_shorter_while_paused_and_restored(model, monkeypatch):
    before = sys.getswitchinterval()
    c, go = held_compile(model, monkeypatch)
    assert sys.getswitchinterval() == pytest.approx(bc.COMPILE_SWITCH_S)
    with c.paused():
        assert sys.getswitchinterval() == pytest.approx(bc.PAUSED_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(bc.COMPILE_SWITCH_S)
    go.set()
    assert c.wait(DEADLINE_S) and c.state == "compiled", c.error
    assert sys.getswitchinterval() == pytest.approx(before)


@torch.no_grad()
def test_a_compile_that_ends_inside_a_pause_leaves_the_interval_as_it_was(model, monkeypatch):
    before = sys.getswitchinterval()
    c, go = held_compile(model, monkeypatch)
    with c.paused():
        go.set()
        assert c.wait(DEADLINE_S) and c.state == "compiled", c.error
        assert sys.getswitchinterval() == pytest.approx(bc.PAUSED_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(before)


def in_gate(c: BackgroundCompile) -> bool:
    frame = sys._current_frames().get(c._thread.ident)
    while frame is not None:
        if frame.f_code is BackgroundCompile._gate.__code__:
            return True
        frame = frame.f_back
    return False


def wait_until(condition, what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


needs_312 = pytest.mark.skipif(not hasattr(threading, "setprofile_all_threads"),
                               reason="stopping the compile thread needs Python 3.12's setprofile_all_threads")


@needs_312
@torch.no_grad()
def test_a_paused_compile_stops_in_its_gate_then_finishes(model, monkeypatch):
    c, go = held_compile(model, monkeypatch)
    with c.paused():
        go.set()  # its next Python event is a return: the gate stops it there
        wait_until(lambda: in_gate(c), "the compile thread to stop in its gate")
        assert c.state == "compiling" and not c.ready.is_set()
    assert sys.getprofile() is None
    assert c.wait(DEADLINE_S) and c.state == "compiled", c.error


@torch.no_grad()
def test_a_stopped_compile_waits_while_the_reply_beats_and_no_longer(model, monkeypatch):
    """hold(): each wait of PAUSE_MAX_S that saw a beat is followed by another; the first that saw
    none ends it (the reply may be waiting on a lock the compile thread holds). The pause's event
    is a stand-in whose every wait times out, beating in the first three: no clock involved."""
    c, go = held_compile(model, monkeypatch)
    waits, real_go = [], c._go

    class Unset:
        def wait(self, timeout):
            waits.append(timeout)
            if len(waits) <= 3:
                c.beat()
            return False

    c._go = Unset()
    c.hold()
    assert waits == [bc.PAUSE_MAX_S] * 4
    c._go = real_go  # set: a pause that ended
    c.hold()  # returns at once
    go.set()
    assert c.wait(DEADLINE_S) and c.state == "compiled", c.error


@needs_312
@torch.no_grad()
def test_a_stop_lasts_at_most_its_limit_so_a_held_lock_cannot_deadlock(model, monkeypatch):
    """Paused for longer than PAUSE_MAX_S (as if the prefill waited on a lock the compile thread
    holds), the compile goes on and finishes inside the same pause."""
    monkeypatch.setattr(bc, "PAUSE_MAX_S", 0.01)
    c, go = held_compile(model, monkeypatch)
    with c.paused():
        go.set()
        assert c.wait(DEADLINE_S) and c.state == "compiled", c.error


def test_a_reply_sent_while_compiling_pauses_the_compile_until_its_last_token(tmp_path, monkeypatch):
    from tinyllm.session.chat import Finished, Prefilled, open_session
    from tinyllm.tools.testing import make_tiny_checkpoint

    arrived, go = stalled_compile(monkeypatch)
    held_during = []
    real_paused = BackgroundCompile.paused

    def spy(self):
        held_during.append(self.state)
        return real_paused(self)

    monkeypatch.setattr(BackgroundCompile, "paused", spy)
    s = open_session(make_tiny_checkpoint(tmp_path / "tiny", max_seq_len=256), "cpu", max_len=256,
                     compile="eager")
    assert arrived.wait(DEADLINE_S) and s.step_kind == "compiling"
    c = s.policy.background
    events = iter(s.send("Hello!"))
    assert isinstance(next(events), Prefilled) and held_during == ["compiling"]
    rest = []
    for e in events:  # every token, the last included, comes while the pause holds
        assert sys.getswitchinterval() == pytest.approx(bc.PAUSED_SWITCH_S), e
        rest.append(e)
    assert isinstance(rest[-1], Finished) and len(rest) > 1
    assert sys.getswitchinterval() == pytest.approx(bc.COMPILE_SWITCH_S)  # released after the reply
    assert c._beats >= 1  # a beat each chunk read
    go.set()
    assert s.wait_compiled(DEADLINE_S) and s.step_kind == "compiled", s.compile_error
    list(s.send("Again."))  # compiled now: nothing to pause
    assert held_during == ["compiling"]
