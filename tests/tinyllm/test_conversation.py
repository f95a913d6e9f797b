"""Conversation, the torch-free part of ChatSession: it imports no torch, fits turns to the
context, rewinds its cache to the prefix it still shares, and undoes a turn exactly."""

import subprocess
import sys

import pytest

from tinyllm.session.chat_events import Message
from tinyllm.session.conversation import Conversation, or_restore, stop_ids
from tinyllm.text.chat_template import TEMPLATES


class Bytes:
    """A tokenizer with one id per byte (ids 3..258): BOS 1, EOS 2."""
    bos_id, eos_id = 1, 2

    def encode(self, text: str) -> list[int]:
        return [b + 3 for b in text.encode()]

    def piece_to_id(self, piece: str) -> int | None:
        return None


class Cache:
    """Holds ids the way a decoder's cache does: a prefill appends, truncate(n) rewinds."""

    def __init__(self):
        self.ids: list[int] = []

    @property
    def n(self) -> int:
        return len(self.ids)

    def truncate(self, n: int) -> None:
        assert n <= self.n, "a rewind never grows the cache"
        del self.ids[n:]


def test_it_imports_no_torch():
    code = "import sys, tinyllm.session.conversation; assert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def talk(c: Conversation, cache: Cache, text: str, max_tokens: int) -> int:
    held = cache.n
    dropped, _ = c.add_user(text, max_tokens)
    assert cache.ids == c.context[:cache.n], "the cache holds a prefix of the context"
    assert dropped or cache.n == held, "a turn that fits rewinds nothing"
    cache.ids = list(c.context)  # the reply's prefill
    c.add_reply([7] * 3, "abc", stopped=False)
    return dropped


def test_full_context_drops_whole_turns_keeps_the_head_and_rewinds_the_cache():
    cache = Cache()
    c = Conversation(Bytes(), TEMPLATES["chatml"], 200, cache, system="Be brief.")
    head = c.head_ids()
    dropped = sum(talk(c, cache, f"turn {i}", 8) for i in range(8))
    assert dropped == c.first_message > 0 and len(c.messages) == 16
    assert c.context[:len(head)] == head and c.messages[c.first_message].role == "user"
    assert len(c.context) <= 200
    assert stop_ids(Bytes(), TEMPLATES["chatml"]) == {2}


def test_undo_puts_back_the_turns_a_failed_send_dropped():
    cache = Cache()
    c = Conversation(Bytes(), TEMPLATES["llama2"], 160, cache, system="sys")
    while c.first_message == 0:
        before = ([(m.role, m.ids) for m in c.messages], list(c.context), c.first_message)
        dropped, undo = c.add_user("one more turn", 8)

        def failing():
            raise OverflowError("before the first event")
            yield

        with pytest.raises(OverflowError):
            list(or_restore(failing(), undo))
        assert ([(m.role, m.ids) for m in c.messages], c.context, c.first_message) == before
        talk(c, cache, "one more turn", 8)


def test_errors_change_nothing():
    cache = Cache()
    c = Conversation(Bytes(), TEMPLATES["chatml"], 64, cache)
    talk(c, cache, "hi", 4)
    before = (list(c.messages), list(c.context))
    for call, match in [(lambda: c.add_user("  ", 4), "empty message"),
                        (lambda: c.add_user("x" * 100, 4), "message too long"),
                        (lambda: c.set_system("s" * 100, 4), "system prompt is too long")]:
        with pytest.raises(ValueError, match=match):
            call()
        assert (c.messages, c.context, c.system) == (*before, None)
    c.new_chat()
    with pytest.raises(ValueError, match="no reply to regenerate"):
        c.take_back_reply()
    with pytest.raises(ValueError, match="no reply to continue"):
        c.reopen_reply()


