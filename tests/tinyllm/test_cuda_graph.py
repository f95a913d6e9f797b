"""The static decode step (GraphDecoder with use_graph=False) against the eager KVCache path
on the CPU; its CUDA-graph replay is tested in test_cuda_graph_cuda.py on a GPU."""

from contextlib import contextmanager

import pytest
import torch

from tests.conftest import tiny_model
from tinyllm.cuda_graph import GraphDecoder, default_buckets, pick_bucket
from tinyllm.decode.sampling import SamplingParams
from tinyllm.kv_cache import Cache, CacheLayer, KVCache, SlotKVCache, StaticKVCache

TOL = 1e-4


def kv_decode(model, prompt, toks):
    """Logits of the eager KVCache path: prefill prompt (B, T), then feed toks (B, N)."""
    B, T = prompt.shape
    cache = KVCache(model.cfg.n_layers, B, T + toks.shape[1], model.device)
    out = [model(prompt, cache=cache, last_only=True)[0]]
    for i in range(toks.shape[1]):
        out.append(model(toks[:, i:i + 1], cache=cache)[0])
    return torch.cat(out, dim=1)  # (B, N + 1, V)


def test_default_buckets():
    assert default_buckets(1024) == (128, 256, 512, 1024)
    assert default_buckets(1000) == (128, 256, 512, 1000)
    assert default_buckets(128) == (128,)
    assert default_buckets(100) == (100,)


@torch.no_grad()
def test_static_step_equals_kv_cache_decode_across_buckets(model):
    """Decode from 14 to 70 keys with buckets (16, 32, 64, 96): every boundary W-1, W, W+1 is
    crossed, each step uses the smallest bucket holding n + 1 keys, and logits match."""
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 13))
    toks = torch.randint(0, model.cfg.vocab_size, (2, 57))
    dec = GraphDecoder(model, 2, max_len=96, buckets=(16, 32, 64, 96), use_graph=False)
    out = [dec.prefill(prompt)]
    windows = []
    for i in range(toks.shape[1]):
        out.append(dec.step(toks[:, i:i + 1]))
        windows.append((dec.n, dec.window))
    ref = kv_decode(model, prompt, toks)
    assert (torch.cat(out, dim=1) - ref).abs().max() < TOL
    seen = dict(windows)  # positions filled after the step -> bucket it used
    for w in (16, 32, 64):
        assert seen[w - 1] == w and seen[w] == w and seen[w + 1] == pick_bucket((16, 32, 64, 96), w + 1)
    assert seen[w + 1] == 96


@torch.no_grad()
def test_left_padded_rows_equal_unpadded_runs(model):
    a = torch.randint(5, model.cfg.vocab_size, (1, 12))
    b = torch.randint(5, model.cfg.vocab_size, (1, 7))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 5, dtype=torch.long), b], dim=1)])  # (2, 12)
    pad_lens = torch.tensor([0, 5])
    toks = torch.randint(0, model.cfg.vocab_size, (2, 40))
    for use_static in (False, True):
        if use_static:
            dec = GraphDecoder(model, 2, max_len=64, buckets=(16, 32, 64), use_graph=False)
            out = [dec.prefill(batch, pad_lens)] + [dec.step(toks[:, i:i + 1]) for i in range(40)]
        else:
            cache = KVCache(model.cfg.n_layers, 2, 64)
            cache.reset(pad_lens)
            out = [model(batch, cache=cache, last_only=True)[0]]
            out += [model(toks[:, i:i + 1], cache=cache)[0] for i in range(40)]
        got = torch.cat(out, dim=1)  # (2, 41, V)
        for row, ids in enumerate((a, b)):
            ref = kv_decode(model, ids, toks[row:row + 1])
            assert (got[row:row + 1] - ref).abs().max() < TOL, (use_static, row)


