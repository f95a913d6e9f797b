"""A quantized embedding's lookup in one Triton launch (tinyllm.kernels.embed_rows) against QuantEmbedding's
torch code, bit for bit: int8 and int4 tables (fp16 and fp32 scales and offsets, groups of 32 and 64), every
activation dtype, a prompt's ids and a decode step's. Under Triton's interpreter on the CPU, and on CUDA;
the kernel compiles for sm_90 with PDL and no fused multiply-add."""

import textwrap

import pytest

from tests.triton_interpreter import compiled, interpreted, run_interpreted, sm90_ptx

CHECK = textwrap.dedent("""
    import torch
    from tinyllm.core.quant import half_scales, quantize
    from tinyllm.core.quant_linear import QuantEmbedding
    from tinyllm.kernels import switches

    def check(device):
        g = torch.Generator().manual_seed(0)
        w = torch.randn(300, 192, generator=g) * 0.1
        tables = [quantize(w, "int8"), quantize(w, "int4", 32), quantize(w, "int4", 64), half_scales(quantize(w, "int4"))]
        idx = [torch.randint(0, 300, (2, 9), generator=g), torch.tensor([[299]]), torch.tensor([[0], [7]])]
        if device == "cpu":
            switches.SWITCHES = switches.read({"TRITON_INTERPRET": "1"})
        n = 0
        for qt in tables:
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                emb = QuantEmbedding(qt.map(lambda t: t.to(device)), dtype)
                for ids in idx:
                    ids = ids.to(device)
                    got = emb(ids)  # the kernel
                    want = emb.torch_rows(ids)  # its slow twin
                    assert got.dtype == want.dtype == dtype and got.shape == (*ids.shape, 192)
                    assert torch.equal(got, want), (qt.kind, dtype, (got != want).sum().item())
                    n += 1
        print(n, "ok")
""")


@interpreted
def test_the_embedding_kernel_dequantizes_as_the_torch_lookup_under_the_triton_interpreter():
    r = run_interpreted(CHECK + "check('cpu')\n")
    assert r.returncode == 0 and r.stdout.endswith("36 ok\n"), r.stdout + r.stderr[-4000:]


@compiled
def test_the_embedding_kernel_compiles_for_the_h100_with_pdl_and_no_fused_multiply_add():
    from tinyllm.kernels import embed_rows as er

    sig = {"idx_ptr": "*i64", "q_ptr": "*u8", "s_ptr": "*fp16", "z_ptr": "*fp16", "out_ptr": "*bf16", "C": "constexpr",
           "G": "constexpr", "INT4": "constexpr", "ZEROS": "constexpr", "BLOCK_C": "constexpr", "PDL": "constexpr"}
    consts = {"C": 576, "G": 32, "INT4": True, "ZEROS": True, "BLOCK_C": 1024, "PDL": True}
    ptx = sm90_ptx(er._rows_kernel, sig, consts, num_warps=4, enable_fp_fusion=False)
    assert "griddepcontrol.wait" in ptx and "fma." not in ptx


@pytest.mark.cuda
def test_cuda_the_embedding_kernel_dequantizes_as_the_torch_lookup():
    namespace = {}
    exec(CHECK, namespace)
    namespace["check"]("cuda")
