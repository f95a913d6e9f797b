"""ChatSession's decode loop: chunks of K steps against token-by-token decoding (a stop id at
every offset inside a chunk), seeded sampling, and the background compile taking over."""

import pytest
import torch

from tests.tinyllm.forced import assert_replies_part_only_at_a_near_tie
from tinyllm.session.chat import CHUNK, Finished, Token, open_session
from tinyllm.tools.testing import make_tiny_checkpoint

K = 8


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", max_seq_len=512)


def session(ckpt, chunk, device="cpu", max_len=512, **kw):
    s = open_session(ckpt, device, max_len=max_len, compile=kw.pop("compile", None), **kw)
    s.chunk = chunk
    return s


def talk(s, text):
    events = list(s.send(text))
    tokens = [e for e in events if isinstance(e, Token)]
    assert isinstance(events[-1], Finished)
    assert "".join(t.text for t in tokens) == events[-1].text
    return events[-1]


def cache_of(s):
    n = s.decoder.n
    return [t[:, :, :n].clone() for t in s.decoder.cache.k + s.decoder.cache.v]


def test_a_stop_id_at_every_offset_of_a_chunk_ends_as_token_by_token_does(ckpt):
    ref = session(ckpt, 1)
    ref.set_param("max_tokens", "40")
    ref.stop_ids = set()
    talk(ref, "Hello!")
    reply = ref.messages[-1].ids[:40]
    # Stop at reply position j (the first place that id occurs): offsets 0..K-1 of the first
    # two chunks (the first id comes from prefill, so chunk i covers ids 1+iK .. K+iK).
    offsets = [j for j in range(1, 2 * K + 2) if reply.index(reply[j]) == j]
    assert len(offsets) >= K, "the tiny model repeats itself too much for this test"
    for j in offsets:
        got = {}
        for chunk in (1, K):
            s = session(ckpt, chunk)
            s.set_param("max_tokens", "40")
            s.stop_ids = {reply[j]}
            fin = talk(s, "Hello!")
            assert fin.reason == "eos"
            got[chunk] = (fin.text, s.decoder.n, s.messages[-1].ids, cache_of(s), list(s.context))
        a, b = got[1], got[K]
        assert a[:3] == b[:3] and a[4] == b[4], j
        assert a[1] == len(s.context) - len(s.encode(s.template.assistant_suffix)), j  # fed: the reply
        assert all(torch.equal(x, y) for x, y in zip(a[3], b[3], strict=True)), j


@pytest.mark.parametrize("reason", ["max_tokens", "stopped", "context_full"])
def test_other_endings_inside_a_chunk_match_token_by_token(ckpt, reason):
    got = {}
    for chunk in (1, K):
        s = session(ckpt, chunk, max_len=200)  # buckets (128, 200): the reply crosses one
        s.stop_ids = set()
        s.set_param("max_tokens", "13" if reason == "max_tokens" else "1000")
        n_tokens = 0
        events = []
        for e in s.send("Hello!"):
            events.append(e)
            if isinstance(e, Token):
                n_tokens += 1
                if reason == "stopped" and n_tokens == 11:
                    s.stop()
        fin = events[-1]
        assert fin.reason == reason
        got[chunk] = (fin.text, s.decoder.n, s.messages[-1].ids, cache_of(s))
    a, b = got[1], got[K]
    assert a[:3] == b[:3]
    assert all(torch.equal(x, y) for x, y in zip(a[3], b[3], strict=True))


def test_seeded_sampling_is_the_same_in_chunks_and_again_on_regenerate(ckpt):
    texts = []
    for chunk in (1, 5, K):
        s = session(ckpt, chunk)
        for k, v in [("temperature", "0.9"), ("top_p", "0.95"), ("top_k", "50"), ("seed", "11"),
                     ("max_tokens", "60"), ("repeat_penalty", "1.2")]:
            s.set_param(k, v)
        first = talk(s, "Tell me a joke.").text
        assert list(s.regenerate())[-1].text == first  # the same seed restarts the same stream
        texts.append(first)
    assert texts[0] == texts[1] == texts[2]
    s.set_param("seed", "12")
    assert list(s.regenerate())[-1].text != texts[0]


