"""Block sizes of tinyllm.qgemv's kernels, swept on a GPU (docs/BENCHMARKS.md, "Quantized matrix-
vector products"). For each matrix of the TinyLlama-1.1B and SmolLM2-135M shapes and one row of
x, the int8 and int4 kernels at every (BLOCK_N, bytes a step, warps), and cuBLAS's bf16 product
of the same matrix. Each time is one launch, measured as 50 launches in a CUDA graph over
copies of the matrix that together fill 4x the L2 (the first sweep, on one copy, read the
smaller matrices from L2 and overstated every kernel). Then each rule of qgemv_triton.blocks
(programs per SM, bytes a step, warps) is scored by the matrix time of one decode step (the
layers' four products times the layer count, plus the output layer). Prints JSON lines as it
goes, then the rules' table, and last the best rule for the 1.1B int8 step as
TINYLLM_QGEMV_BLOCKS=P,B,W.

    python scripts/qgemv_sweep.py > sweep.jsonl
"""

import itertools
import json
import os

import torch
import torch.nn.functional as F

from tinyllm import qgemv_triton as T
from tinyllm.quant import QTensor, quantize

MODELS = {  # name: (layers, {matrix: (N, K)})
    "1.1b": (22, {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (11264, 2048), "down": (2048, 5632),
                  "lm_head": (32000, 2048)}),
    "smollm2": (30, {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
                     "lm_head": (49152, 576)}),
}
BLOCK_NS, K_BYTES, WARPS, PER_SM = (1, 2, 4, 8, 16, 32, 64), (512, 1024, 2048), (4, 8), (1, 2, 4, 8)
KINDS = os.environ.get("SWEEP_KINDS", "int8,int4").split(",")  # a part of the sweep, where time is short
MODELS = {m: MODELS[m] for m in os.environ.get("SWEEP_MODELS", ",".join(MODELS)).split(",")}
REPS = 50


def time_us(fns) -> float:
    """One launch's time: REPS launches in a CUDA graph, cycling through fns (copies of one
    matrix, together past the 50 MB L2, so each launch reads its weights from memory as a
    decode step does)."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(REPS):
            fns[i % len(fns)]()
    best = float("inf")
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1000 / REPS)
    return best


def copies(nbytes: int) -> int:
    return max(2, -(-200_000_000 // nbytes))  # 200 MB in all, 4x the L2


def launcher(x, qt, y, bn, bk, warps):
    n, k = qt.shape
    if qt.kind == "int8":
        return lambda: T._int8_kernel[(T.triton.cdiv(n, bn), 1)](x, qt.qweight, qt.scales, y, n, k, BLOCK_N=bn,
                                                                 BLOCK_K=bk, num_warps=warps)
    return lambda: T._int4_kernel[(T.triton.cdiv(n, bn), 1)](x, qt.qweight, qt.scales, qt.zeros, y, n, k, G=32,
                                                             BLOCK_N=bn, BLOCK_K=max(bk, 32), num_warps=warps)


def emit(**row):
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    times = {}  # (model, matrix, kind, bn, k_bytes, warps) -> us
    cublas = {}  # (model, matrix) -> us
    for model, (_, mats) in MODELS.items():
        for mat, (n, k) in mats.items():
            w = torch.randn(n, k, device="cuda") * 0.05
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            wbs = [w.bfloat16() for _ in range(copies(n * k * 2))]
            us = time_us([lambda x=x, wb=wb: F.linear(x, wb) for wb in wbs])
            cublas[model, mat] = emit(model=model, matrix=mat, kind="bf16", us=us, mb=n * k * 2 / 1e6)["us"]
            del wbs
            for kind in KINDS:
                q = quantize(w, kind, 32)
                qt = QTensor(kind, q.qweight, q.scales.bfloat16(), None if q.zeros is None else q.zeros.bfloat16())
                qts = [qt.map(torch.clone) for _ in range(copies(qt.nbytes))]
                y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
                per = 1 if kind == "int8" else 0.5
                for bn, kb, warps in itertools.product(BLOCK_NS, K_BYTES, WARPS):
                    bk = min(int(kb / per), T.triton.next_power_of_2(k))
                    try:
                        us = time_us([launcher(x, c, y, bn, bk, warps) for c in qts])
                    except Exception as e:  # a config the compiler refuses (registers, shared memory)
                        emit(model=model, matrix=mat, kind=kind, bn=bn, k_bytes=kb, warps=warps, error=str(e)[:160])
                        continue
                    times[model, mat, kind, bn, kb, warps] = us
                    emit(model=model, matrix=mat, kind=kind, bn=bn, k_bytes=kb, warps=warps, us=us,
                         gbps=qt.nbytes / us / 1e3)
    print("rule (programs per SM, bytes a step, warps): matrix time of one decode step, us", flush=True)
    best = {}
    for model, (layers, mats) in MODELS.items():
        base = sum(cublas[model, m] * (1 if m == "lm_head" else layers) for m in mats)
        print(f"{model} bf16 cuBLAS: {base:.0f}")
        for kind, per in (("int8", 1), ("int4", 0.5)):
            if kind not in KINDS:
                continue
            for p, kb, warps in itertools.product(PER_SM, K_BYTES, WARPS):
                total = 0.0
                for m, (n, k) in mats.items():
                    bn, _ = T.blocks(n, k, per, p * sms, kb)
                    total += times.get((model, m, kind, bn, kb, warps), float("inf")) * (1 if m == "lm_head" else layers)
                emit(model=model, kind=kind, rule=f"{p},{kb},{warps}", step_us=total, vs_bf16=base / total)
                if total < best.get((model, kind), (float("inf"),))[0]:
                    best[model, kind] = (total, f"{p},{kb},{warps}")
            per_shape = sum(min(v for key, v in times.items() if key[:3] == (model, m, kind)) *
                            (1 if m == "lm_head" else layers) for m in mats)
            print(f"{model} {kind}: best rule {best[model, kind][1]} {best[model, kind][0]:.0f} us; "
                  f"best per matrix {per_shape:.0f} us")
    if ("1.1b", "int8") in best:
        print(f"TINYLLM_QGEMV_BLOCKS={best['1.1b', 'int8'][1]}")


if __name__ == "__main__":
    main()
