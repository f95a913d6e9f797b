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
def test_every_int4_and_int8_case_through_the_words_kernels_under_the_triton_interpreter():
    # test_qgemv's script, each raw int4 and int8 product through the words ops instead of the bytes kernels
    words = ("from tinyllm.kernels import qgemv_triton, qgemv_words\n"
             "qgemv_triton.int4_gemv = qgemv_words.int4_words_gemv\n"
             "qgemv_triton.int8_gemv = qgemv_words.int8_words_gemv\n")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", words + INTERPRETED], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr[-4000:]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (qgemv.linear imports its kernels)")
def test_qgemv_takes_the_words_kernel_unless_switched_to_bytes(monkeypatch):
    """qgemv.linear's int4 products go to the words op by default and to the bytes kernel under
    TINYLLM_INT4_KERNEL=bytes (dp4a first, where its switch takes the matrix)."""
    from tinyllm.kernels import qgemv, qgemv_triton, qgemv_words, switches

    called = []
    monkeypatch.setattr(qgemv_words, "int4_words_gemv", lambda *a: called.append("words") or "y")
    monkeypatch.setattr(qgemv_triton, "int4_gemv", lambda *a: called.append("bytes") or "y")
    q = torch.zeros(8, 16, dtype=torch.uint8)
    for env, want in (({}, "words"), ({"TINYLLM_INT4_KERNEL": "bytes"}, "bytes")):
        monkeypatch.setattr(qgemv, "SWITCHES", switches.read(env))
        assert qgemv.linear(torch.zeros(1, 32), "int4", q, torch.ones(8, 1), torch.zeros(8, 1), 32) == "y"
        assert called.pop() == want


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


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (its compiler)")
def test_int8_words_kernel_compiles_for_the_h200_below_the_bytes_kernels_instructions():
    """The int8 words kernel's launches on sm_90: each byte a shift and one LOP3 (inline PTX), the
    first weight load before PDL's wait, no spills, and fewer thread instructions a weight byte
    than the bytes kernel's launch of the same matrix: the 8B's down projection 5.2 (7.0) when
    written, and Qwen 0.5B's output layer (rows of 896) 7.7 where the bytes kernel's 64-row block
    spills 4 KB a thread (11.0)."""
    s = sass()
    compiled, _ = s.compile_kernel("words8", 14336, 4, 2048, 4, 1)
    ptx = compiled.asm["ptx"]
    assert ptx.count("0x007F8000") >= 4 and "cvt.rn.f32.s" not in ptx and "cvt.rn.f32.u" not in ptx
    assert ptx.index("ld.global") < ptx.index("griddepcontrol.wait")
    down = s.report("words8:14336:4:2048:4:1")
    assert " 0 B spilled" in down and per_byte(down) < 6.0 < per_byte(s.report("int8:14336:1:2048:4:1"))
    lm = s.report("words8:896:16:1024:4:1")
    assert " 0 B spilled" in lm and per_byte(lm) < 9.0
    assert " 0 B spilled" not in s.report("int8:896:64:512:4:1")


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_int8_blocks_hold_at_most_max_words_a_thread():
    from tinyllm.kernels.qgemv_words import MAX_WORDS, int8_rows, step_for

    assert step_for(14336, 4, 4, 4) == 2048 and step_for(896, 4, 4, 4) == 1024 and step_for(96, 4, 4, 4) == 128
    assert int8_rows(64, 1, 2) == 16 == MAX_WORDS // 2  # Qwen's output layer: 2 words a thread
    assert int8_rows(32, 1, 4) == 8  # the 8B's: 4 words a thread
    assert int8_rows(2, 2, 2) == 2 and int8_rows(1, 1, 64) == 1


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (qgemv.linear imports its kernels)")
def test_qgemv_takes_the_int8_words_kernel_unless_switched_off(monkeypatch):
    """int8 products go to the words op by default where K is a multiple of 4 (the words are int32), to the
    bytes kernel where it is not, and always under TINYLLM_INT8_KERNEL=bytes."""
    from tinyllm.kernels import qgemv, qgemv_triton, qgemv_words, switches

    called = []
    monkeypatch.setattr(qgemv_words, "int8_words_gemv", lambda *a: called.append("words") or "y")
    monkeypatch.setattr(qgemv_triton, "int8_gemv", lambda *a: called.append("bytes") or "y")
    for env, k, want in (({}, 32, "words"), ({"TINYLLM_INT8_KERNEL": "bytes"}, 32, "bytes"),
                         ({}, 30, "bytes")):
        monkeypatch.setattr(qgemv, "SWITCHES", switches.read(env))
        assert qgemv.linear(torch.zeros(1, k), "int8", torch.zeros(8, k, dtype=torch.int8), torch.ones(8)) == "y"
        assert called.pop() == want


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


@pytest.mark.cuda
@pytest.mark.parametrize("n,k,rows,kind,group", [c for c in CASES if c[3] == "int8"])
def test_cuda_int8_words_kernel_equals_the_dequantized_product(n, k, rows, kind, group):
    from tinyllm.kernels.qgemv_words import int8_words_gemv

    x, qt, ref = case(n, k, rows, kind, group, "cuda")
    assert rel_err(int8_words_gemv(x, qt.qweight, qt.scales), ref) < 1e-5, (n, k, rows)
    y = int8_words_gemv(x.bfloat16(), qt.qweight, qt.scales.bfloat16())  # as a CUDA step holds them
    assert y.dtype == torch.bfloat16 and rel_err(y, ref) < 1e-2
    if n % 2 == 0:
        gate, up = ref.chunk(2, dim=-1)
        y = int8_words_gemv(x, qt.qweight, qt.scales, True)
        assert rel_err(y, torch.nn.functional.silu(gate) * up) < 1e-5, (n, k, rows, "gated")
    w, r, fref = fused_case(x, qt)
    y = int8_words_gemv(x, qt.qweight, qt.scales, False, w, 1e-5, r)
    assert rel_err(y, fref) < 1e-5, (n, k, rows, "fused")