@torch.no_grad()
def test_truncate_then_decode_equals_fresh_run(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 20))
    toks = torch.randint(0, model.cfg.vocab_size, (1, 10))
    dec = GraphDecoder(model, 1, max_len=64, buckets=(32, 64), use_graph=False)
    dec.prefill(prompt)
    first = [dec.step(toks[:, i:i + 1]).clone() for i in range(10)]
    dec.truncate(20)
    again = [dec.step(toks[:, i:i + 1]) for i in range(10)]
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))


@torch.no_grad()
def test_decoder_is_reusable_across_requests(model):
    dec = GraphDecoder(model, 1, max_len=64, buckets=(32, 64), use_graph=False)
    p1, p2 = (torch.randint(0, model.cfg.vocab_size, (1, n)) for n in (30, 9))
    dec.prefill(p1)
    for _ in range(5):
        dec.step(torch.ones(1, 1, dtype=torch.long))
    got = dec.prefill(p2)
    assert dec.n == 9
    assert (got - kv_decode(model, p2, torch.zeros(1, 0, dtype=torch.long))).abs().max() < TOL


def test_errors(model):
    dec = GraphDecoder(model, 1, max_len=32, buckets=(32,), use_graph=False)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        GraphDecoder(model, 1, max_len=32, use_graph=True)
    assert not GraphDecoder(model, 1, max_len=32).use_graph  # the default runs where the model is
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        dec.use_graph = True
    with pytest.raises(ValueError, match="expected token ids of shape"):
        dec.prefill(torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len 4096 > max_seq_len"):
        GraphDecoder(model, 1, max_len=4096, use_graph=False)
    with pytest.raises(ValueError, match="largest bucket"):
        GraphDecoder(model, 1, max_len=64, buckets=(32,), use_graph=False)
    with pytest.raises(ValueError, match="KV cache full"):
        dec.prefill(torch.zeros(1, 33, dtype=torch.long))
    dec.prefill(torch.zeros(1, 31, dtype=torch.long))
    with pytest.raises(ValueError, match="expected tokens of shape"):
        dec.step(torch.zeros(2, 1, dtype=torch.long))
    dec.step(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="KV cache full"):
        dec.step(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="KV cache full"):
        dec.append(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="cannot truncate"):
        dec.truncate(40)


def test_kv_cache_refuses_wrong_dtype_and_batch():
    model = tiny_model()
    cache = KVCache(model.cfg.n_layers, 1, 16)
    model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="cache holds torch.float32"):
        model.to(torch.bfloat16)(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    model.float()
    cache.reset()
    with pytest.raises(ValueError, match="batch 2 != cache batch 1"):
        model(torch.zeros(2, 1, dtype=torch.long), cache=cache)



@torch.no_grad()
def test_every_cache_and_decode_view_speaks_the_typed_protocol(model):
    """kv_cache.Cache and CacheLayer, the protocol Transformer.forward's cache is typed as: each
    cache (a prefill) and each decode view (a step), once the model has run through it."""
    n = model.cfg.n_layers
    static, slots = StaticKVCache(n, 1, 32), SlotKVCache(n, 2, 32)
    slots.start_prefill([0], [3])
    for cache in (KVCache(n, 1, 32), static, slots):
        model(torch.ones(1, 3, dtype=torch.long), cache=cache)
        assert isinstance(cache, Cache) and isinstance(cache.layer(1), CacheLayer), cache
    for view, rows in ((static.decode(16), 1), (slots.decode(16, 2), 2)):
        model(torch.ones(rows, 1, dtype=torch.long), cache=view)
        assert isinstance(view, Cache) and isinstance(view.layer(1), CacheLayer), view
    assert not isinstance(object(), Cache)


@torch.no_grad()
def test_step_leaves_the_greedy_next_id_in_its_input_buffer(model):
    """After a step, dec.tok holds the argmax of its logits, so step(dec.tok) decodes greedily
    with no copy; the same as passing the argmax in."""
    ids = torch.randint(0, 512, (2, 9))
    a = GraphDecoder(model, 2, max_len=64, buckets=(16, 64), use_graph=False)
    b = GraphDecoder(model, 2, max_len=64, buckets=(16, 64), use_graph=False)
    logits = a.prefill(ids)
    b.prefill(ids)
    b.tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
    for _ in range(20):  # crosses W 16 -> 64
        la = a.step(logits[:, -1].argmax(-1, keepdim=True))
        lb = b.step(b.tok)
        assert torch.equal(a.tok, la[:, -1].argmax(-1, keepdim=True))
        assert torch.equal(la, lb) and torch.equal(a.tok, b.tok)
        logits = la


@torch.no_grad()
def test_draw_first_loads_the_settings_and_feeds_the_next_step(model):
    """A reply's first draw, eager, is the one the step would make with the same settings, and
    becomes the next step's input; ids from n_valid on are never drawn."""
    ids = torch.randint(0, 512, (1, 9))
    params = SamplingParams(temperature=0.9, top_k=40, seed=3, repeat_penalty=1.3)
    a = GraphDecoder(model, 1, max_len=64, use_graph=False, n_valid=300)
    b = GraphDecoder(model, 1, max_len=64, use_graph=False, n_valid=300)
    assert a.n_valid == 300 and a.greedy
    logits = a.prefill(ids)[:, -1]  # (1, V)
    b.prefill(ids)
    first = a.draw_first(logits, params, ids)
    b.sampler.load(params, ids)
    assert not a.greedy and torch.equal(first, b.sampler.draw(logits)) and torch.equal(a.tok, first[:, None])
    b.tok.copy_(first[:, None])
    for _ in range(10):
        a.step(a.tok)
        b.step(b.tok)
        assert torch.equal(a.tok, b.tok) and int(a.tok) < 300


def test_run_after_a_prefill_needs_the_first_token_chosen(model):
    """prefill then run(1) would feed a stale token (the first token twice, or another's): refused
    in one line that says what to call; draw_first, step(tok) or a write of tok each choose it."""
    from tinyllm.decode.sampling_params import SamplingParams

    dec = GraphDecoder(model, 1, max_len=32)
    prompt = torch.tensor([[1, 5, 9, 4]])
    logits = dec.prefill(prompt)
    with pytest.raises(ValueError, match="choose the first token before run"):
        dec.run(1)
    first = dec.draw_first(logits[:, -1], SamplingParams(), prompt)
    dec.run(2)
    assert dec.n == 6 and int(first) >= 0
    dec.append(torch.tensor([[7]]))
    with pytest.raises(ValueError, match="draw_first"):
        dec.launch(1)
    dec.tok.fill_(3)  # a token of the caller's own
    dec.run(1)


def test_compile_auto_is_the_native_step_on_a_cpu_where_it_runs(model):
    from tinyllm.decode import cpu_step

    dec = GraphDecoder(model, 1, max_len=32, compile="auto")
    assert dec.compile == ("native" if cpu_step.problem(model, 1) is None else None)
    assert GraphDecoder(model, 1, max_len=32).compile is None  # the plain step unless asked


# ---- the decode skeleton (_Decoder's capture, warm-up, record and replay) on the CPU ----

class CpuGraphs:
    """torch.cuda's stream and graph calls emulated on the CPU for one decoder, so that its
    skeleton runs here with graphs on: a capture runs the run's body once (a GPU only records
    it; the skeleton puts back what it advances either way), a replay runs that body again
    into the output the capture returned. Each call is logged in order."""

    def __init__(self, dec, monkeypatch):
        self.dec, self.log, self.capturing = dec, [], None
        body = dec._steps

        def steps(shape, n):
            self.log.append(("steps", shape, n))
            out = body(shape, n)
            if self.capturing is not None:
                self.capturing.replay = lambda: (self.log.append("replay"), out.copy_(body(shape, n)))
            return out
        monkeypatch.setattr(dec, "_steps", steps)
        for name, fn in (("synchronize", lambda: self.log.append("synchronize")), ("Stream", lambda: self.Stream("side")),
                         ("current_stream", lambda: self.Stream("current")), ("stream", self.stream),
                         ("CUDAGraph", lambda: type("Graph", (), {})()), ("graph", self.graph)):
            monkeypatch.setattr(torch.cuda, name, fn)
        dec._use_graph, dec.pool = True, "pool"  # the setter refuses a CPU model

    def Stream(self, name):  # noqa: N802 (torch.cuda.Stream)
        log = self.log
        return type("Stream", (), {"name": name, "wait_stream": lambda s, o: log.append(f"{s.name} waits for {o.name}")})()

    def toggle(self):
        self.dec._use_graph = not self.dec._use_graph

    @contextmanager
    def stream(self, s):
        self.log.append(f"on {s.name}")
        yield
        self.log.append(f"off {s.name}")

    @contextmanager
    def graph(self, graph, pool, capture_error_mode):
        self.log.append(("capture", pool, capture_error_mode))
        self.capturing = graph
        yield
        self.capturing = None


def record_log(shape, steps):
    """What the skeleton calls to record one graph: two warm-up steps on a side stream, then the
    run captured into the shared pool."""
    return ["side waits for current", "on side", ("steps", shape, 1), ("steps", shape, 1), "off side",
            "current waits for side", ("capture", "pool", "thread_local"), ("steps", shape, steps)]


CHAINS = (1, 4, 4, 2, 1, 4, 3, 4, 4, 4, 1, 4, 4, 4, 2, 4, 4, 4)  # 58 steps: W 16 -> 32 -> 64 -> 96


@torch.no_grad()
def graph_decoder_run(model, monkeypatch=None):
    """A sampled reply in chains of run(k), from position 13 across every bucket; with
    monkeypatch, on emulated graphs toggled every third chain. Returns each run's ids and logits."""
    dec = GraphDecoder(model, 2, max_len=96, buckets=(16, 32, 64, 96), use_graph=False)
    fake = CpuGraphs(dec, monkeypatch) if monkeypatch else None
    prompt = torch.randint(0, 512, (2, 13), generator=torch.Generator().manual_seed(0))
    logits = dec.prefill(prompt)
    dec.draw_first(logits[:, -1], SamplingParams(temperature=0.9, top_k=40, seed=3, repeat_penalty=1.3), prompt)
    if fake:
        state = [t.clone() for t in dec._state()]
        assert dec.capture((16,), steps=4) >= 0
        assert fake.log == ["synchronize", *record_log(16, 4), "synchronize"]
        assert all(torch.equal(a, b) for a, b in zip(state, dec._state(), strict=True)), "capture puts back"
    ids, outs = [], []
    for i, k in enumerate(CHAINS):
        if fake and i % 3 == 2:
            fake.toggle()
        outs.append(dec.run(k).clone())
        ids.append(dec.out[:, :k].clone())
    return ids, outs, dec, fake


def test_the_skeleton_replays_what_its_eager_twin_runs(model, monkeypatch):
    """GraphDecoder through the skeleton on emulated graphs (capture ahead, capture on first use,
    replay, toggles between runs) against use_graph=False: the same ids and logits, bit for bit,
    and a graph per (W, steps, greedy, filtered) it ran with graphs on (its settings: a penalty)."""
    ids, outs, _, _ = graph_decoder_run(model)
    g_ids, g_outs, dec, fake = graph_decoder_run(model, monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(ids + outs, g_ids + g_outs, strict=True))
    assert dec.window == 96 and dec.captured_windows == [16, 32, 64, 96]
    assert all(key[2:] == (False, True) for key in dec.graphs) and (16, 4, False, True) in dec.graphs
    assert fake.log.count("replay") > 0 and fake.log.count(("capture", "pool", "thread_local")) == len(dec.graphs)


@torch.no_grad()
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(repeat_penalty=1.1, dry_multiplier=0.8),
                                    SamplingParams(temperature=0.8, dry_multiplier=0.8)],
                         ids=["greedy", "greedy-filtered", "sampled-filtered"])
