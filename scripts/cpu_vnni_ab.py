"""The compiled CPU decode step with AVX512-VNNI rows against AVX2 rows, in ONE process
(docs/BENCHMARKS-LOG.md): `tinyllm.kernels.cpu_qgemv.use_vnni` flipped between rounds
(the order alternating), so a busy or drifting host touches both sides alike. Each round
decodes from position 32 to 128 for SECONDS; prints each side's rounds (tok/s) and median.

    python scripts/cpu_vnni_ab.py MODEL_FILE [ROUNDS] [SECONDS]
"""

import statistics
import sys
import time

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.formats.open_model import open_any
from tinyllm.kernels import cpu_qgemv
from tinyllm.tools.bench import random_ids


def main() -> None:
    path = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    secs = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    torch.set_num_threads(2)
    model, *_ = open_any(path, torch.device("cpu"), None, quant="keep")
    dec = GraphDecoder(model, 1, use_graph=False, compile="inductor")
    res: dict[bool, list[float]] = {True: [], False: []}
    with torch.no_grad():
        dec.prefill(random_ids(model, 32))
        for _ in range(5):  # the compile
            dec.step(dec.tok)
        if not cpu_qgemv.use_vnni(True):
            sys.exit("this CPU has no AVX512-VNNI")
        for i in range(rounds):
            for on in (True, False) if i % 2 == 0 else (False, True):
                cpu_qgemv.use_vnni(on)
                t0, n = time.perf_counter(), 0
                while time.perf_counter() - t0 < secs:
                    dec.truncate(32)
                    dec.tok.fill_(1)
                    for _ in range(96):
                        dec.step(dec.tok)
                        n += 1
                res[on].append(n / (time.perf_counter() - t0))
    for on in (True, False):
        print("vnni" if on else "avx2", " ".join(f"{v:.0f}" for v in res[on]),
              f"median {statistics.median(res[on]):.1f} tok/s")


if __name__ == "__main__":
    main()
