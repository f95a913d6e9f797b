"""The CPU kernel's one-row products (tinyllm.kernels.cpu_qgemv) in cache and from memory, in GB/s of
weights (docs/BENCHMARKS-LOG.md). For SmolLM2-135M's matrix shapes, one row of x:
"hot" repeats one matrix (it stays in cache), "cold" cycles through copies that together fill
MB megabytes (100 by default: past this machine's L2, as a decode step reads its weights).

    python scripts/cpu_qgemv_cold.py [THREADS] [MB]
"""

import functools
import sys
import time

import torch

from tinyllm.core.quant import quantize
from tinyllm.kernels import cpu_qgemv

SHAPES = [("int4", 3072, 576), ("int4", 576, 1536), ("int4", 960, 576), ("int8", 3072, 576), ("int8", 49152, 576)]


def per_call_us(fns, n: int = 400) -> float:
    for fn in fns:
        fn()
    t0 = time.perf_counter()
    for i in range(n):
        fns[i % len(fns)]()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    total = float(sys.argv[2]) * 1e6 if len(sys.argv) > 2 else 100e6
    assert cpu_qgemv.available(), "the kernel did not build here"
    torch.manual_seed(0)
    for kind, n, k in SHAPES:
        qt = quantize(torch.randn(n, k) * 0.05, kind, 32)
        x = torch.randn(1, k)
        parts = (qt.qweight, qt.scales.half(), qt.zeros.half()) if kind == "int4" else (qt.qweight, qt.scales)
        nbytes = sum(p.nbytes for p in parts)
        copies = [tuple(p.clone() for p in parts) for _ in range(min(400, max(2, int(total // nbytes))))]
        op = cpu_qgemv.qmm_int4 if kind == "int4" else cpu_qgemv.qmm_int8
        fns = [functools.partial(op, x, *c) for c in copies]
        hot, cold = per_call_us(fns[:1]), per_call_us(fns)
        print(f"{kind} {n}x{k} {nbytes / 1e6:.2f} MB: hot {hot:7.1f} us ({nbytes / hot / 1e3:5.1f} GB/s), "
              f"cold {cold:7.1f} us ({nbytes / cold / 1e3:5.1f} GB/s), {len(copies)} copies")


if __name__ == "__main__":
    main()
