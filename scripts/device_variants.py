"""Issue 32, second round on the H200: fine-tune only the layers at the model's two ends.

The first round (scripts/device_transfer.py) trained every weight of the moved SmolLM2: its
held-out loss beat the teacher's, but it answered fewer prompts right (45.5% in bf16, 42.9%
shipped, against the teacher's 54.5%), and the int4 body cost most of the gap, because the
fine-tune moved every matrix off the teacher's Q4_1 grid. Here the middle layers stay exactly
the teacher's (so int4 gives them back bit for bit: a Q4_1 group's min and max are its grid's
ends) and only what the new vocabulary touches trains: the embedding (the tied head), every
norm, and layers 0 and 26-29, which the ship holds at int8 anyway.

    python3 scripts/device_transfer.py bundle --tokenizer models/tinychat/tokenizer.model --part-mb 59.5
    run(carry=[".bundle/SHA256", ".bundle/part-00"], command="python3 scripts/device_transfer.py receive")
    run(carry=[".bundle/SHA256", ".bundle/part-01"],
        command="python3 scripts/device_transfer.py receive && python3 scripts/device_variants.py run --minutes 4.5")
    run(command="python3 scripts/device_variants.py export --from K")   # the winner's other shards

`run` does, each step skipped when its output is already in KEEP (a call cut by its time limit
goes on in the next one; KEEP is under /root, which outlives the calls of one warm machine):
the data links, the transfer, the tokenized cache; the teacher's eval beside VARIANTS' runs
(side by side on the one GPU, --minutes each, best/ by held-out loss, saved in fp32); each
run's best/ quantized as the ship is (FORMS); every ship's eval side by side. The winner is
the ship with the most correct answers (fewer degenerate replies break a tie); evals.json, the
runs' logs (report.tar) and the winner's files from shard 0 come back through $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import device_transfer
from device_transfer import DEVDATA, DEVICE, EVAL_ARGS, OUT, PY, TEACHER, TOK, TRAIN_ARGS, run

KEEP = Path(os.environ.get("KEEP", "/root/keep"))  # a dry run on a CPU: KEEP=/tmp/keep
# What trains: the new vocabulary's table, every norm, the first layer and the last four.
EDGES = r"^tok_emb\.|^norm\.|_norm\.|^blocks\.(0|26|27|28|29)\."
VARIANTS = [("edges-3e-4", ["--lr", "3e-4", "--min-lr", "3e-5", "--train-params", EDGES]),
            ("edges-1e-3", ["--lr", "1e-3", "--min-lr", "1e-4", "--train-params", EDGES])]
FORMS = ["--quant", "int4", "--half-scales", "--form", "tok_emb=int4",
         *[a for i in (0, 26, 27, 28, 29) for a in ("--form", f"blocks.{i}.=int8")]]


def prepare() -> None:
    for d in ("data/mix", "data/tinychat-distill"):
        Path(d).mkdir(parents=True, exist_ok=True)
    for f in [*DEVDATA.glob("*.jsonl.xz"), *Path("data/teacher").glob("teacher-*.jsonl.xz")]:
        for d in ("data/mix",) + (("data/tinychat-distill",) if f.name.startswith("chat-") else ()):
            (Path(d) / f.name).unlink(missing_ok=True)
            (Path(d) / f.name).symlink_to(f.resolve())
    if not (KEEP / "transfer/config.json").is_file():
        run([PY, "-m", "tinyllm.tools.vocab_transfer", "--teacher", TEACHER, "--tokenizer", TOK, "--out",
             str(KEEP / "transfer")])
    run([PY, "-m", "tinyllm.tools.train", "tokenize", "--tokenizer", TOK, "--data", "data/mix", "--workers", "16",
         "--cache-dir", str(KEEP / "cache")])


def start(args: list[str], log: Path) -> subprocess.Popen:
    print("$ " + " ".join(args), flush=True)
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def wait_all(procs: list[tuple[str, Path, subprocess.Popen]]) -> None:
    for name, log, p in procs:
        rc = p.wait()
        with open(OUT / "device.log", "a") as f:
            f.write(f"# {name}: rc {rc}\n" + log.read_text()[-20000:])
        print(json.dumps({"event": "done", "name": name, "rc": rc}), flush=True)
        print(log.read_text()[-1500:], flush=True)


def evaluate(name: str, model: str) -> tuple[str, Path, subprocess.Popen] | None:
    report = KEEP / f"eval-{name}.json"
    if report.is_file():
        return None
    return name, KEEP / f"eval-{name}.log", start(
        [PY, "-m", "tinyllm.tools.eval", "--model", model, "--device", DEVICE, "--quiet", "--json", str(report),
         *EVAL_ARGS], KEEP / f"eval-{name}.log")


def train_and_ship(minutes: float) -> None:
    KEEP.mkdir(parents=True, exist_ok=True)
    prepare()
    procs = [p for p in [evaluate("teacher", TEACHER)] if p]
    for name, extra in VARIANTS:
        out = KEEP / f"ft-{name}"
        if (out / "best/config.json").is_file() and any('"done"' in ln for ln in open(out / "log.jsonl")):
            continue
        shutil.rmtree(out, ignore_errors=True)
        procs.append((name, KEEP / f"ft-{name}.log", start(
            [PY, "-m", "tinyllm.tools.train", "model", "--tokenizer", TOK, "--data", "data/mix", "--cache-dir",
             str(KEEP / "cache"), "--init", str(KEEP / "transfer"), "--warmup", "50", "--log-every", "25",
             "--ckpt-every", "0", "--save-dtype", "fp32", "--out", str(out), "--budget-minutes", str(minutes),
             "--eval-every-s", "30", "--batch-size", "32", "--name", "tinychat", *extra, *TRAIN_ARGS],
            KEEP / f"ft-{name}.log")))
    wait_all(procs)
    for name, _ in VARIANTS:
        ship = KEEP / f"ship-{name}"
        if not (ship / "config.json").is_file():
            run([PY, "-m", "tinyllm.formats.convert", str(KEEP / f"ft-{name}/best"), str(ship), *FORMS, "--name",
                 "tinychat"])
        shutil.copy(KEEP / f"ft-{name}/log.jsonl", OUT / f"ft-{name}.jsonl")
    wait_all([p for p in (evaluate(name, str(KEEP / f"ship-{name}")) for name, _ in VARIANTS) if p])
    evals = {name: json.loads((KEEP / f"eval-{name}.json").read_text())
             for name in ["teacher", *(n for n, _ in VARIANTS)]}
    (OUT / "evals.json").write_text(json.dumps(evals, indent=1))
    for name, e in evals.items():
        print(json.dumps({"event": "eval", "name": name, **{k: e.get(k) for k in
                          ("correct", "checkable", "correct_rate", "degenerate", "loops", "unfinished", "heldout")}}))
    winner = max(VARIANTS, key=lambda v: (evals[v[0]]["correct"], -evals[v[0]]["degenerate"]))[0]
    (KEEP / "winner").write_text(winner)
    print(json.dumps({"event": "winner", "name": winner}), flush=True)


def pack_report() -> None:
    """device.log, evals.json and the runs' logs as one file: $OUT brings back 8 at most."""
    import tarfile

    files = sorted(OUT.iterdir())
    with tarfile.open(KEEP / "report.tar", "w") as tar:
        for f in files:
            tar.add(f, arcname=f.name)
    for f in files:
        f.unlink()
    shutil.copy(KEEP / "report.tar", OUT / "report.tar")


def export(start_shard: int) -> None:
    device_transfer.export(start_shard, KEEP / f"ship-{(KEEP / 'winner').read_text().strip()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=["run", "export"])
    ap.add_argument("--minutes", type=float, default=4.5, help="run: each variant's training budget")
    ap.add_argument("--from", dest="start", type=int, default=0, help="export: first shard to copy")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.stage == "run":
        train_and_ship(args.minutes)
        pack_report()
        export(0)
    else:
        export(args.start)
    print(json.dumps({"event": "stage_done", "stage": args.stage, "seconds": round(time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
