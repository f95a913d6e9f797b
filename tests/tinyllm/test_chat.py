"""ChatSession: incremental turns against full re-prefill, context trimming, stop, regenerate."""

from functools import partial
from pathlib import Path

import pytest
import torch

from tests.tinyllm.forced import assert_replies_part_only_at_a_near_tie
from tinyllm.session.chat import Finished, Prefilled, Token
from tinyllm.session.chat import open_session as open_compiled
from tinyllm.tools.testing import make_tiny_checkpoint

TURNS = ["Hello!", "What is the capital of France?", "Tell me a joke.", "Numbers: 1 2 3",
         "Café in Zürich 🙂", "Write a poem about the sea."]


# The plain step: these tests are about turns and the context (the compiled step: test_chat_decode.py).
open_session = partial(open_compiled, compile=None)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", max_seq_len=1024)


def reply(session, text):
    events = list(session.send(text))
    assert isinstance(events[0], Prefilled) and isinstance(events[-1], Finished)
    assert all(isinstance(e, Token) for e in events[1:-1])
    assert "".join(e.text for e in events[1:-1]) == events[-1].text
    return events


def test_offset_prefill_reply_equals_full_reprefill(ckpt):
    """A turn prefilled at an offset into the cache replies as one whose whole conversation is
    prefilled again. Their prefills' arithmetic differs (other lengths) and each session draws
    its own tokens: the replies are equal up to a near-tie of the logits, where they may part
    (tests/tinyllm/forced.py), and from there the two chats hold different texts."""
    inc = open_session(ckpt, "cpu", max_len=1024)
    full = open_session(ckpt, "cpu", max_len=1024)
    for turn in TURNS:
        full.set_param("max_tokens", "24")
        inc.set_param("max_tokens", "24")
        full.decoder.truncate(0)  # forget the cache: this turn prefills the whole conversation
        a, b = reply(inc, turn), reply(full, turn)
        assert b[0].n_tokens == len(full.context) - len(full.messages[-1].ids)
        assert a[0].n_tokens < b[0].n_tokens or turn == TURNS[0]
        assert_replies_part_only_at_a_near_tie(inc, full, what=turn)
        if inc.messages[-1].ids != full.messages[-1].ids:
            return  # parted at a near-tie: the chats go on with different texts
        assert a[-1].text == b[-1].text
    assert inc.context == full.context


def test_cache_holds_a_prefix_of_the_context(ckpt):
    s = open_session(ckpt, "cpu", max_len=1024)
    for turn in TURNS[:3]:
        reply(s, turn)
        assert s.decoder.n <= len(s.context)
        # the cache's K at its positions equal a fresh prefill of the same ids
        ids = torch.tensor([s.context[: s.decoder.n]])
        ref = open_session(ckpt, "cpu", max_len=1024)
        ref.decoder.prefill(ids)
        assert (ref.decoder.cache.k[0][:, :, : s.decoder.n] - s.decoder.cache.k[0][:, :, : s.decoder.n]).abs().max() < 1e-4


def test_context_full_drops_oldest_turns_and_keeps_working(ckpt):
    s = open_session(ckpt, "cpu", max_len=128, system="You are terse.")
    s.set_param("max_tokens", "40")
    dropped = 0
    for i in range(12):
        events = reply(s, TURNS[i % len(TURNS)])
        dropped += events[0].dropped
        # The cache never holds more than the context: a reply's last id is drawn, never fed, so
        # the ids (with the turn's closing suffix) may pass 128 until the next turn fits them.
        assert s.decoder.n <= 128 and events[-1].stats.position <= 128
    assert dropped == s.first_message > 0  # every dropped message was reported
    assert len(s.messages) == 24  # everything said is kept
    assert s.context[: len(s.conversation.head_ids())] == s.conversation.head_ids()  # system prompt kept


def test_message_too_long_is_a_clear_error_and_changes_nothing(ckpt):
    s = open_session(ckpt, "cpu", max_len=128)
    reply(s, "Hello!")
    before = (list(s.context), len(s.messages))
    with pytest.raises(ValueError, match="message too long"):
        s.send("word " * 400)
    assert (s.context, len(s.messages)) == before
    reply(s, "Still here?")


def test_stop_mid_reply_keeps_partial_text(ckpt):
    s = open_session(ckpt, "cpu", max_len=1024)
    s.set_param("max_tokens", "200")
    it = s.send("Hello!")
    got = [next(it) for _ in range(6)]  # Prefilled + 5 tokens
    s.stop()
    rest = list(it)
    assert rest[-1].reason == "stopped"
    assert s.messages[-1].stopped and s.messages[-1].role == "assistant"
    assert len(s.messages[-1].ids) - len(s.encode(s.template.assistant_suffix)) == 5
    assert rest[-1].text.startswith("".join(e.text for e in got[1:]))
    reply(s, "Next message works")


