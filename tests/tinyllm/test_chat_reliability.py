"""ChatSession, all or nothing: a failed regenerate keeps the reply; a resumed chat that ends
in a user turn (a crash before the reply began) still alternates."""

import pytest

from tinyllm.decode.sampling import SamplingParams
from tinyllm.session.chat import Finished, open_session
from tinyllm.tools.testing import make_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", max_seq_len=256)


def overflow(*args, **kwargs):
    raise OverflowError("Overflow when unpacking long")


def state(s) -> tuple:
    return [(m.role, m.content) for m in s.messages], list(s.context), s.first_message


def test_regenerate_that_fails_before_it_starts_keeps_the_reply(ckpt, monkeypatch):
    s = open_session(ckpt, "cpu", compile=None)
    s.set_param("max_tokens", "8")
    list(s.send("Hello!"))
    before = state(s)
    monkeypatch.setattr(s.decoder.sampler, "load", overflow)  # fails after the prefill, before any event
    with pytest.raises(OverflowError):
        list(s.regenerate())
    assert state(s) == before
    monkeypatch.undo()
    assert isinstance(list(s.regenerate())[-1], Finished) and len(s.messages) == 2


def test_send_that_fails_before_it_starts_changes_nothing(ckpt, monkeypatch):
    s = open_session(ckpt, "cpu", compile=None)
    s.set_param("max_tokens", "8")
    list(s.send("Hello!"))
    before = state(s)
    monkeypatch.setattr(s.decoder.sampler, "load", overflow)
    with pytest.raises(OverflowError):
        list(s.send("Again?"))
    assert state(s) == before  # the user turn is taken back, the cache rewound
    monkeypatch.undo()
    events = list(s.send("Again?"))
    assert isinstance(events[-1], Finished) and [m.role for m in s.messages] == ["user", "assistant"] * 2
    fresh = open_session(ckpt, "cpu", compile=None)  # the same turns, never failed: the same reply
    fresh.set_param("max_tokens", "8")
    list(fresh.send("Hello!"))
    assert list(fresh.send("Again?"))[-1].text == events[-1].text


def test_send_that_fails_after_dropping_turns_brings_them_back(ckpt, monkeypatch):
    s = open_session(ckpt, "cpu", max_len=64, compile=None)
    s.set_param("max_tokens", "4")
    while s.first_message == 0 and len(s.messages) < 40:
        before = state(s)
        monkeypatch.setattr(s.decoder.sampler, "load", overflow)
        with pytest.raises(OverflowError):
            list(s.send("one more turn please"))
        assert state(s) == before  # also when this turn made the session drop the oldest turns
        monkeypatch.undo()
        list(s.send("one more turn please"))
    assert s.first_message > 0, "the context never filled: the drop path was not exercised"


def test_resumed_chat_ending_with_a_user_turn_alternates(ckpt):
    s = open_session(ckpt, "cpu")
    s.set_param("max_tokens", "4")
    s.load_messages([("user", "one"), ("user", "two")])  # a crash twice before any reply began
    assert [m.role for m in s.messages] == ["user", "assistant", "user"]
    list(s.regenerate())  # the last turn's reply
    list(s.send("three"))
    assert [m.role for m in s.messages] == ["user", "assistant"] * 3


@pytest.mark.parametrize("field,value", [("temperature", float("nan")), ("top_p", float("inf")),
                                         ("repeat_penalty", float("nan")), ("seed", 2**64), ("seed", -2**63 - 1)])
def test_sampling_refuses_non_finite_values_and_huge_seeds(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1


def test_a_system_prompt_too_long_for_the_context_is_named_as_the_cause(ckpt):
    """Before, /system with more than the context made every message fail with "message too
    long: 12 tokens", which blamed the message."""
    s = open_session(ckpt, "cpu", compile=None, max_len=64)
    s.set_param("max_tokens", "8")
    long = "a very long system prompt " * 40
    with pytest.raises(ValueError, match="system prompt is too long"):
        s.set_system(long)  # refused, changing nothing
    assert s.system is None
    assert isinstance(list(s.send("Hi"))[-1], Finished)
    s.load_messages([("system", long), ("user", "Hi"), ("assistant", "Hello")])  # a resumed chat holds one
    with pytest.raises(ValueError, match="^the system prompt is too long: .* shorten it"):
        list(s.send("Hello?"))
    s.set_system("Be brief.")
    with pytest.raises(ValueError, match="^message too long"):  # a message too long is still the message
        list(s.send("word " * 200))