def test_an_edit_is_as_if_its_text_had_been_sent_instead():
    """Issue 34, item 7: the edited turn and its reply leave; the context is the one a fresh
    chat that sent the edited message builds, dropped turns included (they come back where the
    old turn's fitting dropped them), and the cache goes back to where it stood before the old
    turn (the fresh chat's prefill), or where that turn's fitting rewound it, to before."""
    for max_len in (1000, 200):  # no turn dropped; turns dropped by the old last turn
        turns = [f"turn {i}" for i in range(8)]
        edited, fresh = Cache(), Cache()
        a = Conversation(Bytes(), TEMPLATES["chatml"], max_len, edited, system="Be brief.")
        b = Conversation(Bytes(), TEMPLATES["chatml"], max_len, fresh, system="Be brief.")
        for t in turns[:-1]:
            talk(a, edited, t, 8)
            talk(b, fresh, t, 8)
        talk(a, edited, "a much longer last message than the others, " * 2, 8)
        assert max_len == 1000 or a.first_message > b.first_message, "the old last turn dropped turns"
        dropped, _ = a.replace_last_turn(turns[-1], 8)
        assert edited.ids == a.context[:edited.n] and edited.n < len(a.context), "a prefix, ready for the reply"
        dropped_b, _ = b.add_user(turns[-1], 8)
        if max_len == 1000:
            assert edited.ids == fresh.ids, "the cache where the fresh chat's stands: the same prefill"
        else:  # the old turn's fitting rewound the cache further: those positions are prefilled again
            assert edited.ids == fresh.ids[:edited.n]
        assert (a.context, a.first_message, dropped) == (b.context, b.first_message, dropped_b)
        assert [(m.role, m.content) for m in a.messages] == [(m.role, m.content) for m in b.messages]
        assert a.messages[-1] == Message("user", turns[-1], a.messages[-1].ids)


def test_a_failed_edit_puts_the_old_turn_back():
    cache = Cache()
    c = Conversation(Bytes(), TEMPLATES["chatml"], 200, cache)
    for t in ("one", "two", "three " * 8):
        talk(c, cache, t, 8)
    before = ([(m.role, m.ids) for m in c.messages], list(c.context), c.first_message)
    for text, match in (("  ", "empty message"), ("x" * 300, "message too long")):
        with pytest.raises(ValueError, match=match):
            c.replace_last_turn(text, 8)
        assert ([(m.role, m.ids) for m in c.messages], c.context, c.first_message) == before
    _, undo = c.replace_last_turn("two and a half", 8)  # accepted, then its reply fails before it starts

    def failing():
        raise OverflowError("before the first event")
        yield

    with pytest.raises(OverflowError):
        list(or_restore(failing(), undo))
    assert ([(m.role, m.ids) for m in c.messages], c.context, c.first_message) == before
    c.new_chat()
    with pytest.raises(ValueError, match="no message to edit"):
        c.replace_last_turn("hi", 8)


def test_an_edit_of_a_resumed_last_turn_without_its_reply():
    """A resumed chat can end with a user turn (its reply never began): the edit replaces it."""
    cache = Cache()
    c = Conversation(Bytes(), TEMPLATES["llama2"], 400, cache, system="sys")
    c.load_messages([("user", "hi"), ("assistant", "hello"), ("user", "what?")])
    c.replace_last_turn("why?", 8)
    ref = Conversation(Bytes(), TEMPLATES["llama2"], 400, Cache(), system="sys")
    ref.load_messages([("user", "hi"), ("assistant", "hello"), ("user", "why?")])
    assert [m.content for m in c.messages] == ["hi", "hello", "why?"] and c.context == ref.context


def test_a_resumed_chat_longer_than_the_context_keeps_its_latest_turns():
    cache = Cache()
    c = Conversation(Bytes(), TEMPLATES["chatml"], 200, cache, system="Be brief.")
    c.load_messages([m for i in range(12) for m in (("user", f"question {i}"), ("assistant", f"answer number {i}"))])
    assert len(c.messages) == 24 and 0 < c.first_message and c.messages[c.first_message].role == "user"
    assert len(c.head_ids()) < len(c.context) <= 200  # what the status bar's pos shows: within the context
    assert c.messages[-1].content == "answer number 11"
