"""The int4 product a word at a time (tinyllm.kernels.qgemv_words, TINYLLM_INT4_KERNEL=words): test_qgemv's
cases through it under Triton's interpreter (the same float64 twins and tolerances as the bytes
kernel), its sm_90 code (the nibbles by shift and LOP3, PDL's wait after the first weight load,
and its instructions a weight byte against the bytes kernel's), its launch's rows, and on CUDA
the op against the dequantized product."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tinyllm.test_qgemv import CASES, INTERPRETED, case, fused_case, rel_err

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None


def sass():
    spec = importlib.util.spec_from_file_location("qgemv_sass", ROOT / "scripts" / "qgemv_sass.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_byte(line: str) -> float:
    return float(line.split(": ")[-1].split(" a byte")[0])


@pytest.mark.skipif(not HAS_TRITON or torch.cuda.is_available(),
                    reason="needs triton (its interpreter); on a CUDA machine the CUDA test runs the kernel")
def test_every_int4_case_through_the_words_kernel_under_the_triton_interpreter():
    # test_qgemv's script, each raw int4 product through the words op instead of the bytes kernel's
    words = ("from tinyllm.kernels import qgemv_triton, qgemv_words\n"
             "qgemv_triton.int4_gemv = qgemv_words.int4_words_gemv\n")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", words + INTERPRETED], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr[-4000:]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (qgemv.linear imports its kernels)")
def test_qgemv_takes_the_words_kernel_under_its_switch(monkeypatch):
    """qgemv.linear's int4 products go to the words op under TINYLLM_INT4_KERNEL=words (dp4a first
    where that switch takes the matrix), else to the bytes kernel."""
    from tinyllm.kernels import qgemv, switches

    called = []
    fake = type("Words", (), {"int4_words_gemv": staticmethod(lambda *a: called.append("words") or "y")})
    monkeypatch.setitem(sys.modules, "tinyllm.kernels.qgemv_words", fake)
    monkeypatch.setattr(qgemv, "SWITCHES", switches.read({"TINYLLM_INT4_KERNEL": "words"}))
    q = torch.zeros(8, 16, dtype=torch.uint8)
    assert qgemv.linear(torch.zeros(1, 32), "int4", q, torch.ones(8, 1), torch.zeros(8, 1), 32) == "y"
    assert called == ["words"]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (its compiler)")
def test_words_kernel_compiles_for_the_h200_at_half_the_bytes_kernels_instructions():
    """The 8B's gate/up launch: each nibble a shift and one LOP3 (inline PTX), the first weight
    load before PDL's wait, and the main loop at under 10.5 thread instructions a weight byte (9.0
    when written) against the bytes kernel's 22; the o projection's at 4 rows, under 13 (11.6)."""
    s = sass()
    compiled, _ = s.compile_kernel("words", 4096, 4, 2048, 2, 2)
    ptx = compiled.asm["ptx"]
    assert ptx.count("0x00780000") >= 8 and "cvt.rn.f32.s" not in ptx and "cvt.rn.f32.u" not in ptx
    assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")
    words = per_byte(s.report("words:4096:4:2048:2:2"))
    assert words < 10.5 and per_byte(s.report("int4:4096:4:1024:2:2")) > 2 * words
    assert per_byte(s.report("words:4096:4:4096:4:1")) < 13


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_a_block_takes_at_least_four_rows_where_every_sm_still_gets_a_program():
    from tinyllm.kernels.qgemv_words import rows_for, step_for

    assert rows_for(1, 4096, 1, 132) == 4  # the 8B's o projection: 1,024 programs
    assert rows_for(2, 14336, 2, 132) == 2  # gate/up: 2 features of each half are 4 rows
    assert rows_for(1, 14336, 2, 132) == 2
    assert rows_for(1, 400, 1, 132) == 1  # 100 programs would leave SMs idle
    assert rows_for(16, 49152, 1, 132) == 16  # more rows already
    assert step_for(4096, 32, 2) == 2048 and step_for(4096, 32, 4) == 4096 and step_for(96, 32, 4) == 128


@pytest.mark.cuda
@pytest.mark.parametrize("n,k,rows,kind,group", [c for c in CASES if c[3] == "int4"])
def test_cuda_words_kernel_equals_the_dequantized_product(n, k, rows, kind, group):
    from tinyllm.kernels.qgemv_words import int4_words_gemv

    x, qt, ref = case(n, k, rows, kind, group, "cuda")
    assert rel_err(int4_words_gemv(x, qt.qweight, qt.scales, qt.zeros, group), ref) < 1e-5, (n, k, rows)
    y = int4_words_gemv(x.bfloat16(), qt.qweight, qt.scales.half(), qt.zeros.half(), group)  # as a CUDA step holds them
    assert y.dtype == torch.bfloat16 and rel_err(y, ref) < 1e-2
    if n % 2 == 0:
        gate, up = ref.chunk(2, dim=-1)
        y = int4_words_gemv(x, qt.qweight, qt.scales, qt.zeros, group, True)
        assert rel_err(y, torch.nn.functional.silu(gate) * up) < 1e-5, (n, k, rows, "gated")
    w, r, fref = fused_case(x, qt)
    y = int4_words_gemv(x, qt.qweight, qt.scales, qt.zeros, group, False, w, 1e-5, r)
    assert rel_err(y, fref) < 1e-5, (n, k, rows, "fused")
