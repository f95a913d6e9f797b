"""Where a decode step's time goes on CUDA: graph replay alone (events, no host work between
replays), the decode loop as the bench runs it, and the kernels of one step (torch.profiler).

    PYTHONPATH=. python3 scripts/profile_step.py models/tinychat 125m tinyllama-1.1b
Prints one table per shape and impl (plain / compiled)."""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from tinyllm.bench import random_model
from tinyllm.cuda_graph import GraphDecoder


def replay_ms(graph, n=200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def loop_ms(dec, n=200) -> float:
    tok = torch.ones(1, 1, dtype=torch.long, device="cuda")
    dec.truncate(32)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        tok = dec.step(tok).argmax(-1)
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


for preset in sys.argv[1:]:
    if "/" in preset:  # a checkpoint folder
        from tinyllm.checkpoint import load_checkpoint
        model = load_checkpoint(preset, "cuda").model
    else:
        model = random_model(preset, torch.device("cuda"), torch.bfloat16)
    for compile in (None, "inductor"):
        dec = GraphDecoder(model, 1, max_len=min(1024, model.cfg.max_seq_len), compile=compile)
        dec.prefill(torch.randint(0, model.cfg.vocab_size, (1, 32), device="cuda"))
        dec.capture((128,))
        graph, _ = dec.graphs[128]
        r, lp = replay_ms(graph), loop_ms(dec)
        count, top = kernels(graph)
        print(f"\n== {preset} {compile or 'plain'}: replay {r * 1e3:.1f} us ({1e3 / r:.0f} tok/s), "
              f"loop {lp * 1e3:.1f} us ({1e3 / lp:.0f} tok/s), {count:.0f} kernels/step, "
              f"{r * 1e3 / count:.2f} us/kernel")
        for name, c, us in top:
            print(f"  {us:8.1f} us  x{c:<4} {name}")
