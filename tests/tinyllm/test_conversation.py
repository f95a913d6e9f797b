"""Conversation, the torch-free part of ChatSession: it imports no torch, fits turns to the
context, rewinds its cache to the prefix it still shares, and undoes a turn exactly."""

import subprocess
import sys

import pytest

from tinyllm.chat_template import TEMPLATES
from tinyllm.conversation import Conversation, or_restore, stop_ids


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
    code = "import sys, tinyllm.conversation; assert 'torch' not in sys.modules, sorted(sys.modules)"
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
