"""Block rules of tinyllm.kernels.qgemv's products, and the attention's tile, tried
inside the compiled decode step on CUDA (docs/BENCHMARKS-LOG.md).
scripts/qgemv_sweep.py times each matrix's product alone; inside the step a choice can measure
otherwise (PDL overlaps each kernel with the ones beside it), so it is chosen here by the
step's own replay time.

The ops read their rule (qgemv_triton.rule_for) and the attention its TILE
(decode_attention_triton) when they launch, which a graph capture records: one
process compiles the step once, then for each trial captures the step's graph again and times
its replays (the least of five runs of 200, each from the same position).
- Rules (--search all|gated|none): for each product shape of the step (or the gated ones),
  every candidate alone (the other shapes keep theirs), then the best of each together, then
  the defaults again (to see the drift).
- --attention: for the first four windows, the step with each tile (ATTENTION).
JSON lines on stdout; the kernels of the default step and of the best on stderr.

    python scripts/step_rules.py --preset tinyllama-1.1b --quant int8 --search gated --attention
    python scripts/step_rules.py --model FILE.gguf --quant keep
"""

import argparse
import json
import sys

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.kernels import decode_attention_triton as A
from tinyllm.kernels import qgemv_triton as T
from tinyllm.tools.bench import load_model, random_ids
from tinyllm.tools.bench_profile import kernels, replay_us

START = 32  # prompt tokens: each timed run of the rules replays from here
# The attention's trials (--attention): decode_attention_triton.TILE (windows of up to TILE keys
# in one tile a head; 0: always split and combined).
ATTENTION = [128, 0, 256]


def candidates(rule: T.Rule, gated_only: bool) -> list[T.Rule]:
    if gated_only:
        return [rule._replace(warps=1), rule._replace(warps=4), rule._replace(per_sm=8), rule._replace(k_bytes=256)]
    return [rule._replace(warps=8), rule._replace(warps=2), rule._replace(per_sm=8), rule._replace(per_sm=32),
            rule._replace(k_bytes=256), rule._replace(k_bytes=1024), rule._replace(k_bytes=2048),
            rule._replace(max_steps=4), rule._replace(max_steps=0), rule._replace(whole_row=0),
            rule._replace(whole_row=4096), rule._replace(per_sm=8, warps=8), rule._replace(k_bytes=1024, warps=8)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tinyllama-1.1b")
    ap.add_argument("--model")
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--search", choices=["all", "gated", "none"], default="all")
    ap.add_argument("--attention", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    model, name, _ = load_model(args, torch.device("cuda"), torch.bfloat16 if not args.model else None)
    dec = GraphDecoder(model, 1, max_len=min(1024, model.cfg.max_seq_len), compile="inductor")
    dec.prefill(random_ids(model, START))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default_rule = T.rule_for
    shapes: dict[tuple, T.Rule] = {}  # (n, k, bytes a value, gated) of each product -> its default rule
    table: dict[tuple, T.Rule] = {}

    def rule_for(n, k, bpv, gated):
        shape = (n, k, bpv, gated)
        shapes.setdefault(shape, default_rule(*shape))
        return table.get(shape, shapes[shape])
    T.rule_for = rule_for

    def step_us(trial: dict, window: int = dec.buckets[0], start: int = START) -> tuple[float, torch.cuda.CUDAGraph]:
        table.clear()
        table.update(trial)
        dec.graphs.clear()
        dec.truncate(start)
        dec.capture((window,))
        graph = dec.graphs[(window, 1, dec.sampler.greedy)][0]
        best = float("inf")
        for _ in range(5):
            dec.truncate(start)
            best = min(best, replay_us(graph, 200))
        dec.truncate(start)
        return best, graph

    def emit(**row):
        print(json.dumps({"model": name, "quant": args.quant, **row}), flush=True)

    def launch(shape, rule):  # what a rule launches for a shape: (BLOCK_N, BLOCK_K, warps)
        n, k, bpv, gated = shape
        bn, bk = T.blocks(n, k, bpv, rule.per_sm * sms, rule.k_bytes, rule.max_steps, rule.whole_row)
        return max(bn // (1 + gated), 1), bk, rule.warps

    def show(title: str, us: float, graph) -> None:
        print(f"== {title} {us:.1f} us", file=sys.stderr)
        for kname, k, kus in kernels(graph, top=15)[1]:
            print(f"   {kus:8.1f} us  x{k:<3} {kname}", file=sys.stderr)

    with torch.no_grad():
        us0, graph = step_us({})
        emit(trial="default", us=us0, window=dec.buckets[0])
        show("default", us0, graph)
        best = {}
        for shape in [s for s in shapes if args.search == "all" or (args.search == "gated" and s[3])]:
            seen = {launch(shape, shapes[shape]): us0}
            best_us = us0
            for rule in candidates(shapes[shape], args.search == "gated"):
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
        if best:
            us1, graph = step_us(best)
            emit(trial="best of each", table={str(list(s)): ",".join(map(str, r)) for s, r in best.items()}, us=us1)
            show("best of each", us1, graph)
            emit(trial="default again", us=step_us({})[0])
        if args.attention:
            default = A.TILE
            for window in dec.buckets[:4]:
                start = max(START, window // 2)  # keys to attend in every block of the window, the first ones
                dec.truncate(0)
                dec.prefill(random_ids(model, start))
                for tile in ATTENTION:
                    A.TILE = tile
                    emit(trial="attention", window=window, start=start, tile=tile,
                         us=step_us({}, window, start)[0])
            A.TILE = default


if __name__ == "__main__":
    main()
