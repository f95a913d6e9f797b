"""Block-size rules of tinyllm.kernels.qgemv's kernels, swept on a GPU (docs/BENCHMARKS-LOG.md). A rule is
TINYLLM_QGEMV_BLOCKS's "P,B,W": programs per SM, weight bytes of a row a program reads a step
(8192: a whole row in one step, loaded before the PDL wait), warps. For each rule and each matrix
of a decode step (the 1.1B shape at int8, SmolLM2-135M and the Llama-3.1-8B shape at int4), the op as the compiled step
calls it (`torch.ops.tinyllm.int8_gemv` / `int4_gemv`, gate/up gated, one row of x, PDL launches)
is timed as REPS launches in a CUDA graph over copies of the matrix that together fill 4x the
L2, so each launch reads its weights from memory, as in a decode step. A rule's score is the
matrix time of one step (each layer matrix times the layer count, plus the output layer).
Prints JSON lines as it goes, then the rules best first, and last `BEST <model> <kind> P,B,W`
lines (scripts/device_pdl.sh reads them, SWEEP_S).

    python scripts/qgemv_sweep.py > sweep.jsonl
    SWEEP_MODELS=8b TINYLLM_INT4_DP4A=1 python scripts/qgemv_sweep.py   (the dp4a int4 product: a launch
        is its two kernels, quantize_x and the product, as a step runs them)
    SWEEP_MODELS=8b,smollm2 TINYLLM_INT4_KERNEL=words python scripts/qgemv_sweep.py   (the words kernel)
"""

import functools
import itertools
import json
import os

import torch

from tinyllm.core.quant import quantize
from tinyllm.kernels import qgemv_triton as T
from tinyllm.kernels.switches import SWITCHES

MODELS = {  # name: (kind, layers, {matrix: (N, K, gated)})
    "1.1b": ("int8", 22, {"qkv": (2560, 2048, False), "o": (2048, 2048, False), "gate_up": (11264, 2048, True),
                          "down": (2048, 5632, False), "lm_head": (32000, 2048, False)}),
    "smollm2": ("int4", 30, {"qkv": (960, 576, False), "o": (576, 576, False), "gate_up": (3072, 576, True),
                             "down": (576, 1536, False), "lm_head": (49152, 576, False)}),
    "8b": ("int4", 32, {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up": (14336, 4096, True),
                        "down": (4096, 14336, False)}),  # Llama-3.1-8B's Q4_K matrices (its Q6_K ones run int8)
    "1b": ("dense", 16, {"qkv": (3072, 2048, False), "o": (2048, 2048, False), "gate_up": (8192, 2048, True),
                         "down": (2048, 8192, False), "lm_head": (128256, 2048, False)}),  # Llama-3.2-1B, bf16
}
PER_SM, K_BYTES, WARPS = (4, 8, 16), (512, 1024, 2048, 8192), (2, 4, 8)
MODELS = {m: MODELS[m] for m in os.environ.get("SWEEP_MODELS", ",".join(MODELS)).split(",")}
REPS = 50
MAX_PER_THREAD = 64  # accumulator values a thread (the default rule's largest): beyond it, spills


def time_us(fns) -> float:
    """One launch's time: REPS launches in a CUDA graph, cycling through fns (copies of one
    matrix, together past the 50 MB L2)."""
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


def op(x, qt, gated: bool):
    if isinstance(qt, torch.Tensor):  # a dense bf16 matrix
        return lambda: torch.ops.tinyllm.dense_gemv(x, qt, gated)
    if qt.kind == "int8":
        return lambda: torch.ops.tinyllm.int8_gemv(x, qt.qweight, qt.scales, gated)
    if SWITCHES.int4_dp4a == "1":  # TINYLLM_INT4_DP4A=1: the dp4a product, its x rounded by quantize_x in each launch
        from tinyllm.kernels import qgemv_dp4a  # noqa: F401 (registers the ops)

        return lambda: torch.ops.tinyllm.int4_dp4a_gemv(x, qt.qweight, qt.scales, qt.zeros, qt.group, gated)
    if SWITCHES.int4_kernel == "words":  # TINYLLM_INT4_KERNEL=words: the words kernel, on its own tile
        from tinyllm.kernels import qgemv_words  # noqa: F401 (registers the op)

        return lambda: torch.ops.tinyllm.int4_words_gemv(x, qt.qweight, qt.scales, qt.zeros, qt.group, gated)
    return lambda: torch.ops.tinyllm.int4_gemv(x, qt.qweight, qt.scales, qt.zeros, qt.group, gated)


def emit(**row):
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rules = list(itertools.product(PER_SM, K_BYTES, WARPS))
    for model, (kind, layers, mats) in MODELS.items():
        per = {"int8": 1, "int4": 0.5, "dense": 2}[kind]
        score = {r: 0.0 for r in rules}
        for mat, (n, k, gated) in mats.items():
            rows = 2 * n if gated else n
            w = torch.randn(rows, k, device="cuda") * 0.05
            q = w.bfloat16() if kind == "dense" else quantize(w, kind, 32)
            nbytes = q.nbytes
            copies = max(2, -(-200_000_000 // nbytes))
            qts = [q.clone() if kind == "dense" else q.map(torch.clone) for _ in range(copies)]
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            if kind == "dense":  # cuBLAS's product of the same matrices, for scale
                us = time_us([functools.partial(torch.nn.functional.linear, x, c) for c in qts])
                emit(model=model, matrix=mat, kind="cublas", us=us, gbps=nbytes / us / 1e3)
            seen = {}  # (BLOCK_N, BLOCK_K, warps) -> us: rules that launch the same kernel
            for p, kb, warps in rules:
                bn, bk = T.blocks(rows, k, per, p * sms, kb)
                key = (bn, bk, warps)
                if bn * bk > MAX_PER_THREAD * 32 * warps:  # the (R, BLOCK_K) fp32 accumulator, R = bn
                    seen.setdefault(key, float("inf"))
                elif key not in seen:
                    T.RULE = T.Rule(p, kb, warps, 0, 0)  # the rule as written
                    try:
                        seen[key] = time_us([op(x, c, gated) for c in qts])
                    except Exception as e:  # a config the compiler refuses (registers, shared memory)
                        emit(model=model, matrix=mat, rule=f"{p},{kb},{warps}", error=str(e)[:160])
                        seen[key] = float("inf")
                    emit(model=model, matrix=mat, kind=kind, rule=f"{p},{kb},{warps}", block_n=bn, block_k=bk,
                         us=seen[key], gbps=nbytes / seen[key] / 1e3)
                score[p, kb, warps] += seen[key] * (1 if mat == "lm_head" else layers)
            del qts
        ranked = sorted(score.items(), key=lambda kv: kv[1])
        for (p, kb, warps), us in ranked:
            emit(model=model, kind=kind, rule=f"{p},{kb},{warps}", step_matrix_us=us)
        print(f"BEST {model} {kind} {','.join(map(str, ranked[0][0]))}", flush=True)


if __name__ == "__main__":
    main()
