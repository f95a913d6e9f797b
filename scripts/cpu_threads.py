"""The native CPU step's decode speed at several thread counts, one process (issue 50, item 6).

    python scripts/cpu_threads.py MODEL.gguf [--threads 1,2,4,8,15] [--steps 128] [--repeats 3]

One JSON line a thread count on stdout ({"threads", "tok_s", "ms_a_token", "min_blocks"}), and a table
on stderr. The model is opened with --quant keep (its int4/int8 matrices as the file has them), the step
is tinyllm.decode.cpu_step's one C++ call, greedy, from position 32. TINYLLM_CPU_MIN_BLOCKS (read once
by the C++ pool) is the switch to compare between processes: blocks of 32 weights a thread must have
before a product takes another thread.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import cpu_step
from tinyllm.formats.open_model import open_any
from tinyllm.tools.bench import decode_run, median_s, random_ids


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--threads", default="1,2,4,8,15")
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    model, *_ = open_any(args.model, torch.device("cpu"), None, quant="keep")
    dec = GraphDecoder(model, 1, use_graph=False)
    cpu_step.use_native(dec)
    start = 32
    min_blocks = os.environ.get("TINYLLM_CPU_MIN_BLOCKS", "512 (default)")
    with torch.no_grad():
        dec.prefill(random_ids(model, start))
        for t in (int(v) for v in args.threads.split(",")):
            torch.set_num_threads(t)
            s = median_s(decode_run(dec, start, args.steps, model.device), args.repeats)
            row = {"threads": t, "tok_s": round(args.steps / s, 1), "ms_a_token": round(s / args.steps * 1e3, 3),
                   "min_blocks": min_blocks, "model": os.path.basename(args.model)}
            print(json.dumps(row), flush=True)
            print(f"{row['model']:40} threads {t:2}  min_blocks {min_blocks:>13}  {row['tok_s']:8.1f} tok/s  "
                  f"{row['ms_a_token']:.3f} ms", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
