"""tinyllm bench-long: decode speed late in a long context on CUDA, against
early (issue 44's H200 targets: the 1.1B shape at 8k and 32k keys >= 0.8x its speed at 128;
the engine on 125m at 256 rows with max_len 8,192 >= 0.7x its speed at max_len 1,024).

Contract:
- `long_model(preset, max_seq_len, device)`: a preset's shape (tinyllm.model.PRESETS) with
  its context raised to max_seq_len, random weights as tinyllm-bench's (bf16).
- `bench_starts(model, report, starts, steps, rounds, compile)`: batch 1, graphs on; for each
  start a GraphDecoder of max_len start + steps + 1 (a cache rewinds, never skips ahead),
  prefilled once with the same `start` random ids; a run rewinds to its start and decodes
  `steps` greedy tokens (keys start .. start + steps, the window the bucket that holds them;
  the compiled step's attention reads the keys up to the position only). The starts are
  alternated `rounds` times after a warm-up round (graph capture, compile), so a card that
  speeds up or slows down moves all alike. Rows: decode_tok_s (median) at each start, and
  over_first, its ratio to the first start's; impl "graph" (the plain step: window_attention
  over the whole bucket) and, with compile, "graph_compiled" (Inductor, the Triton op); on a
  CPU (the tests) the same steps eagerly.
- `bench_max_lens(model, report, rows, max_lens, steps, rounds, compile)`: one Engine of `rows`
  slots a max_len, the same `rows` requests each run (64-token prompts, `steps` new tokens,
  greedy: every row stays short), the engines alternated `rounds` times after a warm-up run.
  Each captures the window buckets its runs use (128 up to the one holding 64 + steps keys)
  and max_len's own, at one row bucket (`rows`): both decode in the same windows, so what
  differs is the cache's size (with every bucket, a 256-row engine's capture outlasted a
  device call: docs/BENCHMARKS.md). engine_capture_s a max_len;
  engine_tok_s (median) at each max_len and over_first; engine_syncs_per_step of one probe run
  (tinyllm.tools.bench_engine's).
- `main(argv)`: --preset, --starts, --steps, --rounds, --compile on|off for bench_starts;
  --engine-rows and --max-lens for bench_max_lens instead. Prints JSON lines, then the table
  (`table`); a CUDA-less machine or a bad value is one line on stderr, exit 2.
Speeds are measured, never asserted. Apart from tinyllm-bench's options for now (its module
was being changed by another session); `tinyllm bench` may take these as --starts/--max-lens.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from tinyllm.cuda_graph import GraphDecoder, default_buckets, pick_bucket
from tinyllm.decode.engine import Engine
from tinyllm.model import PRESETS, ModelConfig, Transformer
from tinyllm.tools.bench import Report, decode_run, int_list
from tinyllm.tools.bench_engine import ENGINE_PROMPT, _probe, _requests, _run


def long_model(preset: str, max_seq_len: int, device: torch.device) -> Transformer:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    cfg = ModelConfig.from_name(preset, max_seq_len=max_seq_len)
    with torch.device(device):
        model = Transformer(cfg)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model.to(torch.bfloat16).eval()


@torch.no_grad()
def bench_starts(model: Transformer, report: Report, starts: list[int], steps: int = 256, rounds: int = 5,
                 compile: bool = True) -> None:
    device = model.device
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (1, max(starts)), generator=g).to(device)  # (1, max start)
    for impl, backend in (("graph", None), ("graph_compiled", "inductor"))[:2 if compile else 1]:
        runs = {}
        for start in starts:
            dec = GraphDecoder(model, 1, max_len=start + steps + 1, use_graph=device.type == "cuda", compile=backend)
            dec.prefill(ids[:, :start])
            runs[start] = decode_run(dec, start, steps, device)
        times: dict[int, list[float]] = {s: [] for s in starts}
        for r in range(rounds + 1):  # round 0 warms up: capture, compile
            for start, run in runs.items():
                s = run()
                if r:
                    times[start].append(s)
        tok_s = {s: steps / statistics.median(ts) for s, ts in times.items()}
        for start, v in tok_s.items():
            report("decode_tok_s", v, "tok/s", impl=impl, start=start, steps=steps, rounds=rounds)
            report("over_first", v / tok_s[starts[0]], "x", impl=impl, start=start, first=starts[0])
        del runs, dec
        if device.type == "cuda":
            torch.cuda.empty_cache()


@torch.no_grad()
def bench_max_lens(model: Transformer, report: Report, rows: int = 256, max_lens: list[int] | None = None,
                   steps: int = 256, rounds: int = 3, compile: bool = True) -> None:
    max_lens = max_lens or [1024, 8192]
    reqs, need = _requests(model, "uniform", rows, steps)
    if need > min(max_lens):
        raise ValueError(f"{ENGINE_PROMPT} + {steps} keys a request exceed max_len {min(max_lens)}")
    engines = {}
    for m in max_lens:  # the windows the runs use and max_len's own, one row bucket: the graphs captured
        windows = default_buckets(m)
        buckets = tuple(sorted({*(b for b in windows if b <= pick_bucket(windows, need)), m}))
        engines[m] = Engine(model, rows, max_len=m, compile="inductor" if compile else None, token_events=False,
                            buckets=buckets, row_buckets=(rows,))
        report("engine_capture_s", engines[m].capture_s, "s", max_len=m, buckets=list(buckets), concurrency=rows)
    speed: dict[int, list[float]] = {m: [] for m in max_lens}
    for r in range(rounds + 1):  # round 0 warms up
        for m, engine in engines.items():
            seconds, tokens = _run(engine, reqs)
            if r:
                speed[m].append(tokens / seconds)
    impl = "graph_compiled" if compile else "graph"
    for m, engine in engines.items():
        v = statistics.median(speed[m])
        ctx = dict(impl=impl, max_len=m, concurrency=rows, steps=steps, rounds=rounds)
        report("engine_tok_s", v, "tok/s", **ctx)
        report("over_first", v / statistics.median(speed[max_lens[0]]), "x", first=max_lens[0], **ctx)
        seconds, flagged = _probe(engine, reqs)
        st = engine.stats
        report("engine_syncs_per_step", (st.chains + flagged) / max(st.steps, 1), "syncs", flagged=flagged, **ctx)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tinyllm bench-long", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tinyllama-1.1b", help=f"a shape of {', '.join(PRESETS)}")
    p.add_argument("--starts", type=int_list, default=[128, 8192, 32768], help="batch 1: keys a run starts from")
    p.add_argument("--steps", type=int, default=256, help="decode steps a run (a request's new tokens)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds, alternated, median taken")
    p.add_argument("--compile", default="on", choices=("on", "off"), help="also the compiled step (engine: instead)")
    p.add_argument("--engine-rows", type=int, help="measure the engine with this many slots instead")
    p.add_argument("--max-lens", type=int_list, default=[1024, 8192], help="the engine's max_len each")
    args = p.parse_args(argv)
    try:
        if not torch.cuda.is_available():
            raise ValueError("bench_long measures CUDA decode; no CUDA device here")
        if args.steps < 1 or args.rounds < 1:
            raise ValueError(f"--steps and --rounds must be >= 1, got {args.steps} and {args.rounds}")
        device = torch.device("cuda")
        longest = max(args.max_lens) if args.engine_rows else max(args.starts) + args.steps + 1
        model = long_model(args.preset, longest, device)
        report = Report(model=args.preset, device="cuda", dtype="bfloat16", quant="none")
        print(f"bench_long: {args.preset} at max_seq_len {longest}, {torch.cuda.get_device_name()}", file=sys.stderr)
        if args.engine_rows:
            bench_max_lens(model, report, args.engine_rows, args.max_lens, args.steps, args.rounds,
                           args.compile == "on")
        else:
            bench_starts(model, report, args.starts, args.steps, args.rounds, args.compile == "on")
    except (ValueError, FileNotFoundError) as e:
        print(f"bench_long: error: {e}", file=sys.stderr)
        return 2
    print(table(report), file=sys.stderr)
    return 0


def table(report: Report) -> str:
    lines = [f"{'metric':<22} {'impl':<15} {'start/max_len':>13} {'value':>10}  unit"]
    for r in report.rows:
        at = r.get("start", r.get("max_len", ""))
        lines.append(f"{r['metric']:<22} {r.get('impl', ''):<15} {at:>13} {r['value']:>10.4g}  {r['unit']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
