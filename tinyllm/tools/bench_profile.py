"""`tinyllm-bench --profile`: where a decode step's time goes, on CUDA.

For the plain and the compiled step (the plain alone with `--compile off`), at the first and the
last bucket: the replay time of one step's graph alone (events, no host work between replays), and the kernels of one step
(torch.profiler over ten replays: count, the most expensive twelve; with TINYLLM_TRACE_DIR
set, thirty, and a Chrome trace of the replays written there). Reports `replay_us`
and `kernels_per_step` through the bench's Report; the kernel tables go to stderr.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.kernels.switches import SWITCHES


def replay_us(graph: torch.cuda.CUDAGraph, n: int = 200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3


def kernels(graph: torch.cuda.CUDAGraph, n: int = 10, trace: str | None = None,
            top: int = 12) -> tuple[float, list[tuple[str, int, float]]]:
    """(kernels per replay, [(name, count per replay, µs per replay)] for the top ones); the
    profile's Chrome trace is written to `trace` if given."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()
    if trace:
        prof.export_chrome_trace(trace)
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    rows.sort(key=lambda e: -e.device_time_total)
    count = sum(e.count for e in rows) / n  # 0 where the profiler cannot see graph kernels
    return count, [(e.key[:70], e.count // n, e.device_time_total / n) for e in rows[:top]]


@torch.no_grad()
def bench_profile(model, report, prompt: torch.Tensor, compiled: bool = True) -> None:
    if model.device.type != "cuda":
        raise ValueError("--profile needs CUDA (it times graph replays)")
    for compile in (None, "inductor") if compiled else (None,):
        dec = GraphDecoder(model, 1, max_len=min(1024, model.cfg.max_seq_len), compile=compile)
        dec.prefill(prompt)
        impl = "compiled" if compile else "plain"
        for w in (dec.buckets[0], dec.buckets[-1]):
            dec.capture((w,))
            graph = dec.graphs[(w, 1, *dec.sampler.variant)][0]
            report("replay_us", replay_us(graph), "us", impl=impl, window=w)
            trace_dir = SWITCHES.trace_dir  # a Chrome trace of each step there
            trace = os.path.join(trace_dir, f"step_{impl}_{w}.json") if trace_dir else None
            count, top = kernels(graph, trace=trace, top=30 if trace else 12)
            report("kernels_per_step", count, "kernels", impl=impl, window=w)
            print(f"== {impl} W={w}: {count:.0f} kernels per step", file=sys.stderr)
            for name, k, us in top:
                print(f"   {us:8.1f} us  x{k:<3} {name}", file=sys.stderr)
