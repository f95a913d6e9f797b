"""The engine's decode step as CUDA graphs (run on the H200): SlotGraphDecoder replay against
its identical eager step across admissions and releases, the graphed engine against the eager
engine (bf16, bit for bit) and against one generate() per request (fp32), and steady-state
steps with no hidden host sync.

Skipped where there is no CUDA device: a skip here is not a pass."""

import pytest
import torch

from tests.tinyllm.forced import assert_parted_only_at_a_near_tie, greedy_scores
from tinyllm.cuda_graph import SlotGraphDecoder
from tinyllm.decode.engine import Engine
from tinyllm.decode.generate import generate
from tinyllm.decode.sampling import SamplingParams
from tinyllm.kv_cache import SlotKVCache
from tinyllm.model import ModelConfig, Transformer

pytestmark = pytest.mark.cuda

DEVICE = "cuda"
VOCAB = 1024
RTOL = 1e-3  # fp32 logits of the graphed slot step and generate()'s on CUDA (cuBLAS's own reductions)


def make_model(dtype: torch.dtype) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", vocab_size=VOCAB, dim=128, n_layers=4, n_heads=4,
                                n_kv_heads=2, ffn_dim=344, max_seq_len=1024)
    return Transformer(cfg).init_weights(0).to(DEVICE, dtype).eval()


@pytest.fixture(scope="module")
def bf16_model():
    return make_model(torch.bfloat16)


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


# step -> ("admit", slot, prompt length, seed) or ("release", slot)
SCRIPT = {
    0: [("admit", 0, 100, 0), ("admit", 1, 5, 1)],  # window 128, then 256 from step 28
    40: [("admit", 2, 300, 2)],  # window 512, 1024 from step 252
    50: [("release", 1)],
    60: [("admit", 1, 20, 3)],
    100: [("release", 0), ("admit", 3, 127, 4)],
    200: [("release", 3)],
}


@torch.no_grad()
def run_slots(model, use_graph: bool, toggle_every: int = 0, n_steps: int = 300):
    """Drive a SlotGraphDecoder through SCRIPT with greedy tokens (drawn in the step); returns
    every prefill's and every step's logits (copied out) and the windows used."""
    slots = SlotKVCache(model.cfg.n_layers, 4, 1024, DEVICE)
    dec = SlotGraphDecoder(model, slots, use_graph=use_graph)
    if use_graph:
        dec.capture()
    long = SamplingParams(max_tokens=1000)
    outs, windows = [], []
    for i in range(n_steps):
        for action, s, *args in SCRIPT.get(i, ()):
            if action == "release":
                slots.release(s)
                continue
            ids = prompt(*args)
            slots.start_prefill([s], [len(ids)])
            logits, _ = model(torch.tensor([ids], device=DEVICE), cache=slots, last_only=True)  # (1, 1, V)
            slots.admit([s])
            dec.start_rows(slots._prefill_rows, logits[:, -1], [long], [0], [ids], [[]])
            outs.append(logits.clone())
        if toggle_every and i % toggle_every == 0:
            dec.use_graph = not dec.use_graph
        windows.append(dec.bucket(max(n for n, a in zip(slots.lens, slots.active, strict=True) if a) + 1))
        logits = dec.step(dec.tok)  # (B, 1, V), B = 4 (the one row bucket)
        outs.append(logits.clone())
    return outs, windows


def test_slot_replay_bit_identical_to_eager_step_across_admissions_and_releases(bf16_model):
    eager, windows = run_slots(bf16_model, use_graph=False)
    graph, graph_windows = run_slots(bf16_model, use_graph=True)
    assert sorted(set(windows)) == [128, 256, 512, 1024] and windows == graph_windows
    assert len(eager) == len(graph)
    for i, (a, b) in enumerate(zip(eager, graph, strict=True)):
        assert torch.equal(a, b), i


def test_toggling_graphs_mid_run_changes_nothing(bf16_model):
    eager, _ = run_slots(bf16_model, use_graph=False, n_steps=150)
    toggled, _ = run_slots(bf16_model, use_graph=True, toggle_every=7, n_steps=150)
    assert all(torch.equal(a, b) for a, b in zip(eager, toggled, strict=True))


def schedule():
    """(step to add it before, prompt, params, stop ids): mixed lengths, joining mid-run."""
    lens = (3, 200, 40, 1, 500, 25, 130, 60, 900, 11)
    return [(4 * i if i % 3 else 0, prompt(n, 10 + i), SamplingParams(max_tokens=40 + 17 * i), ())
            for i, n in enumerate(lens)]


