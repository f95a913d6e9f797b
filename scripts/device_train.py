"""One-command training on the device (an H200; no network). From the repository root:

    python3 scripts/device_train.py                      # prepare + final run (~9 min)
    python3 scripts/device_train.py --sweep --no-final   # prepare + shape sweep (~7 min)
    python3 scripts/device_train.py --shape s512x8       # final run of one shape
    python3 scripts/device_train.py -- --lr 1e-3         # extra flags for `tinyllm.train model`

Stages (each a `python -m tinyllm.train` subprocess, so every run gets a fresh GPU):
  prepare  data/tokenizer/tokenizer.model (trained unless present), then the tokenized cache in
           data/cache/ (built unless present). Needs data/tinychat-distill/*.jsonl.xz.
  sweep    every --shapes candidate for --sweep-minutes (eager unless --sweep-compile; the
           whole schedule in that time; eval every 15 s), then a table: params, tokens/s,
           steps, epochs, the eval loss at each minute and at the end.
  final    --shape (or the sweep's winner) for --final-minutes, compiled (if compiling
           fails, the rest of the time eagerly): runs/final-<shape>/.
Exports (to $OUT when set, else --export): runs.jsonl (all logs and the sweep table) and
model/ (the final run's best checkpoint, 15 MiB shards). The budget counts everything from
process start, setup and compile included; each run stops, evaluates and saves before its
budget ends.

Candidate shapes respect the product limits: <= 50M parameters, <= 64 MB saved in bf16, and
CPU decode >= 60 tok/s on 2 cores (scripts/cpu_decode_bench.py measures them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# vocab 8192 (the tokenizer), tied embeddings, head_dim 64, GQA with 2 KV heads.
SHAPES: dict[str, dict] = {
    "s384x6": dict(dim=384, n_layers=6, n_heads=6, n_kv_heads=2, ffn_dim=1024),  # the "tinychat" preset
    "s384x8": dict(dim=384, n_layers=8, n_heads=6, n_kv_heads=2, ffn_dim=1024),
    "s512x6": dict(dim=512, n_layers=6, n_heads=8, n_kv_heads=2, ffn_dim=1408),
    "s512x8": dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=2, ffn_dim=1408),
}
DEFAULT_SHAPE = "s512x8"
PY = sys.executable


def run(args: list[str], check: bool = True) -> int:
    print("$ " + " ".join(args), flush=True)
    return subprocess.run(args, check=check).returncode


def prepare(data: Path, vocab_size: int) -> Path:
    if not sorted(data.glob("*.jsonl.xz")):
        sys.exit(f"error: no *.jsonl.xz in {data}; carry the tinychat-distill files there")
    tok = Path("data/tokenizer/tokenizer.model")
    if not tok.is_file():
        run([PY, "-m", "tinyllm.train", "tokenizer", "--data", str(data), "--out", str(tok.parent),
             "--vocab-size", str(vocab_size)])
    run([PY, "-m", "tinyllm.train", "tokenize", "--tokenizer", str(tok), "--data", str(data)])
    return tok


def shape_flags(name: str) -> list[str]:
    return [x for k, v in SHAPES[name].items() for x in ("--" + k.replace("_", "-"), str(v))]


def train(tok: Path, data: Path, out: Path, shape: str, minutes: float, extra: list[str],
          eval_every_s: float, compile_: bool) -> list[dict]:
    """One run; if it fails with --compile, once more eagerly in the time that is left."""
    t0 = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    base = [PY, "-m", "tinyllm.train", "model", "--tokenizer", str(tok), "--data", str(data),
            "--out", str(out), "--preset", "tinychat", *shape_flags(shape), "--eval-every", "0",
            "--eval-every-s", str(eval_every_s), "--ckpt-every", "0", "--log-every", "50"]
    rc = run([*base, "--budget-minutes", str(minutes), *(["--compile"] if compile_ else []), *extra],
             check=not compile_)
    if rc:
        left = minutes - (time.perf_counter() - t0) / 60
        print(f"WARNING: the compiled run failed (exit {rc}); eagerly for the {left:.1f} min left",
              flush=True)
        failed = out.with_name(out.name + "-compile-failed")
        shutil.rmtree(failed, ignore_errors=True)
        out.rename(failed)
        run([*base, "--budget-minutes", f"{left:.2f}", *extra])
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def summarize(shape: str, records: list[dict]) -> dict:
    start = next(r for r in records if r.get("event") == "start")
    done = next(r for r in records if r.get("event") == "done")
    evals = [r for r in records if "eval_loss" in r and "event" not in r]
    speeds = [r["tok_s"] for r in records if "tok_s" in r][1:]  # the first window includes compiling
    per_minute = {}
    for r in evals:  # the last eval within each whole minute of elapsed time
        per_minute[f"{int(r['elapsed'] // 60) + 1}m"] = r["eval_loss"]
    return {"shape": shape, "params_M": round(start["params"] / 1e6, 2), "setup_s": start["setup_s"],
            "tok_s": round(sum(speeds) / len(speeds)) if speeds else None, "steps": done["step"],
            "epochs": done["epoch"], "eval_by_minute": per_minute, "final_eval": done["eval_loss"],
            "best_eval": done["best_eval_loss"], "ckpt_MB": round(done["ckpt_bytes"] / 1e6, 1)}


def export(dest: Path, runs: Path, final: Path | None) -> None:
    """Within what comes back from the device ($OUT: at most 8 files of 16 MiB, 64 MiB in
    all): runs.jsonl (every run's log lines, tagged with "run", and the sweep table) and
    model/ (the final run's best checkpoint: config, index, tokenizer, <= 4 shards)."""
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / "runs.jsonl", "w") as f:
        for log in sorted(runs.glob("*/log.jsonl")):
            for line in log.read_text().splitlines():
                f.write(json.dumps({"run": log.parent.name, **json.loads(line)}) + "\n")
        if (runs / "sweep.json").is_file():
            for row in json.loads((runs / "sweep.json").read_text()):
                f.write(json.dumps({"run": "sweep", **row}) + "\n")
    if final is not None and (final / "best").is_dir():
        files = sorted((final / "best").iterdir())
        sizes = [p.stat().st_size for p in files]
        if len(files) > 7 or max(sizes) > 16 * 2**20 or sum(sizes) > 62 * 2**20:
            print(f"not exporting {final / 'best'}: {len(files)} files, {sum(sizes) / 2**20:.1f} MiB "
                  "exceed what $OUT brings back", flush=True)
        else:
            shutil.copytree(final / "best", dest / "model", dirs_exist_ok=True)
    print(f"exported to {dest}: {sorted(p.name for p in dest.iterdir())}", flush=True)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="data/tinychat-distill")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--sweep", action="store_true", help="run the shape sweep")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--sweep-minutes", type=float, default=1.25)
    p.add_argument("--no-final", action="store_true")
    p.add_argument("--shape", default=None,
                   help=f"final shape (default: the sweep's best, else {DEFAULT_SHAPE})")
    p.add_argument("--final-minutes", type=float, default=8.0)
    p.add_argument("--no-compile", action="store_true", help="train the final run eagerly")
    p.add_argument("--sweep-compile", action="store_true",
                   help="compile the sweep's runs too (compiling takes a good part of a short run)")
    p.add_argument("--runs", default="runs")
    p.add_argument("--export", default=os.environ.get("OUT"))
    args = p.parse_args(argv)
    for s in [*args.shapes.split(","), *([args.shape] if args.shape else [])]:
        if s not in SHAPES:
            sys.exit(f"error: unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    t0, data, runs = time.perf_counter(), Path(args.data), Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    tok = prepare(data, args.vocab_size)
    print(f"prepared in {time.perf_counter() - t0:.0f} s", flush=True)
    final_shape = args.shape or DEFAULT_SHAPE
    if args.sweep:
        table = []
        for shape in args.shapes.split(","):
            recs = train(tok, data, runs / f"sweep-{shape}", shape, args.sweep_minutes, extra, 15,
                         args.sweep_compile)
            table.append(summarize(shape, recs))
            print("SWEEP " + json.dumps(table[-1]), flush=True)
        (runs / "sweep.json").write_text(json.dumps(table, indent=2) + "\n")
        print("\nshape     params  tok/s     steps  epochs  eval by minute              final  best")
        for r in table:
            mins = " ".join(f"{k}:{v:.3f}" for k, v in r["eval_by_minute"].items())
            print(f"{r['shape']:8s} {r['params_M']:6.1f}M {r['tok_s'] or 0:8d} {r['steps']:7d} "
                  f"{r['epochs']:6.2f}  {mins:26s} {r['final_eval']:.4f} {r['best_eval']:.4f}", flush=True)
        final_shape = args.shape or min(table, key=lambda r: r["best_eval"])["shape"]
    final = None
    if not args.no_final:
        final = runs / f"final-{final_shape}"
        recs = train(tok, data, final, final_shape, args.final_minutes, extra, 30, not args.no_compile)
        print("FINAL " + json.dumps(summarize(final_shape, recs)), flush=True)
    if args.export:
        export(Path(args.export), runs, final)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