def test_runs_are_whole_chunks_or_single_steps_so_every_graph_is_captured_ahead(ckpt):
    """Each run length is a graph per bucket: replies that end at every kind of offset, and
    bucket ends, use only K and 1, the two lengths captured ahead."""
    s = session(ckpt, K)
    s.stop_ids = set()
    lengths = []
    launch = s.decoder.launch
    s.decoder.launch = lambda steps, capture=True: (lengths.append(steps), launch(steps, capture))[1]
    for n in (5, 13, 22, 37, 50, 91):
        s.set_param("max_tokens", str(n))
        talk(s, "Hello!")
    assert set(lengths) == {8, 1}, lengths
    assert s.decoder.n > 256  # the replies crossed bucket ends too


def test_the_compiled_step_takes_over_at_a_reply_boundary_and_changes_nothing_shown(ckpt):
    """Turn 1 runs while the step compiles in the background (or after, if the compile won);
    turn 2 runs compiled. Nothing already said changes; each turn equals a reference session
    that ran the same step for it."""
    s = session(ckpt, K, compile="inductor")
    s.set_param("max_tokens", "30")
    first = talk(s, "Hello!")
    shown = [(m.role, m.content, list(m.ids)) for m in s.messages]
    assert s.wait_compiled(timeout=600) and s.step_kind == "compiled", s.compile_error
    second = talk(s, "And then?")
    assert second.stats.step == "compiled" and first.stats.step in ("compiling", "compiled")
    assert [(m.role, m.content, list(m.ids)) for m in s.messages[:2]] == shown
    ref = session(ckpt, K)
    ref.set_param("max_tokens", "30")
    if first.stats.step == "compiled":
        ref.decoder.set_compile("inductor")
    assert talk(ref, "Hello!").text == first.text
    ref.decoder.set_compile("inductor")
    assert talk(ref, "And then?").text == second.text


def test_the_other_sampler_variant_compiles_when_asked_for_and_the_reply_runs_plain_meanwhile(ckpt):
    """A session compiles the sampler variant its settings use. A reply that needs the other
    starts its compile and runs the plain step (no compile on a reply's path, and no compiled
    step while Dynamo traces on another thread); the next reply after it runs compiled, with
    the same tokens. Backend "eager" (Dynamo without Inductor) keeps it quick."""
    s = session(ckpt, K, compile="eager")
    assert s.wait_compiled(timeout=600) and s.step_kind == "compiled", s.compile_error
    s.set_param("max_tokens", "8")
    assert talk(s, "Hello!").stats.step == "compiled" and s.decoder.compile == "eager"
    for k, v in [("temperature", "0.8"), ("seed", "5")]:
        s.set_param(k, v)
    assert s.step_kind == "compiling"
    first = talk(s, "More?")
    assert first.stats.step == "compiling" and not s.decoder.compile
    assert s.wait_compiled(timeout=600) and s.step_kind == "compiled", s.compile_error
    again = list(s.regenerate())[-1]
    assert again.stats.step == "compiled" and again.text == first.text


def test_a_compile_that_fails_leaves_the_plain_step_and_says_why(ckpt):
    s = session(ckpt, K, compile="no-such-backend")
    assert s.wait_compiled(timeout=60)
    assert s.step_kind == "compile failed" and "no-such-backend" in s.compile_error
    s.set_param("max_tokens", "5")
    fin = talk(s, "Hello!")
    assert fin.stats.step == "compile failed" and not s.decoder.compile


@pytest.mark.cuda
def test_graphs_toggled_mid_reply_with_sampling_and_compile_change_no_token(ckpt):
    """CUDA: the compiled step in graphs, seeded sampling on, Ctrl+G every few tokens, against
    the same compiled step never in graphs."""
    texts = []
    for use_graph, toggle in ((False, False), (True, False), (True, True)):
        s = session(ckpt, K, device="cuda", use_graph=use_graph)
        s.decoder.set_compile("inductor")
        for k, v in [("temperature", "0.8"), ("top_p", "0.9"), ("seed", "5"), ("max_tokens", "300")]:
            s.set_param(k, v)
        s.stop_ids = set()
        for i, _ in enumerate(s.send("Hello!")):
            if toggle and i % 5 == 0:
                s.set_graphs(not s.use_graph)
        texts.append((s.messages[-1].ids, s.decoder.n))
    assert texts[0] == texts[1] == texts[2]


