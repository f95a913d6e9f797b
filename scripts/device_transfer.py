"""The default model on the H200 (issue 32): SmolLM2 moved onto our tokenizer, fine-tuned, shipped.

The teacher GGUF (98 MB) and the data (20 MB) are more than one call carries beside the
working tree (64 MiB in all, 47 MB of it the tree), so they travel as one tar in parts over
back-to-back calls (the machine stays warm ~30 s after a call):

    python3 scripts/device_transfer.py bundle                 # here: .bundle/part-00.. + SHA256
    run(carry=[".bundle/SHA256", ".bundle/part-00"], command="python3 scripts/device_transfer.py receive")
    ... the same for each part; the last part's call goes on with `probe`:
    python3 scripts/device_transfer.py receive probe          # call 1: data, transfer, held-out, probes
    python3 scripts/device_transfer.py train --minutes 6      # call 2: the run, quantize, eval, export
    python3 scripts/device_transfer.py export --from 2        # call 3: the rest of the shards

Stages:
  bundle   (here) tar the teacher GGUF, tinychat-distill, teacher-s11 and TOKENIZER into
           .bundle/part-NN of --part-mb MB, with their sha256 and count in .bundle/SHA256
  receive  (device) keep the carried part in /root/bundle; once all are there, check and unpack
           them: the GGUF into data/smollm2/, the rest into .devdata/
  prepare  data/mix (the training folder) and data/tinychat-distill (the eval's held-out split)
           from .devdata/; runs/transfer (`tinyllm.tools.vocab_transfer`); held-out loss per byte of
           the teacher, the moved model and tinychat before any fine-tuning; the tokenized
           cache; `tinyllm.tools.eval` of the teacher.
  probe    PROBES short runs side by side on the GPU (--probe-steps each, the same data
           order), each scored by held-out loss; the winner's settings (runs/probe.json) go to
           the final run.
  final    the winner for --minutes (wall clock from its start, compile included), best/ kept
           by held-out loss: runs/ft/best.
  ship     runs/ship: runs/ft/best with every body matrix int4 (groups of 32, fp16 scales) and
           the embedding (the tied head) int8, 15 MiB shards (`tinyllm.formats.convert`); then
           `tinyllm.tools.eval` of runs/ship and runs/ft/best (bf16) on the GPU the teacher's ran on.
  export   copies to $OUT: device.log (every stage's output), evals.json, ft_log.jsonl and
           runs/ship's files from shard --from (at most 8 files, 64 MiB come back a call).
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

PY = sys.executable
TEACHER = "data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEVDATA = Path(os.environ.get("DEVDATA", ".devdata"))
TOK = str(DEVDATA / "tokenizer.model")
OUT = Path(os.environ.get("OUT", "runs/export"))
# A dry run on a CPU: DEVICE=cpu EVAL_ARGS="--limit 2 --heldout-rows 1" TRAIN_ARGS="--seq-len 128 ..."
DEVICE = os.environ.get("DEVICE", "cuda")
EVAL_ARGS = os.environ.get("EVAL_ARGS", "").split()
TRAIN_ARGS = os.environ.get("TRAIN_ARGS", "").split()
# Eager (a 30-layer compile costs a minute or more of a 5-minute run, and three at once more).
COMMON = ["--tokenizer", TOK, "--data", "data/mix", "--init", "runs/transfer", "--warmup", "50",
          "--log-every", "25", "--ckpt-every", "0"]
# (name, extra flags): learning rate and whether the body waits while the new embedding settles.
PROBES = [("lr3e-4", ["--lr", "3e-4", "--min-lr", "3e-5"]),
          ("lr3e-4-freeze", ["--lr", "3e-4", "--min-lr", "3e-5", "--freeze-body", "50"]),
          ("lr1e-3-freeze", ["--lr", "1e-3", "--min-lr", "1e-4", "--freeze-body", "50"])]


def run(args: list[str]) -> None:
    print("$ " + " ".join(args), flush=True)
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(OUT / "device.log", "a") as f:
        f.write("$ " + " ".join(args) + "\n" + p.stdout)
    print(p.stdout[-2500:], flush=True)
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(args)}")


BUNDLE, PARTS = Path(".bundle"), Path("/root/bundle")
SOURCES = ["../shared/data/tinychat-distill/chat-000.jsonl.xz", "../shared/data/tinychat-distill/chat-001.jsonl.xz",
           "../shared/data/teacher-s11/teacher-s11-000.jsonl.xz"]


def bundle(tokenizer: str, part_mb: float) -> None:
    import hashlib
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(TEACHER, arcname=TEACHER)
        for src in SOURCES:
            tar.add(src, arcname=f".devdata/{Path(src).name}")
        tar.add(tokenizer, arcname=".devdata/tokenizer.model")
    blob, size = buf.getvalue(), int(part_mb * 1e6)
    shutil.rmtree(BUNDLE, ignore_errors=True)
    BUNDLE.mkdir()
    parts = [blob[i:i + size] for i in range(0, len(blob), size)]
    for i, part in enumerate(parts):
        (BUNDLE / f"part-{i:02d}").write_bytes(part)
    (BUNDLE / "SHA256").write_text(f"{hashlib.sha256(blob).hexdigest()} {len(parts)}\n")
    print(json.dumps({"event": "bundle", "bytes": len(blob), "parts": len(parts)}))


def receive() -> bool:
    """Keep the carried part; unpack once all are here. True when the data is in place."""
    import hashlib
    import tarfile

    if Path(TEACHER).is_file() and (DEVDATA / "tokenizer.model").is_file():
        return True
    PARTS.mkdir(parents=True, exist_ok=True)
    for f in BUNDLE.glob("part-*"):
        shutil.copy(f, PARTS / f.name)
    digest, n = (BUNDLE / "SHA256").read_text().split()
    have = sorted(PARTS.glob("part-*"))
    print(json.dumps({"event": "receive", "have": len(have), "of": int(n)}), flush=True)
    if len(have) < int(n):
        return False
    blob = b"".join(p.read_bytes() for p in have)
    if hashlib.sha256(blob).hexdigest() != digest:
        sys.exit("the parts do not add up to the bundle (two bundles mixed?)")
    tar_path = PARTS / "bundle.tar"
    tar_path.write_bytes(blob)
    with tarfile.open(tar_path) as tar:
        tar.extractall(".", filter="data")
    return True


def prepare() -> None:
    for d in ("data/mix", "data/tinychat-distill"):
        Path(d).mkdir(parents=True, exist_ok=True)
    for f in [*DEVDATA.glob("*.jsonl.xz"), *Path("data/teacher").glob("teacher-*.jsonl.xz")]:
        for d in ("data/mix",) + (("data/tinychat-distill",) if f.name.startswith("chat-") else ()):
            (Path(d) / f.name).unlink(missing_ok=True)
            (Path(d) / f.name).symlink_to(f.resolve())
    if not Path("runs/transfer/config.json").is_file():
        run([PY, "-m", "tinyllm.tools.vocab_transfer", "--teacher", TEACHER, "--tokenizer", TOK, "--out", "runs/transfer"])
    sample = ["--sample", "20"] if EVAL_ARGS else []  # a dry run on a CPU scores 20 conversations
    run([PY, "scripts/heldout_table.py", "--device", DEVICE, *sample, TEACHER, "runs/transfer", "models/tinychat"])
    run([PY, "-m", "tinyllm.tools.train", "tokenize", "--tokenizer", TOK, "--data", "data/mix", "--workers", "16"])
    run([PY, "-m", "tinyllm.tools.eval", "--model", TEACHER, "--device", DEVICE, "--quiet", "--json",
         "runs/eval-teacher.json",
         *EVAL_ARGS])


def last_eval(out: str) -> float:
    evals = [json.loads(ln)["eval_loss"] for ln in open(Path(out) / "log.jsonl") if '"eval_loss"' in ln]
    return evals[-1]


def probe(steps: int) -> list[str]:
    procs = []
    for name, extra in PROBES:
        out = f"runs/probe-{name}"
        shutil.rmtree(out, ignore_errors=True)
        args = [PY, "-m", "tinyllm.tools.train", "model", *COMMON, *extra, "--out", out, "--max-steps", str(steps),
                "--eval-every", "0", "--eval-rows", "64", "--batch-size", "16", "--grad-accum", "2", *TRAIN_ARGS]
        print("$ " + " ".join(args), flush=True)
        procs.append((name, extra, out, subprocess.Popen(args, stdout=open(f"runs/probe-{name}.log", "w"),
                                                         stderr=subprocess.STDOUT)))
    scores = []
    for name, extra, out, p in procs:
        rc = p.wait()
        loss = last_eval(out) if rc == 0 else float("inf")
        scores.append((loss, name, extra))
        with open(OUT / "device.log", "a") as f:
            f.write(Path(f"runs/probe-{name}.log").read_text())
        print(json.dumps({"event": "probe", "name": name, "rc": rc, "eval_loss": loss}), flush=True)
    loss, name, extra = min(scores)
    winner = {"event": "probe_winner", "name": name, "eval_loss": loss, "flags": extra}
    print(json.dumps(winner), flush=True)
    Path("runs/probe.json").write_text(json.dumps(winner))
    return extra


def final(extra: list[str], minutes: float) -> None:
    shutil.rmtree("runs/ft", ignore_errors=True)
    run([PY, "-m", "tinyllm.tools.train", "model", *COMMON, *extra, "--out", "runs/ft", "--budget-minutes", str(minutes),
         "--eval-every-s", "30", "--batch-size", "32", "--name", "tinychat", *TRAIN_ARGS])


def ship() -> None:
    shutil.rmtree("runs/ship", ignore_errors=True)
    run([PY, "-m", "tinyllm.formats.convert", "runs/ft/best", "runs/ship", "--quant", "int4", "--form", "tok_emb=int8",
         "--half-scales", "--name", "tinychat"])
    evals = {}
    for name, model in (("ship", "runs/ship"), ("bf16", "runs/ft/best"), ("teacher", None)):
        if model:  # the teacher's ran in prepare, on the same GPU
            run([PY, "-m", "tinyllm.tools.eval", "--model", model, "--device", DEVICE, "--quiet", "--json",
                 f"runs/eval-{name}.json", *EVAL_ARGS])
        evals[name] = json.loads(Path(f"runs/eval-{name}.json").read_text())
    (OUT / "evals.json").write_text(json.dumps(evals, indent=1))


def export(start: int, ship: Path = Path("runs/ship")) -> None:
    """ship's small files (from shard 0 only) and its shards from `start`, as many as $OUT takes."""
    files = sorted(ship.iterdir())
    shards = [f for f in files if f.name.startswith("model-")]
    small = [f for f in files if f not in shards]
    room = 8 - len(list(OUT.iterdir()))
    pick = (small if start == 0 else []) + shards[start:]
    size = 0
    for f in pick:
        if room <= 0 or size + f.stat().st_size > 60 * 2**20:
            break
        shutil.copy(f, OUT / f.name)
        size, room = size + f.stat().st_size, room - 1
    print(json.dumps({"event": "export", "ship": ship.name, "files": sorted(p.name for p in OUT.iterdir())}),
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", nargs="+", choices=["bundle", "receive", "probe", "train", "export"])
    ap.add_argument("--tokenizer", default="runs/tok16384/tokenizer.model", help="bundle: the new tokenizer")
    ap.add_argument("--part-mb", type=float, default=19.0, help="bundle: part size in MB")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--probe-steps", type=int, default=150)
    ap.add_argument("--from", dest="start", type=int, default=0, help="export: first shard to copy")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for stage in args.stage:
        if stage == "bundle":
            bundle(args.tokenizer, args.part_mb)
        elif stage == "receive":
            if not receive():
                break
        elif stage == "probe":
            prepare()
            probe(args.probe_steps)
        elif stage == "train":
            path = Path("runs/probe.json")
            final(json.loads(path.read_text())["flags"] if path.is_file() else PROBES[1][1], args.minutes)
            shutil.copy("runs/ft/log.jsonl", OUT / "ft_log.jsonl")
            ship()
            export(0)
        else:
            export(args.start)
    print(json.dumps({"event": "stage_done", "stage": args.stage, "seconds": round(time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