@pytest.mark.parametrize("compile", ["inductor", "plain"])
def test_the_graphs_captured_ahead_are_the_ones_the_first_reply_replays(model, monkeypatch, params, compile):
    """A session that compiles in the background captures the plain step's graphs ahead for the
    sampler's variant its replies run (greedy or not, a penalty or DRY on or not: the app's defaults
    have both), since no graph is captured beside the compile: the first reply replays them, never
    an eager step (on an H100 a variant captured for nothing left the app's first reply eager, at
    32 tok/s). So does a session that runs the plain step alone ("plain": what "auto" may be on CUDA)."""
    from tinyllm.session.step_policy import StepPolicy

    dec = GraphDecoder(model, 1, max_len=96, buckets=(16, 32, 64, 96), use_graph=False)
    fake = CpuGraphs(dec, monkeypatch)
    policy = StepPolicy(model, dec, compile)  # its compile starts only at begin(): none here
    policy.capture_ahead(1, params.greedy, 4, params.filtered)
    assert dec.graphs and {key[2:] for key in dec.graphs} == {(params.greedy, params.filtered)}
    prompt = torch.randint(0, 512, (1, 13), generator=torch.Generator().manual_seed(0))
    dec.draw_first(dec.prefill(prompt)[:, -1], params, prompt)
    fake.log.clear()
    for k in (1, 4, 4, 1):
        dec.run(k, capture=False)  # mid-reply beside a compile: a graph, or an eager step
    assert fake.log.count("replay") == 4 and not [e for e in fake.log if isinstance(e, tuple)], fake.log


