"""One call of the CPU decode attention op (torch.ops.tinyllm_cpu.decode_attention) with
SmolLM2-135M's heads (B 1, Hkv 3, R 3, D 64, fp32), K and V slices of a 2,048-row cache, the
first `valid` keys of a W-key window attended; us a call at 1 and 2 threads
(docs/BENCHMARKS-LOG.md).

    python scripts/cpu_attention_bench.py
"""

import time

import torch

from tinyllm.kernels import cpu_qgemv


def main() -> None:
    assert cpu_qgemv.available(), "the kernel did not build here"
    op = torch.ops.tinyllm_cpu.decode_attention
    B, Hkv, R, D = 1, 3, 3, 64
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for W, valid in ((256, 8), (256, 200), (1024, 900)):
            q = torch.randn(B, Hkv, R, D)
            k, v = torch.randn(B, Hkv, 2048, D)[:, :, :W], torch.randn(B, Hkv, 2048, D)[:, :, :W]
            mask = (torch.arange(W) < valid)[None, None, None, :]
            for _ in range(50):
                op(q, k, v, mask, D ** -0.5)
            n = 2000
            t0 = time.perf_counter()
            for _ in range(n):
                op(q, k, v, mask, D ** -0.5)
            print(f"threads {threads}  W {W:5d}  keys {valid:4d}  {(time.perf_counter() - t0) / n * 1e6:6.1f} us")


if __name__ == "__main__":
    main()
