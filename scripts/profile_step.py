"""Where a decode step's time goes on CUDA: graph replay alone (events, no host work between
replays), the decode loop as the bench runs it, and the kernels of one step (torch.profiler).

    PYTHONPATH=. python3 scripts/profile_step.py models/tinychat 125m tinyllama-1.1b
Prints one table per shape, impl (plain / compiled) and decode attention (SDPA with a mask,
as before, against model.window_attention) at W=128 and W=1024."""

import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import tinyllm.model
from tinyllm.bench import random_model
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.model import window_attention


def replay_ms(graph, n=200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def loop_ms(dec, n=90) -> float:
    """Greedy decode as the bench runs it (32 -> 122: inside the 128 bucket)."""
    dec.truncate(32)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        dec.step(dec.tok)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def kernels(graph, n=10):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    count = max(sum(e.count for e in rows) / n, 1)  # 0 if the profiler can't see graph kernels
    rows.sort(key=lambda e: -e.device_time_total)
    return count, [(e.key[:70], e.count // n, e.device_time_total / n) for e in rows[:12]]


def sdpa_window(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def profile_one(model, compile, attention, windows=(128, 1024)):
    tinyllm.model.window_attention = attention
    dec = GraphDecoder(model, 1, max_len=min(1024, model.cfg.max_seq_len), compile=compile)
    dec.prefill(torch.randint(0, model.cfg.vocab_size, (1, 32), device="cuda"))
    dec.capture(windows)
    lp = loop_ms(dec)
    for w in windows:
        r = replay_ms(dec.graphs[w][0])
        count, top = kernels(dec.graphs[w][0])
        print(f"\n== {preset} {compile or 'plain'} {attention.__name__} W={w}: replay {r * 1e3:.1f} us "
              f"({1e3 / r:.0f} tok/s), {count:.0f} kernels/step, {r * 1e3 / count:.2f} us/kernel"
              + (f"; greedy loop {lp * 1e3:.1f} us ({1e3 / lp:.0f} tok/s)" if w == windows[0] else ""))
        for name, c, us in top:
            print(f"  {us:8.1f} us  x{c:<4} {name}")


for preset in sys.argv[1:]:
    if "/" in preset:  # a checkpoint folder
        from tinyllm.checkpoint import load_checkpoint
        model = load_checkpoint(preset, "cuda").model
    else:
        model = random_model(preset, torch.device("cuda"), torch.bfloat16)
    profile_one(model, None, sdpa_window)
    profile_one(model, None, window_attention)
    profile_one(model, "inductor", window_attention)