@torch.no_grad()
def test_the_plain_policy_captures_a_new_variant_between_replies_and_compiles_nothing(model, monkeypatch):
    """compile="plain": no background compile ever starts; a reply whose settings change the
    sampler's variant finds its graphs captured at its start (prepare), not step by step mid-reply."""
    from tinyllm.session.step_policy import StepPolicy

    dec = GraphDecoder(model, 1, max_len=96, buckets=(16, 32, 64, 96), use_graph=False)
    fake = CpuGraphs(dec, monkeypatch)
    policy = StepPolicy(model, dec, "plain")
    policy.capture_ahead(1, True, 4)
    policy.begin(True)
    assert policy.background is None and policy.step_kind(True) == "plain" and policy.backend is None
    prompt = torch.randint(0, 512, (1, 13), generator=torch.Generator().manual_seed(0))
    dec.draw_first(dec.prefill(prompt)[:, -1], SamplingParams(), prompt)
    dec.run(4)
    sampled = SamplingParams(temperature=0.8, repeat_penalty=1.1)
    before = set(dec.graphs)
    policy.prepare(sampled.greedy, 4, sampled.filtered)  # the next reply's start
    assert {key[2:] for key in set(dec.graphs) - before} == {(False, True)}
    dec.draw_first(dec.append(prompt[:, :3])[:, -1], sampled, prompt)
    fake.log.clear()
    for k in (4, 1, 4):
        dec.run(k)
    assert fake.log.count("replay") == 3 and not [e for e in fake.log if isinstance(e, tuple)], fake.log
    n = len(dec.graphs)
    policy.prepare(sampled.greedy, 4, sampled.filtered)  # captured already: nothing new
    assert len(dec.graphs) == n and policy.background is None


