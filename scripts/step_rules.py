"""Block rules of tinyllm.qgemv's products tried inside the compiled decode step, on CUDA
(docs/BENCHMARKS.md, twelfth session). scripts/qgemv_sweep.py times each matrix's product
alone; inside the step a rule can measure otherwise (PDL overlaps each product with the kernels
beside it), so a rule is chosen here by the step's own replay time.

The ops read their rule (qgemv_triton.rule_for) when they launch, which a graph capture
records: one process compiles the step once, then for each trial answers rule_for with a table
(matrix shape -> rule, every other shape the default), captures the step's graph again and
times its replays (the least of five runs of 200, each from the same position). A coordinate
search: every candidate of each shape alone, then the best of every shape together, then the
default again (to see the drift). JSON lines on stdout; the kernels of the default and of the
best step on stderr.

    python scripts/step_rules.py --preset tinyllama-1.1b --quant int8
    python scripts/step_rules.py --model FILE.gguf --quant keep
"""

import argparse
import json
import sys

import torch

from tinyllm import qgemv_triton as T
from tinyllm.bench import load_model, random_ids
from tinyllm.bench_profile import kernels, replay_us
from tinyllm.cuda_graph import GraphDecoder

START = 32  # prompt tokens: each timed run replays from here


def candidates(base: T.Rule) -> list[T.Rule]:
    return [base._replace(warps=8), base._replace(warps=2), base._replace(per_sm=8), base._replace(per_sm=32),
            base._replace(k_bytes=256), base._replace(k_bytes=1024), base._replace(k_bytes=2048),
            base._replace(max_steps=4), base._replace(max_steps=0), base._replace(whole_row=0),
            base._replace(whole_row=4096), base._replace(per_sm=8, warps=8), base._replace(k_bytes=1024, warps=8)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tinyllama-1.1b")
    ap.add_argument("--model")
    ap.add_argument("--quant", default="int8")
    args = ap.parse_args()
    torch.manual_seed(0)
    model, name, _ = load_model(args, torch.device("cuda"), torch.bfloat16 if not args.model else None)
    dec = GraphDecoder(model, 1, max_len=min(1024, model.cfg.max_seq_len), compile="inductor")
    dec.prefill(random_ids(model, START))
    window = dec.buckets[0]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = T.RULE
    shapes: dict[tuple, T.Rule] = {}  # (n, k, bytes a value, gated) of each product the step launches
    table: dict[tuple, T.Rule] = {}

    def rule_for(n, k, bpv, gated):
        shapes.setdefault((n, k, bpv, gated), base)
        return table.get((n, k, bpv, gated), base)
    T.rule_for = rule_for

    def step_us(trial: dict) -> tuple[float, torch.cuda.CUDAGraph]:
        table.clear()
        table.update(trial)
        dec.graphs.clear()
        dec.truncate(START)
        dec.capture((window,))
        graph = dec.graphs[(window, 1, dec.sampler.greedy)][0]
        best = float("inf")
        for _ in range(5):
            dec.truncate(START)
            best = min(best, replay_us(graph, 200))
        dec.truncate(START)
        return best, graph

    def emit(**row):
        print(json.dumps({"model": name, "quant": args.quant, "window": window, **row}), flush=True)

    def launch(shape, rule):  # what a rule launches for a shape: (BLOCK_N, BLOCK_K, warps)
        n, k, bpv, gated = shape
        bn, bk = T.blocks(n, k, bpv, rule.per_sm * sms, rule.k_bytes, rule.max_steps, rule.whole_row)
        return max(bn // (1 + gated), 1), bk, rule.warps

    with torch.no_grad():
        us0, graph = step_us({})
        emit(trial="default", rule=",".join(map(str, base)), us=us0)
        print(f"== default {us0:.1f} us", file=sys.stderr)
        for kname, k, us in kernels(graph, top=15)[1]:
            print(f"   {us:8.1f} us  x{k:<3} {kname}", file=sys.stderr)
        best = {}
        for shape in list(shapes):
            seen = {launch(shape, base): us0}
            best_us = us0
            for rule in candidates(base):
                key = launch(shape, rule)
                if key in seen:
                    continue
                try:
                    seen[key] = us = step_us({shape: rule})[0]
                except Exception as e:  # a config the compiler refuses
                    emit(shape=list(shape), rule=",".join(map(str, rule)), error=str(e)[:200])
                    continue
                emit(shape=list(shape), rule=",".join(map(str, rule)), launch=list(key), us=us)
                if us < best_us:
                    best_us, best[shape] = us, rule
        us1, graph = step_us(best)
        emit(trial="best of each", table={str(list(s)): ",".join(map(str, r)) for s, r in best.items()}, us=us1)
        print(f"== best of each {us1:.1f} us", file=sys.stderr)
        for kname, k, us in kernels(graph, top=15)[1]:
            print(f"   {us:8.1f} us  x{k:<3} {kname}", file=sys.stderr)
        emit(trial="default again", us=step_us({})[0])


if __name__ == "__main__":
    main()
