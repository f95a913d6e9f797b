"""What a qgemv kernel costs in instructions, read off its sm_90 code on a machine with no GPU.

A batch-1 product should be bound by the bytes of its weights. Whether a kernel can be is
visible before any device runs it: Triton compiles it for sm_90 here (its wheel carries ptxas
and nvdisasm), and the main loop's length against the weight bytes one step of it reads gives
the thread instructions a weight byte. An SM issues 128 thread instructions a clock, so an
H200 (132 SMs, 1.98 GHz) runs at most 33.5 T of them a second: a kernel at I instructions a
byte can read no faster than 33.5 / I TB/s even with every issue slot filled, against the card's
4.8. Also printed: registers and spills (ptxas -v), which set how many programs an SM holds.

    python scripts/qgemv_sass.py KIND:K:BLOCK_N:BLOCK_K:WARPS:HALVES ...
    python scripts/qgemv_sass.py int4:4096:4:1024:2:2 int8:4096:4:512:2:2   (the 8B's gate/up)

KIND int4 | words (int4 a word at a time: tinyllm.kernels.qgemv_words, whose launch takes BLOCK_N of at least
qgemv_words.MIN_ROWS rows where it can) | dp4a (int4 on x rounded to int8: tinyllm.kernels.qgemv_dp4a) | int8 |
words8 (int8 a word at a time: qgemv_words.int8_words_gemv) | dense; HALVES 2
for a gated product (BLOCK_N rows of each half). The launch qgemv_triton picks for a matrix is
`qgemv_triton._cut(n, k, bytes_per_value, gated, dev)`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tinyllm.kernels import qgemv_triton as T

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
ISSUE_TB_S = 128 * 132 * 1.98e9 / 1e12  # thread instructions a second, H200, in T


def compile_kernel(kind: str, k: int, block_n: int, block_k: int, warps: int, halves: int):
    """The kernel compiled for sm_90 with a real launch's alignment hints, and the weight bytes
    one step of its loop reads."""
    aligned = [["tt.divisibility", 16]]
    tail = {"g_ptr": "*bf16", "r_ptr": "*bf16", "b_ptr": "*bf16", "eps": "fp32", "N": "i32", "K": "constexpr"}
    flags = {"HALVES": halves, "NORM": False, "RES": False, "BIAS": False, "ACT": 1 if halves == 2 else 0,
             "PDL": True}
    meta = {"BLOCK_N": "constexpr", "BLOCK_K": "constexpr", **dict.fromkeys(flags, "constexpr")}
    consts = {"K": k, "BLOCK_N": block_n, "BLOCK_K": block_k, **flags}
    if kind == "dp4a":  # tinyllm.kernels.qgemv_dp4a: W's words against x's int8 words
        from tinyllm.kernels import qgemv_dp4a as D

        sig = {"q_ptr": "*i32", "d_ptr": "*fp32", "xs_ptr": "*fp32", "w_ptr": "*i32", "s_ptr": "*fp16",
               "z_ptr": "*fp16", "y_ptr": "*bf16", "r_ptr": "*bf16", "b_ptr": "*bf16", "N": "i32", "K": "constexpr",
               **meta, "DP4A": "constexpr"}
        del sig["NORM"], consts["NORM"]
        src, per = ASTSource(D._dp4a_kernel, sig, constexprs={**consts, "DP4A": True},
                             attrs={(i,): aligned for i in range(9)}), 0.5
    elif kind in ("int4", "words"):
        sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*fp16", "z_ptr": "*fp16", "y_ptr": "*bf16", **tail,
               "G": "constexpr", **meta}
        fn, consts = T._int4_kernel, {**consts, "G": 32}
        if kind == "words":
            from tinyllm.kernels import qgemv_words

            fn, sig, consts = qgemv_words._kernel, {**sig, "ASM": "constexpr"}, {**consts, "ASM": True}
        src, per = ASTSource(fn, sig, constexprs=consts, attrs={(i,): aligned for i in range(8)}), 0.5
    elif kind in ("int8", "words8"):
        sig = {"x_ptr": "*bf16", "w_ptr": "*i8", "s_ptr": "*fp16", "y_ptr": "*bf16", **tail, **meta}
        fn = T._int8_kernel
        if kind == "words8":
            from tinyllm.kernels import qgemv_words

            fn, sig, consts = qgemv_words._int8_kernel, {**sig, "ASM": "constexpr"}, {**consts, "ASM": True}
        src, per = ASTSource(fn, sig, constexprs=consts, attrs={(i,): aligned for i in range(7)}), 1
    else:
        sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", **tail, **meta}
        src, per = ASTSource(T._dense_kernel, sig, constexprs=consts, attrs={(i,): aligned for i in range(6)}), 2
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    return compiled, int(block_n * halves * block_k * per)


def loop_length(sass: str) -> tuple[int, int]:
    """(instructions in the longest backward branch's span: the main loop, 0 where it is unrolled
    and short spans, such as a wait's spin, are not it; the kernel's instructions)."""
    at, n, best = {}, 0, 0
    for line in sass.splitlines():
        label = re.match(r"^\s*\.(L_x_\d+):", line)
        if label:
            at[label.group(1)] = n
        elif re.search(r"/\*[0-9a-f]{4,}\*/", line):
            n += 1
            jump = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", line)
            if jump and at.get(jump.group(1), n) < n:
                best = max(best, n - at[jump.group(1)])
    return (best if best >= 16 else 0), n


def report(spec: str) -> str:
    kind, k, block_n, block_k, warps, halves = spec.split(":")
    warps_n = int(warps)
    compiled, step_bytes = compile_kernel(kind, int(k), int(block_n), int(block_k), warps_n, int(halves))
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        open(ptx, "w").write(compiled.asm["ptx"])
        open(cubin, "wb").write(compiled.asm["cubin"])
        info = subprocess.run([os.path.join(BIN, "ptxas"), "-arch=sm_90a", "-v", ptx, "-o", os.devnull],
                              capture_output=True, text=True).stderr
        sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", cubin], capture_output=True, text=True).stdout
    regs = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores", info)
    loop, total = loop_length(sass)
    if loop:
        what, per_byte = f"loop {loop} instructions a step of {step_bytes} weight bytes", loop * warps_n * 32 / step_bytes
    else:  # unrolled: the whole kernel over a program's bytes (its prologue and epilogue counted too)
        program_bytes = step_bytes * int(k) // int(block_k)
        what, per_byte = (f"unrolled, {total} instructions a program of {program_bytes} weight bytes",
                          total * warps_n * 32 / program_bytes)
    return (f"{spec}: {regs.group(1) if regs else '?'} registers, {spills.group(1) if spills else '?'} B spilled; "
            f"{what}: {per_byte:.1f} a byte, {ISSUE_TB_S / per_byte:.2f} TB/s at full issue")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for spec in sys.argv[1:]:
        print(report(spec), flush=True)