def test_auto_resolves_to_the_native_step_then_the_plain_step_where_our_kernels_run_else_inductor(monkeypatch):
    from tinyllm.kernels import switches
    from tinyllm.session.step_policy import resolve

    monkeypatch.setattr(switches, "SWITCHES", switches.read({}))
    assert resolve("auto", None, False) == "native" and resolve("native", None, True) == "native"
    assert resolve("auto", "on CUDA", True) == "plain"  # TINYLLM_CUDA_AUTO's default
    assert resolve("auto", "on CUDA", False) == "inductor"  # no Triton: no fused step
    assert resolve(None, "on CUDA", True) is None and resolve("plain", None, False) == "plain"
    assert resolve("inductor", None, True) == "inductor"
    with pytest.raises(ValueError, match="native CPU step cannot run this model: on CUDA"):
        resolve("native", "on CUDA", True)
    monkeypatch.setattr(switches, "SWITCHES", switches.read({"TINYLLM_CUDA_AUTO": "inductor"}))
    assert resolve("auto", "on CUDA", True) == "inductor" and resolve("auto", None, True) == "native"
    with pytest.raises(ValueError, match="TINYLLM_CUDA_AUTO must be inductor or plain"):
        switches.read({"TINYLLM_CUDA_AUTO": "on"})


