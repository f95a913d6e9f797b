"""A post-norm inside its product (qgemv.linear's `post`: Gemma 2/3's O and down products): the
kernel's result against its slow twin, the product alone then qgemv.add_norm (the post-norm's own
kernel), for every weight form and product kernel, under Triton's interpreter and on CUDA. The
two must agree bit for bit: the same products, rounded the same way, then the same row arithmetic.
The row's count of finished programs is back at zero after every launch."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None

CHECK = textwrap.dedent("""
    import sys
    import torch
    from tinyllm.core.quant import quantize
    from tinyllm.kernels import qgemv, switches

    def check(device, dtype):
        before = qgemv.SWITCHES
        try:
            run(device, dtype)
        finally:
            qgemv.SWITCHES = before
        print("ok")

    def run(device, dtype):
        torch.manual_seed(0)
        # (rows, N, K): N over many programs, a partial last block; K a step or several
        shapes = [(1, 640, 256), (3, 300, 128)] if device == "cpu" else [(1, 640, 2048), (1, 2048, 640), (4, 1100, 256)]
        for kind, int8_kernel, int4_kernel, dp4a in (("dense", "words", "words", "0"), ("int8", "bytes", "words", "0"),
                                                    ("int8", "words", "words", "0"), ("int4", "words", "bytes", "0"),
                                                    ("int4", "words", "words", "0"), ("int4", "words", "words", "1")):
            qgemv.SWITCHES = switches.read({"TINYLLM_INT8_KERNEL": int8_kernel, "TINYLLM_INT4_KERNEL": int4_kernel,
                                            "TINYLLM_INT4_DP4A": dp4a})
            for rows, n, k in shapes:
                w = torch.randn(n, k) * 0.05
                x, r = torch.randn(rows, k).to(device, dtype), torch.randn(rows, n).to(device, dtype)
                post = (1 + 0.3 * torch.randn(n)).to(device, dtype)
                done = torch.zeros(qgemv.MAX_ROWS, dtype=torch.int32, device=device)
                if kind == "dense":
                    args = (w.to(device, dtype),)
                else:
                    qt = quantize(w, kind, 32).map(lambda t: t.to(device))
                    args = (qt.qweight, qt.scales.to(dtype), None if kind == "int8" else qt.zeros.to(dtype), 32)
                want = qgemv.add_norm(r, qgemv.linear(x, kind, *args), (post, 1e-6))
                for _ in range(3):  # the count is back at zero after each launch
                    got = qgemv.linear(x, kind, *args, residual=r, post=(post, 1e-6, done))
                    assert torch.equal(got, want), (kind, int8_kernel, int4_kernel, dp4a, rows, n, k,
                                                    (got.float() - want.float()).abs().max().item())
                    assert done.eq(0).all(), done
""")


@pytest.mark.skipif(not HAS_TRITON or torch.cuda.is_available(),
                    reason="needs triton (its interpreter); on a CUDA machine the CUDA test runs the kernels")
def test_a_post_norm_in_its_product_equals_the_product_then_the_norm_under_the_triton_interpreter():
    script = ("from tests.triton_interpreter import fix_numpy_index\nfix_numpy_index()\n" + CHECK
              + "check('cpu', torch.float16)\n")  # fp16: the interpreter's bf16 is not the GPU's
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr[-4000:]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (its compiler)")
def test_the_post_norm_compiles_for_the_h200_with_an_acquire_release_count():
    """The int8 words kernel with a post-norm, compiled for sm_90: the count is one acquire-release
    atomic add, and the last program reads the row from L2 (.cg), not from an L1 that another SM's
    stores never reach."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tinyllm.kernels import qgemv_words

    aligned = [["tt.divisibility", 16]]
    sig = {"x_ptr": "*bf16", "w_ptr": "*i8", "s_ptr": "*fp16", "y_ptr": "*bf16", "g_ptr": "*bf16", "r_ptr": "*bf16",
           "b_ptr": "*bf16", "eps": "fp32", "N": "i32", "K": "constexpr", "BLOCK_N": "constexpr",
           "BLOCK_K": "constexpr", "HALVES": "constexpr", "NORM": "constexpr", "RES": "constexpr", "BIAS": "constexpr",
           "ACT": "constexpr", "PDL": "constexpr", "ASM": "constexpr", "o_ptr": "*bf16", "p_ptr": "*bf16",
           "c_ptr": "*i32", "peps": "fp32", "POST": "constexpr", "BLOCK_C": "constexpr"}
    consts = {"K": 2048, "BLOCK_N": 4, "BLOCK_K": 512, "HALVES": 1, "NORM": False, "RES": True, "BIAS": False,
              "ACT": 0, "PDL": True, "ASM": True, "POST": True, "BLOCK_C": 1024}
    src = ASTSource(qgemv_words._int8_kernel, sig, constexprs=consts, attrs={(i,): aligned for i in range(7)})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    assert "atom.global.gpu.acq_rel.add" in ptx or "atom.acq_rel.gpu.global.add" in ptx, \
        [line for line in ptx.splitlines() if "atom" in line]
    assert "ld.global.cg" in ptx


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_a_post_norm_in_its_product_equals_the_product_then_the_norm(dtype):
    namespace = {}
    exec(CHECK, namespace)
    namespace["check"]("cuda", dtype)
