"""tinyllm-bench --engine: the continuous engine's throughput, and where a step's time goes.

Contract:
- `bench_engine(model, concurrency, steps, repeats, report, compile, workload)`: for each
  concurrency c, one `Engine(model, c)` and c requests a run: a warm-up run, the median of
  `repeats` timed runs, then one probe run that is read for the rest. Workloads:
    "uniform"  prompts of ENGINE_PROMPT tokens, greedy, `steps` new tokens each, max_len their sum
    "teacher"  the teacher's answers (tinyllm.tools.datagen.rounds.ANSWER: temperature 0.5,
               top-k 50, top-p 0.9, repeat penalty 1.1, 384 tokens at most), prompts of 50-600
               tokens (uniform, seeded), max_len 1024; random weights never draw a stop id, so
               every request runs to its budget or the context
  Rows, each with "concurrency" and "workload":
    engine_tok_s           tokens generated a second over the timed runs (prefill included)
    engine_capture_s       graph capture in the constructor (CUDA)
    engine_step_ms         probe run: wall time per decode step
    engine_live_rows       probe run: live rows per decode step
    engine_host_us         probe run: host time per decode step not spent waiting for the
                           device (admissions included)
    engine_syncs_per_step  probe run: chain reads (one wait each) plus every operation torch
                           flags as synchronizing (set_sync_debug_mode("warn"), CUDA), per step
    engine_kv_mib          probe run: K/V bytes the live rows' attention covers, per step
    engine_kv_gb_s         those bytes over the step time
    engine_admit_ms        probe run: host time in admissions (prefills launched, first tokens
                           drawn), per request
- `bench_guard(report, compile)` (--engine-guard): the compiled engine's cost per token must not
  grow with max_len (its step writes K/V in place and attends by length): a 2-layer dim-192
  model, 16 requests of 20-35 prompt tokens and 48 new tokens each, 16 slots, at max_len 256
  and 4096: engine_tok_s at each ("max_len") and engine_guard_ratio (4096 over 256; >= 0.7
  is the target).
Speeds are measured, never asserted.
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch

from tinyllm.decode.engine import Engine
from tinyllm.decode.sampling import SamplingParams
from tinyllm.model import ModelConfig, Transformer

ENGINE_PROMPT = 64  # prompt tokens of each uniform request
TEACHER_ANSWER = SamplingParams(temperature=0.5, top_k=50, top_p=0.9, repeat_penalty=1.1, max_tokens=384)
WORKLOADS = ("uniform", "teacher")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _requests(model: Transformer, workload: str, c: int, steps: int) -> tuple[list, int]:
    """(c requests (prompt, params), max_len) of a workload."""
    g = torch.Generator().manual_seed(c)
    V = model.cfg.vocab_size
    if workload == "teacher":
        max_len = min(1024, model.cfg.max_seq_len)
        lens = torch.randint(50, min(601, max_len - 16), (c,), generator=g).tolist()
        return [(torch.randint(0, V, (n,), generator=g).tolist(), TEACHER_ANSWER) for n in lens], max_len
    prompt_len = min(ENGINE_PROMPT, model.cfg.max_seq_len // 2)
    steps = min(steps, model.cfg.max_seq_len - prompt_len)
    params = SamplingParams(max_tokens=steps)
    return [(torch.randint(0, V, (prompt_len,), generator=g).tolist(), params) for _ in range(c)], prompt_len + steps


def _run(engine: Engine, reqs: list) -> tuple[float, int]:
    """Seconds and tokens generated for one run of reqs through the engine."""
    device = engine.model.device
    _sync(device)
    t0 = time.perf_counter()
    ids = [engine.add_request(p, params) for p, params in reqs]
    engine.run_until_done()
    _sync(device)
    seconds = time.perf_counter() - t0
    tokens = sum(len(engine.requests.pop(i).tokens) for i in ids)
    return seconds, tokens


def _probe(engine: Engine, reqs: list) -> tuple[float, int]:
    """One run with fresh stats and torch's sync warnings counted: (seconds, flagged syncs)."""
    from tinyllm.decode.engine import EngineStats

    engine.stats = EngineStats()
    cuda = engine.model.device.type == "cuda"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            seconds, _ = _run(engine, reqs)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    return seconds, sum("synchronizing" in str(w.message) for w in caught)


def kv_token_bytes(model: Transformer) -> int:
    """K and V bytes of one cached position, every layer."""
    cfg = model.cfg
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * torch.empty((), dtype=model.dtype).element_size()


@torch.no_grad()
def bench_engine(model: Transformer, concurrency: list[int], steps: int, repeats: int, report,
                 compile: str | None, workload: str = "uniform") -> None:
    for c in concurrency:
        reqs, max_len = _requests(model, workload, c, steps)
        engine = Engine(model, c, max_len=max_len, compile=compile, token_events=False)
        impl = ("graph" if engine.decoder.use_graph else "static_eager") + ("_compiled" if compile else "")
        ctx = dict(concurrency=c, impl=impl, workload=workload)
        if engine.decoder.use_graph:
            report("engine_capture_s", engine.capture_s, "s", **ctx)
        _run(engine, reqs)  # warm-up: compile, the sampling graphs, first uses
        runs = [_run(engine, reqs) for _ in range(repeats)]
        report("engine_tok_s", statistics.median(t / s for s, t in runs), "tok/s", **ctx)
        seconds, flagged = _probe(engine, reqs)
        st = engine.stats
        n = max(st.steps, 1)
        report("engine_step_ms", 1000 * seconds / n, "ms", **ctx)
        report("engine_live_rows", st.rows / n, "rows", **ctx)
        report("engine_host_us", 1e6 * (st.step_s - st.wait_s) / n, "us", **ctx)
        report("engine_syncs_per_step", (st.chains + flagged) / n, "syncs", flagged=flagged, chain=engine.chain, **ctx)
        kv = st.kv_tokens * kv_token_bytes(model) / n
        report("engine_kv_mib", kv / 2**20, "MiB", **ctx)
        report("engine_kv_gb_s", kv * n / seconds / 1e9, "GB/s", **ctx)
        report("engine_admit_ms", 1000 * st.admit_s / max(st.admitted, 1), "ms", **ctx)


@torch.no_grad()
def bench_guard(report, compile: str | None, repeats: int = 3) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, dim=192, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=512, max_seq_len=4096)
    model = Transformer(cfg).init_weights(0).eval()
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(20, 36, (16,), generator=g).tolist()
    reqs = [(torch.randint(0, 512, (n,), generator=g).tolist(), SamplingParams(max_tokens=48)) for n in lens]
    speed = {}
    for max_len in (256, 4096):
        engine = Engine(model, 16, max_len=max_len, compile=compile)
        _run(engine, reqs)  # warm-up: the compile
        speed[max_len] = statistics.median(t / s for s, t in (_run(engine, reqs) for _ in range(repeats)))
        report("engine_tok_s", speed[max_len], "tok/s", max_len=max_len, concurrency=16, workload="guard",
               impl="static_eager_compiled" if compile else "static_eager")
    report("engine_guard_ratio", speed[4096] / speed[256], "x", kind="max_len 4096 over 256")