def test_prepare_takes_the_compiled_step_between_replies(ckpt):
    """prepare() (the app's server calls it when a compile ends) switches to the compiled step
    before any reply asks, and the reply after it runs compiled with the tokens a session that
    switched at the reply's start gives."""
    s = session(ckpt, K, compile="eager")
    assert s.wait_compiled(timeout=600) and s.step_kind == "compiled", s.compile_error
    assert not s.decoder.compile
    s.prepare()
    assert s.decoder.compile == "eager"
    s.set_param("max_tokens", "12")
    fin = talk(s, "Hello!")
    ref = session(ckpt, K, compile="eager")
    assert ref.wait_compiled(timeout=600)
    ref.set_param("max_tokens", "12")
    assert fin.stats.step == "compiled" and talk(ref, "Hello!").text == fin.text


@pytest.mark.cuda
def test_no_graph_is_captured_mid_reply_or_while_a_compile_runs(ckpt):
    """CUDA: the plain graphs (both run lengths, every bucket) are captured before the compile
    starts; a reply of the other sampler variant while a compile runs adds no graph (it runs
    eagerly); prepare() captures the compiled step's graphs, and a long reply after it adds none.
    The compile is Dynamo with a backend that waits for the test's go: it runs as long as the
    test needs, whatever the machine's speed."""
    import threading

    import torch._dynamo

    go = threading.Event()

    @torch._dynamo.register_backend(name="held_until_go")
    def held_until_go(gm, example_inputs):
        go.wait()
        return gm.forward

    s = session(ckpt, CHUNK, device="cuda", compile="held_until_go")  # the chunk captured ahead
    buckets = s.decoder.buckets
    assert set(s.decoder.graphs) == {(w, n, True, False) for w in buckets for n in (1, CHUNK)}  # greedy, no filters
    s.stop_ids = set()
    for k, v in [("temperature", "0.8"), ("seed", "3"), ("max_tokens", "40")]:
        s.set_param(k, v)
    fin = talk(s, "Hello!")  # the greedy variant is still compiling: this reply runs eagerly
    assert s.step_kind == "compiling" and fin.stats.step == "compiling"
    assert not any(key[2] is False for key in s.decoder.graphs), sorted(s.decoder.graphs)
    go.set()
    while s.step_kind != "compiled":  # the greedy variant ends; the sampling one compiles
        assert s.wait_compiled(timeout=900) and s.compile_error == "", s.compile_error
        s.prepare()
    assert s.decoder.compile == "held_until_go"
    captured = set(s.decoder.graphs)
    assert captured == {(w, n, False, False) for w in buckets for n in (1, CHUNK)}
    s.set_param("max_tokens", "300")  # crosses the 128 and 256 buckets' ends
    fin = talk(s, "More?")
    assert fin.stats.step == "compiled" and set(s.decoder.graphs) == captured


def test_the_native_step_switched_off_and_on_mid_reply_reads_the_same_greedy_reply(ckpt):
    """The fast step's switch on a CPU (the app's Ctrl+G): the native step against the plain
    step run eagerly, from the next launch, mid-reply too; a greedy reply reads the same, up to a
    near-tie of the logits where the two steps' arithmetic may part them (tests/tinyllm/forced.py)."""
    ref = session(ckpt, K, compile="native")
    ref.set_param("max_tokens", "60")
    ref.stop_ids = set()
    want = talk(ref, "Hello!").text
    assert ref.step_kind == "native" and ref.last_stats.step == "native" and ref.use_graph
    s = session(ckpt, K, compile="native")
    s.set_param("max_tokens", "60")
    s.stop_ids = set()
    steps, text = [], []
    for i, event in enumerate(s.send("Hello!")):
        if isinstance(event, Token):
            text.append(event.text)
            steps.append(event.stats.step)
            if i in (10, 30):
                s.set_graphs(i == 30)  # off at the tenth token, on again at the thirtieth
                assert s.step_kind == ("native" if i == 30 else "eager")
    assert_replies_part_only_at_a_near_tie(s, ref, what="switched")
    if s.messages[-1].ids == ref.messages[-1].ids:
        assert "".join(text) == want
    assert steps[0] == "native" and "eager" in steps and steps[-1] == "native"
    s.set_graphs(False)
    s.new_chat()
    fin = talk(s, "Hello!")
    assert s.last_stats.step == "eager" and not s.use_graph
    assert_replies_part_only_at_a_near_tie(s, ref, what="eager")
    if s.messages[-1].ids == ref.messages[-1].ids:
        assert fin.text == want


def test_the_native_switch_is_refused_where_no_native_step_runs(ckpt):
    s = session(ckpt, K)
    with pytest.raises(ValueError, match="native CPU step does not run"):
        s.set_graphs(False)
    assert s.step_kind == "plain" and not s.use_graph
