"""tinyllm-bench --late-context: the native CPU step early and late in a context (issue 44's target:
a long chat must not get slower with every turn).

Contract: `bench_late(model, report, early, late, steps, rounds, kv_dtypes)` reports, for each K/V
dtype (the native step's cache: bf16, tinyllm.decode.cpu_step.KV_DTYPE, fp32 or int8), decode_tok_s at
"start" early and at "start" late (`steps` greedy steps from each, the keys start..start+steps)
and late_over_early, their ratio. Every dtype's two are measured alternately in one run
(`rounds` rounds of each, after a warm-up round; medians), so a machine that speeds up or slows
down over the run moves them all alike. Each start has its decoder, prefilled once with that many random ids (the same
ones); a run rewinds to its start. Refuses (ValueError) a model the native step does
not run, or a late start past the model's context.
"""

from __future__ import annotations

import statistics
import time

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import cpu_step
from tinyllm.model import Transformer

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "int8": torch.int8}


@torch.no_grad()
def run_from(dec: GraphDecoder, start: int, steps: int) -> float:
    """Seconds for `steps` greedy steps from position `start`."""
    dec.truncate(start)
    dec.tok.fill_(1)
    t0 = time.perf_counter()
    for _ in range(steps):
        dec.step(dec.tok)
    return time.perf_counter() - t0


@torch.no_grad()
def bench_late(model: Transformer, report, early: int = 100, late: int = 1900, steps: int = 64, rounds: int = 5,
               kv_dtypes: tuple[str, ...] = ("bf16", "fp32", "int8")) -> None:
    why = cpu_step.problem(model, 1)
    if why is not None:
        raise ValueError(f"--late-context measures the native CPU step, which cannot run this model: {why}")
    max_len = late + steps + 1
    if not 0 <= early < late or max_len > model.cfg.max_seq_len:
        raise ValueError(f"--late-context needs 0 <= early < late and late + steps < max_seq_len "
                         f"{model.cfg.max_seq_len}, got {early}, {late} and {steps}")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (1, late), generator=g)
    decs = {}
    for name in kv_dtypes:
        for start in (early, late):  # a decoder each: a cache rewinds, never skips ahead
            dec = decs[name, start] = GraphDecoder(model, 1, max_len=max_len, use_graph=False)
            cpu_step.use_native(dec, DTYPES[name])
            dec.prefill(ids[:, :max(start, 1)])
    times: dict[tuple[str, int], list[float]] = {key: [] for key in decs}
    for r in range(rounds + 1):  # round 0 warms up; every dtype and start each round
        for key, dec in decs.items():
            s = run_from(dec, key[1], steps)
            if r:
                times[key].append(s)
    tok_s = {key: steps / statistics.median(ts) for key, ts in times.items()}
    for name in kv_dtypes:
        for start in (early, late):
            report("decode_tok_s", tok_s[name, start], "tok/s", impl="static_eager_native", kv_dtype=name,
                   start=start, steps=steps, rounds=rounds)
        report("late_over_early", tok_s[name, late] / tok_s[name, early], "x", impl="static_eager_native",
               kv_dtype=name, early=early, late=late, steps=steps)
