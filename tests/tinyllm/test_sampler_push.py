"""The sampler's push in one Triton launch (tinyllm.kernels.sampler_push) against StepSampler.push's torch
code: the ring, its position (wrapping) and DRY's history, step after step, for one row and several.
Under Triton's interpreter on the CPU, and on CUDA; the kernel compiles for sm_90 with PDL."""

import textwrap

import pytest

from tests.triton_interpreter import compiled, interpreted, run_interpreted, sm90_ptx

CHECK = textwrap.dedent("""
    import torch
    from tinyllm.decode.sampling_params import DRY_WINDOW
    from tinyllm.decode.step_sampler import REPEAT_WINDOW
    from tinyllm.kernels.sampler_push import push

    def check(device):
        g = torch.Generator().manual_seed(0)
        for B, H in ((1, DRY_WINDOW), (3, DRY_WINDOW), (2, 5)):
            ring = torch.randint(0, 100, (B, REPEAT_WINDOW), generator=g)
            hist = torch.randint(-1, 100, (B, H), generator=g)
            at = torch.tensor([REPEAT_WINDOW - 3])  # wraps within the run
            mine = [t.clone().to(device) for t in (ring, at, hist)]
            for _ in range(7):
                ids = torch.randint(0, 100, (B, 1), generator=g)
                ring.index_copy_(1, at, ids)  # StepSampler.push's torch code
                at.add_(1).remainder_(REPEAT_WINDOW)
                hist.copy_(torch.cat([hist[:, 1:], ids], dim=1))
                push(ids.to(device), *mine)
                for want, got in zip((ring, at, hist), mine):
                    assert torch.equal(want, got.cpu()), (B, H, want, got)
        print("ok")
""")


@interpreted
def test_the_push_kernel_moves_the_windows_as_the_torch_push_under_the_triton_interpreter():
    r = run_interpreted(CHECK + "check('cpu')\n")
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr[-4000:]


@compiled
def test_the_push_kernel_compiles_for_the_h100_with_pdl_and_a_barrier_between_read_and_write():
    from tinyllm.kernels import sampler_push as sp

    sig = {"ids_ptr": "*i64", "ring_ptr": "*i64", "at_ptr": "*i64", "hist_ptr": "*i64", "B": "i32", "stride_r": "i32",
           "stride_h": "i32", "R": "constexpr", "H": "constexpr", "BLOCK_H": "constexpr", "PDL": "constexpr"}
    ptx = sm90_ptx(sp._push_kernel, sig, {"R": 64, "H": 1024, "BLOCK_H": 1024, "PDL": True}, num_warps=4)
    assert "griddepcontrol.wait" in ptx and "bar.sync" in ptx


@pytest.mark.cuda
def test_cuda_the_push_kernel_moves_the_windows_as_the_torch_push():
    namespace = {}
    exec(CHECK, namespace)
    namespace["check"]("cuda")