def test_regenerate_greedy_gives_the_same_reply(ckpt):
    s = open_session(ckpt, "cpu", max_len=1024)
    s.set_param("max_tokens", "30")
    first = reply(s, "Hello!")[-1].text
    context = list(s.context)
    again = list(s.regenerate())
    assert again[-1].text == first and s.context == context and len(s.messages) == 2


def test_regenerate_with_its_own_settings_leaves_the_chats_as_they_were(ckpt):
    """The app's Ctrl+R in a greedy chat: regenerate(params.regenerating(seed)) samples at
    regen_temperature with that seed, and the chat stays greedy."""
    s = open_session(ckpt, "cpu", max_len=1024)
    s.set_param("max_tokens", "30")
    greedy = reply(s, "Hello!")[-1].text
    assert s.params.regen_temperature == 0.8
    sampled = {seed: list(s.regenerate(s.params.regenerating(seed)))[-1].text for seed in (1, 2)}
    assert s.params.greedy and s.params.seed is None  # the chat's settings stay
    assert sampled[1] != greedy and sampled[2] != greedy and sampled[1] != sampled[2]
    assert list(s.regenerate(s.params.regenerating(1)))[-1].text == sampled[1]  # seeded: the same sample
    assert list(s.regenerate())[-1].text == greedy  # greedy again without
    assert len(s.messages) == 2
    s.set_param("regen_temperature", "0")
    assert list(s.regenerate(s.params.regenerating(3)))[-1].text == greedy  # 0: greedy, the same reply
    with pytest.raises(ValueError, match=r"regen_temperature must be 0 \(greedy\) or from 0.001 to 100"):
        s.set_param("regen_temperature", "200")


def test_sampling_settings_and_seed(ckpt):
    s = open_session(ckpt, "cpu", max_len=1024)
    for k, v in [("temperature", "0.9"), ("top_p", "0.9"), ("top_k", "40"), ("seed", "7"), ("max_tokens", "20")]:
        s.set_param(k, v)
    a = reply(s, "Hello!")[-1].text
    b = list(s.regenerate())[-1].text
    assert a == b  # the same seed restarts the same stream
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or from 0.001 to 100, got -1.0"):
        s.set_param("temperature", "-1")
    with pytest.raises(ValueError, match="unknown setting"):
        s.set_param("bogus", "1")


def test_graphs_unavailable_on_cpu(ckpt):
    s = open_session(ckpt, "cpu")
    assert not s.graphs_available and reply(s, "Hi")[-1].stats.graphs is None
    # on a CPU the switch is the native step's, which this session (no compile asked) has not
    with pytest.raises(ValueError, match="the native CPU step does not run this session"):
        s.set_graphs(True)
    assert not s.use_graph


def test_new_chat_and_resume(ckpt):
    s = open_session(ckpt, "cpu", max_len=1024)
    s.set_param("max_tokens", "10")
    reply(s, "Hello!")
    reply(s, "Again")
    saved = [(m.role, m.content) for m in s.messages]
    r = open_session(ckpt, "cpu", max_len=1024)
    r.load_messages(saved)
    assert [(m.role, m.content) for m in r.messages] == saved
    reply(r, "And now?")
    s.new_chat()
    assert s.messages == [] and s.decoder.n <= 1


@pytest.mark.parametrize("template", ["llama2", "zephyr", "chatml"])
def test_other_templates_run(ckpt, template):
    s = open_session(ckpt, "cpu", max_len=256, system="Be brief.", template=template)
    s.set_param("max_tokens", "8")
    reply(s, "Hello!")
    reply(s, "Again")
    assert s.context[0] == s.tokenizer.bos_id


@pytest.mark.cuda
def test_graph_toggle_mid_reply_gives_identical_tokens(ckpt):
    on = open_session(ckpt, "cuda", max_len=1024, use_graph=True, compile=None)  # the plain step's graphs
    off = open_session(ckpt, "cuda", max_len=1024, use_graph=False, compile=None)
    for s in (on, off):
        s.set_param("max_tokens", "300")
    texts = []
    for s, toggle in ((on, True), (off, False)):
        out = []
        for i, ev in enumerate(s.send("Hello!")):
            if toggle and i % 5 == 0:
                s.set_graphs(not s.use_graph)
            out.append(ev)
        texts.append((out[-1].text, s.messages[-1].ids))
    assert texts[0] == texts[1]


