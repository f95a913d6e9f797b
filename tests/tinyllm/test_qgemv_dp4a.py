"""tinyllm.kernels.qgemv_dp4a: the int4 product on x rounded to int8, against its slow twin
(x rounded as `reference` does, times the dequantized W, in float64).

- CPU with Triton: the kernels under Triton's interpreter (its `dp4a` written out as the same
  integer sum), and compiled for sm_90 with the real `dp4a` (what only the compiler refuses),
  where its main loop is counted in instructions a weight byte (scripts/qgemv_sass.py);
- CUDA: the ops on the GPU, bf16;
- CPU without Triton (CI): skipped."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tinyllm.kernels import qgemv, switches

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None

# (N, K, rows): odd N (a partial block), K of 3 groups (less than one step), several rows
CASES = [(300, 96, 1), (1100, 128, 2), (257, 640, 3), (64, 2048, 1)]


def twin(x, qt, norm=None, eps=1e-5, bias=None, gated=False, act="silu", residual=None):
    """The float64 product of x rounded as quantize_x rounds it with the dequantized W, and the folds."""
    from tinyllm.kernels.qgemv_dp4a import reference

    y = reference(x.float(), None if norm is None else norm.float(), eps).double() @ qt.dequantize(torch.float64).T
    if bias is not None:
        y = y + bias.double()
    if gated:
        gate, up = y.chunk(2, dim=-1)
        f = torch.nn.functional.silu if act == "silu" else lambda t: torch.nn.functional.gelu(t, approximate="tanh")
        y = f(gate) * up
    return y if residual is None else y + residual.double()


def rel_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


INTERPRETED = textwrap.dedent("""
    import torch
    from tests.triton_interpreter import fix_numpy_index
    fix_numpy_index()
    from tinyllm.core.quant import quantize
    from tinyllm.kernels import qgemv, qgemv_triton
    from tinyllm.kernels import qgemv_dp4a as D
    from tests.tinyllm.test_qgemv_dp4a import CASES, rel_err, twin

    g = torch.Generator().manual_seed(0)
    # quantize_x: the bytes, scales and sums exactly as the module docstring lays them out
    x = torch.randn(3, 96, generator=g) * torch.tensor([0.01, 1.0, 30.0]).repeat_interleave(32)
    x[1, 32:64] = 0  # a group of zeros: scale 0, bytes 0
    xq, xd, xs = D.quantize_x(x)
    v = x.view(3, 3, 32)
    d = v.abs().amax(-1) / 127
    q = torch.floor(v / d.clamp_min(1e-30)[..., None] + 0.5).to(torch.int32)
    b = xq.view(3, 3, 8).unsqueeze(-1).bitwise_right_shift(torch.arange(4) * 8).bitwise_and(255)  # (row, group, word, byte)
    b = torch.where(b > 127, b - 256, b)
    want = q.view(3, 3, 4, 4, 2).permute(0, 1, 4, 2, 3).reshape(3, 3, 8, 4)  # value 8c + 2i + p -> word 4p + c, byte i
    assert torch.equal(b, want), "quantize_x's words"
    assert torch.allclose(xd, d) and torch.allclose(xs, d * q.sum(-1).float(), rtol=1e-6), "scales, sums"
    assert torch.equal(D.reference(x), (q * d[..., None]).view(3, 96)), "reference"

    for n, k, rows in CASES:
        w = torch.randn(n, k, generator=g) * 0.05
        qt = quantize(w, "int4", 32)
        x = torch.randn(rows, k, generator=g)
        op = lambda *a, **kw: D.int4_dp4a_gemv(x, qt.qweight, qt.scales, qt.zeros, 32, *a, **kw)
        y = op()
        assert y.shape == (rows, n) and rel_err(y, twin(x, qt)) < 1e-5, (n, k, rows, rel_err(y, twin(x, qt)))
        exact = x.double() @ qt.dequantize(torch.float64).T
        assert 1e-4 < rel_err(y, exact) < 2e-2, (n, k, rows, "x's rounding", rel_err(y, exact))
        if n * k > 200_000:
            continue  # the interpreter is slow: the folds on small shapes
        norm = 1 + 0.3 * torch.randn(k, generator=g)
        res, bias = torch.randn(rows, n, generator=g), torch.randn(n, generator=g)
        y = op(False, norm, 1e-5, res, bias)
        assert rel_err(y, twin(x, qt, norm, 1e-5, bias, residual=res)) < 1e-5, (n, k, rows, "norm, bias, residual")
        if n % 2 == 0:
            for act in ("silu", "gelu_tanh"):
                y = op(True, norm, 1e-5, None, bias, act)
                assert rel_err(y, twin(x, qt, norm, 1e-5, bias, True, act)) < 1e-5, (n, k, rows, act)
        # qgemv.linear takes this product only under TINYLLM_INT4_DP4A=1 (read at import: set by the test)
        via = qgemv.linear(x, "int4", qt.qweight, qt.scales, qt.zeros, 32, norm=(norm, 1e-5))
        dp4a = op(False, norm, 1e-5)
        plain = qgemv_triton.int4_gemv(x, qt.qweight, qt.scales, qt.zeros, 32, False, norm, 1e-5)
        assert torch.equal(via, dp4a) and not torch.equal(via, plain), "the switch's route"
    print("ok")