@torch.no_grad()
def run_engine(model, use_graph: bool, n_slots: int = 4, reqs=None, compile=None):
    reqs = reqs or schedule()
    engine = Engine(model, n_slots, max_len=1024, use_graph=use_graph, compile=compile)
    graphs = dict(engine.decoder.graphs)
    ids, i = {}, 0  # position in reqs -> request id
    while len(ids) < len(reqs) or engine.has_work:
        for j, (at, ids_, params, stops) in enumerate(reqs):
            if at == i:
                ids[j] = engine.add_request(ids_, params, stops)
        engine.step()
        i += 1
    ids = [ids[j] for j in range(len(reqs))]
    if use_graph:  # every bucket captured up front, and none of those again during the run
        assert sorted({w for (w, _), *_ in graphs}) == list(engine.decoder.buckets) == [128, 256, 512, 1024]
        assert all(engine.decoder.graphs[key][0] is g for key, (g, _) in graphs.items())
    return [engine.result(r) for r in ids], [engine.finish_reason(r) for r in ids]


def test_graph_engine_equals_eager_engine_bf16(bf16_model):
    graph, reasons = run_engine(bf16_model, use_graph=True)
    eager, _ = run_engine(bf16_model, use_graph=False)
    assert graph == eager
    assert "full" in reasons  # the 900-token prompt fills its slot


def test_graph_engine_seeded_sampling_equals_eager_engine(bf16_model):
    reqs = [(i, prompt(10 + 30 * i, i), SamplingParams(temperature=0.8, top_p=0.9, top_k=50,
                                                       repeat_penalty=1.1 if i % 2 else 1.0,
                                                       seed=i, max_tokens=120), ())
            for i in range(6)]
    assert run_engine(bf16_model, True, 3, reqs) == run_engine(bf16_model, False, 3, reqs)


def test_graph_engine_equals_generate_per_request_fp32():
    """In fp32 the masked window step and generate()'s exact-length attention agree on every
    greedy token (bf16 rounding would make near-ties flip), up to a near-tie even in fp32: the
    engine draws in its step and cannot be fed, so a reply is generate()'s up to their first
    difference, and there generate()'s logits, forced along the tokens both drew, must be within
    RTOL of a tie (tests/tinyllm/forced.py)."""
    model = make_model(torch.float32)
    got, _ = run_engine(model, use_graph=True)
    for i, ((_, ids, params, stops), toks) in enumerate(zip(schedule(), got, strict=True)):
        n = min(params.max_tokens, 1024 - len(ids))
        ref = [int(t) for t in generate(model, torch.tensor([ids], device=DEVICE), n, params, stops)]
        assert_parted_only_at_a_near_tie(toks, ref, lambda k, ids=ids, ref=ref: greedy_scores(model, ids, ref[:k], RTOL), i)


def test_compiled_graph_engine_equals_compiled_eager_engine_bf16(bf16_model):
    graph, _ = run_engine(bf16_model, use_graph=True, compile="inductor")
    eager, _ = run_engine(bf16_model, use_graph=False, compile="inductor")
    assert graph == eager


def test_steady_state_steps_make_no_hidden_host_sync(bf16_model):
    """Chains of steps, admissions, sampled and greedy rows, ends of every kind and releases,
    under torch.cuda.set_sync_debug_mode("error"): no operation the engine runs synchronizes
    with the GPU (no .tolist() of a device tensor, no copy from pageable memory). The one wait
    a chain has, on the event behind its report's pinned copy, is not such an operation."""
    def reqs(base):
        return [(prompt(5 + 37 * i, base + i),
                 SamplingParams(temperature=0.8 * (i % 2), top_k=50, top_p=0.9, seed=i, max_tokens=20 + 9 * i),
                 (7,) if i % 3 == 0 else ()) for i in range(12)]

    engine = Engine(bf16_model, 8, max_len=512, compile=None)
    engine.decoder.greedy = False  # the sampling variant's graphs too (a capture synchronizes)
    engine.decoder.capture(steps=engine.chain)
    for args in reqs(0):  # warm: first uses (cuBLAS handles, the prefill's kernels)
        engine.add_request(*args)
    engine.run_until_done()
    ids = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i, args in enumerate(reqs(100)):
            ids.append(engine.add_request(*args))
            if i % 3 == 0:
                engine.step()
        engine.run_until_done()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(engine.is_finished(r) for r in ids)
    assert engine.stats.chains >= engine.stats.steps // engine.chain