# step -> ("admit", slot, prompt length, seed, temperature) or ("release", slot)
SLOT_SCRIPT = {0: [("admit", 0, 20, 0, 0.0), ("admit", 1, 5, 1, 0.8)], 3: [("admit", 3, 40, 2, 0.0)],
               5: [("release", 1)], 7: [("admit", 1, 30, 3, 1.1)], 9: [("release", 3)]}


@torch.no_grad()
def slot_decoder_run(model, monkeypatch=None):
    """SlotGraphDecoder over admissions and releases in chains of run(4), greedy and sampled rows;
    with monkeypatch on emulated graphs, toggled every third run. Returns each run's report and logits."""
    from tinyllm.cuda_graph import SlotGraphDecoder
    from tinyllm.kv_cache import SlotKVCache

    slots = SlotKVCache(model.cfg.n_layers, 4, 128, "cpu")
    dec = SlotGraphDecoder(model, slots, (32, 64, 128), use_graph=False, row_buckets=(2, 4))
    fake = CpuGraphs(dec, monkeypatch) if monkeypatch else None
    if fake:
        assert dec.capture((32,)) >= 0 and dec.captured_windows == [32]
        assert fake.log == ["synchronize", *record_log((32, 2), 1), *record_log((32, 4), 1), "synchronize"]
    reports, outs, live = [], [], {}
    for i in range(12):
        for action, s, *args in SLOT_SCRIPT.get(i, ()):
            if action == "release":
                slots.release(s)
                continue
            n, seed, temperature = args
            ids = torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
            slots.start_prefill([s], [n])
            logits, _ = model(torch.tensor([ids]), cache=slots, last_only=True)  # (1, 1, V)
            slots.admit([s])
            params = SamplingParams(temperature=temperature, top_k=20, seed=seed, max_tokens=30)
            dec.start_rows(slots._prefill_rows, logits[:, -1], [params], [seed], [ids], [[]])
            live[s] = params
        dec.sampler.pick_variant([live[s] for s in range(4) if slots.active[s]])  # as the engine does
        if fake and i % 3 == 2:
            fake.toggle()
        outs.append(dec.run(4).clone())
        reports.append(dec.out[:dec.rows].clone())  # rows past the bucket are free slots: never read
    return reports, outs, dec, fake


def test_the_skeleton_replays_the_slot_step_as_its_eager_twin(model, monkeypatch):
    """The same for SlotGraphDecoder: its graphs keyed by ((W, rows), steps, greedy, whole)."""
    reports, outs, _, _ = slot_decoder_run(model)
    g_reports, g_outs, dec, fake = slot_decoder_run(model, monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(reports + outs, g_reports + g_outs, strict=True))
    assert ((32, 2), 1, True, False) in dec.graphs and {key[2] for key in dec.graphs} == {True, False}
    assert {key[0][1] for key in dec.graphs} == {2, 4} and fake.log.count("replay") > 0