def test_one_trim_that_drops_several_turns_reports_them_all(ckpt):
    s = open_session(ckpt, "cpu", max_len=128)
    s.set_param("max_tokens", "4")
    while len(s.context) < 100:
        reply(s, "Hi")
    long = "word " * 20
    assert len(s.context) + len(s.conversation.user_ids(long, False)) + 4 > 128  # this turn must trim
    events = reply(s, long)
    assert events[0].dropped >= 4 and events[0].dropped == s.first_message


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("max_len", [1024, 128], ids=["fits", "drops-turns"])
def test_an_edit_replies_as_a_fresh_chat_that_sent_the_edited_message(ckpt, device, max_len):
    """Issue 34, item 7: edit(text) replaces the last turn and its reply; the greedy reply is
    the one a fresh chat that sent `text` instead gives, token for token: the cache goes back
    to where it stood before the old turn, so the new turn's prefill is the fresh chat's."""
    edited, fresh = open_session(ckpt, device, max_len=max_len), open_session(ckpt, device, max_len=max_len)
    for s in (edited, fresh):
        s.set_param("max_tokens", "24")
    for turn in TURNS[:3] if max_len > 128 else TURNS[:3] * 2:
        assert reply(edited, turn)[-1].text == reply(fresh, turn)[-1].text
    old = reply(edited, TURNS[5])[-1].text
    events = list(edited.edit(TURNS[4]))
    assert isinstance(events[0], Prefilled) and isinstance(events[-1], Finished)
    new = reply(fresh, TURNS[4])
    assert events[-1].text == new[-1].text != old
    assert edited.context == fresh.context and edited.first_message == fresh.first_message
    assert [(m.role, m.content, m.ids) for m in edited.messages] == [(m.role, m.content, m.ids) for m in fresh.messages]
    assert (events[0].n_tokens, events[0].dropped) == (new[0].n_tokens, new[0].dropped)  # the same prefill
    assert (events[0].dropped > 0) == (max_len == 128)  # the old turn's fitting dropped turns: so does the edit's
    assert reply(edited, "And then?")[-1].text == reply(fresh, "And then?")[-1].text  # the chat goes on as one


def test_a_refused_or_failed_edit_changes_nothing(ckpt, monkeypatch):
    s = open_session(ckpt, "cpu", max_len=128)
    s.set_param("max_tokens", "8")
    with pytest.raises(ValueError, match="no message to edit"):
        s.edit("Hi")
    reply(s, "Hello!")
    before = ([(m.role, m.content, m.ids) for m in s.messages], list(s.context))
    for text, match in (("  ", "empty message"), ("word " * 400, "message too long")):
        with pytest.raises(ValueError, match=match):
            s.edit(text)
        assert ([(m.role, m.content, m.ids) for m in s.messages], s.context) == before

    def overflow(*args, **kwargs):
        raise OverflowError("after the prefill, before any event")

    monkeypatch.setattr(s.decoder.sampler, "load", overflow)
    with pytest.raises(OverflowError):
        list(s.edit("Hi there"))
    assert ([(m.role, m.content, m.ids) for m in s.messages], s.context) == before


def test_an_edit_on_the_default_model_replies_as_a_fresh_chat():
    """The shipped model as the app runs it on a CPU (quantized, the native step): the edit's
    greedy reply is a fresh chat's, word for word. Prefilled from one position later (the
    shared start of the old and the new message kept in the cache), it was not: "apples,
    oranges, and grapes" against the fresh chat's "apples, bananas, and oranges"."""
    model = Path(__file__).resolve().parents[2] / "models" / "tinychat"
    try:
        edited, fresh = (open_compiled(model, "cpu", compile="native") for _ in range(2))
    except ValueError as e:  # no native step on this machine (no compiler)
        pytest.skip(str(e))
    for s in (edited, fresh):
        s.set_param("max_tokens", "60")
        list(s.send("What is the capital of France?"))
    list(edited.send("Name three colours."))
    assert list(edited.edit("Name three fruits."))[-1].text == list(fresh.send("Name three fruits."))[-1].text


def test_on_a_cpu_a_reply_streams_a_few_steps_at_a_time(ckpt):
    """A CPU launch runs its steps before it returns: one run at a time, of CPU_CHUNK steps, so
    each token is shown after at most CPU_CHUNK more steps (was: two runs of 16 launched ahead,
    32 steps before the second token: 1.7 s on a 0.5B model, 2026-12-06)."""
    from tinyllm.session.decode_runner import CPU_CHUNK

    session = open_session(ckpt, "cpu", max_len=1024)
    session.runner.stop_ids = set()  # a reply of max_tokens
    session.set_param("max_tokens", "40")
    assert session.chunk == CPU_CHUNK < 16
    steps: list[int] = []
    run = session.decoder.run
    session.decoder.run = lambda n=1, capture=True: (steps.append(n), run(n, capture))[1]
    ran_at_token = [sum(steps) for e in session.send("Hello!") if isinstance(e, Token)]
    # the first token comes from the prefill; then each is shown once its run has returned
    assert ran_at_token[0] == 0 and len(ran_at_token) >= 40  # (and the text's tail, flushed at the end)
    assert all(ran - i <= CPU_CHUNK for i, ran in enumerate(ran_at_token[:40]))
    assert max(steps) == CPU_CHUNK