""")


@pytest.mark.skipif(not HAS_TRITON or torch.cuda.is_available(),
                    reason="needs triton (its interpreter); on a CUDA machine the CUDA test runs the kernels")
def test_dp4a_product_equals_its_twin_under_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "TINYLLM_INT4_DP4A": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", INTERPRETED], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr[-4000:]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (its compiler)")
def test_dp4a_kernel_compiles_for_the_h200_at_a_few_instructions_a_byte():
    """The real dp4a, PDL's wait after the first weight load, and the 8B's gate/up launch's
    main loop at under 6 thread instructions a weight byte (3.0 when written; the int4 kernel's
    is 22: scripts/qgemv_sass.py)."""
    spec = importlib.util.spec_from_file_location("qgemv_sass", ROOT / "scripts" / "qgemv_sass.py")
    sass = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass)
    compiled, step_bytes = sass.compile_kernel("dp4a", 4096, 4, 1024, 2, 2)
    ptx = compiled.asm["ptx"]
    assert "dp4a.u32.s32" in ptx
    assert ptx.index("ld.global.v4.b32") < ptx.index("griddepcontrol.wait")
    line = sass.report("dp4a:4096:4:1024:2:2")
    per_byte = float(line.split(": ")[-1].split(" a byte")[0])
    assert per_byte < 6, line
    assert float(sass.report("int4:4096:4:1024:2:2").split(": ")[-1].split(" a byte")[0]) > 3 * per_byte


@pytest.mark.cuda
@pytest.mark.parametrize("n,k,rows", CASES)
def test_cuda_dp4a_product_equals_its_twin(n, k, rows):
    from tinyllm.core.quant import quantize
    from tinyllm.kernels import qgemv_dp4a as D

    g = torch.Generator().manual_seed(n + k)
    qt = quantize(torch.randn(n, k, generator=g) * 0.05, "int4", 32).map(lambda t: t.cuda())
    x = torch.randn(rows, k, generator=g).cuda().bfloat16()
    s, z = qt.scales.half(), qt.zeros.half()  # as CUDA holds them (quant.half_scales)
    norm, res = (1 + 0.3 * torch.randn(k, generator=g)).cuda().bfloat16(), torch.randn(rows, n, generator=g).cuda()
    y = D.int4_dp4a_gemv(x, qt.qweight, s, z, 32, False, norm, 1e-5, res.bfloat16())
    ref = twin(x, qt, norm, 1e-5, residual=res.bfloat16())
    assert y.dtype == torch.bfloat16 and rel_err(y, ref) < 1e-2  # bf16 x, scales and output


@pytest.mark.parametrize("mode,want", [("0", (False, False, False)), ("1", (True, True, False)),
                                       ("auto", (False, True, False))])
def test_which_int4_products_take_x_rounded(monkeypatch, mode, want):
    """TINYLLM_INT4_DP4A: never, always, or (auto) from DP4A_MIN_BYTES of weights up; groups of 32 only."""
    monkeypatch.setattr(qgemv, "SWITCHES", switches.read({"TINYLLM_INT4_DP4A": mode}))
    small = torch.empty(576, 288, dtype=torch.uint8)  # SmolLM2's O projection, packed
    big = torch.empty(qgemv.DP4A_MIN_BYTES // 2048, 2048, dtype=torch.uint8)  # exactly the threshold
    assert (qgemv.uses_dp4a(small, 32), qgemv.uses_dp4a(big, 32), qgemv.uses_dp4a(big, 64)) == want
