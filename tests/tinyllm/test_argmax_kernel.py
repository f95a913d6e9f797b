"""The greedy draw's Triton argmax (tinyllm.kernels.argmax) against torch's `x[:, :n].argmax(-1)`: ties
across programs, NaN, -inf, rows narrower than their storage, every dtype, and a count that every launch
leaves at zero (a graph replays it). Under Triton's interpreter on the CPU, and on CUDA; the kernel
compiles for sm_90 with PDL."""

import textwrap

import pytest

from tests.triton_interpreter import compiled, interpreted, run_interpreted, sm90_ptx

CHECK = textwrap.dedent("""
    import torch
    from tinyllm.kernels.argmax import BLOCK, argmax

    def cases(g):
        V = 3 * BLOCK + 77  # four programs, the last one partly past n
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            yield torch.randn(3, V, generator=g).to(dtype), V
            yield torch.randn(2, V, generator=g).to(dtype), V - 100  # ids from n on are never drawn
        x = torch.randn(2, V, generator=g).bfloat16()
        x[:, 5], x[:, BLOCK + 9], x[:, 2 * BLOCK + 1] = 50.0, 50.0, 50.0  # a tie across programs: the first
        yield x, V
        x = torch.zeros(4, V).bfloat16()  # all equal: id 0
        x[1, BLOCK + 3] = 1.0  # (row 1: a lone largest in the second program)
        x[2] = float("-inf")  # all -inf: id 0, as torch
        x[3, 2 * BLOCK - 1] = float("inf")
        yield x, V
        x = torch.randn(3, V, generator=g)
        x[0, 2 * BLOCK + 5], x[0, BLOCK + 2] = float("nan"), float("nan")  # the first NaN
        x[1, 7], x[1, 3 * BLOCK] = float("inf"), float("nan")  # NaN beats inf
        x[2, V - 1] = float("nan")  # NaN past n: not seen
        yield x, V - 1
        x = torch.randn(1, 4 * BLOCK, generator=g)[:, :BLOCK - 3]  # a view: its row stride is not its width
        yield x, BLOCK - 3
        yield torch.randn(1, 50, generator=g).half(), 50  # one program, mostly masked
        yield torch.full((1, V), 0.5).half()[:, :V], 1  # n = 1

    def check(device):
        g = torch.Generator().manual_seed(0)
        count = torch.zeros(4, dtype=torch.int32, device=device)
        for x, n in cases(g):
            x = x.to(device)
            got = argmax(x, n, count[:x.shape[0]])
            want = x[:, :n].argmax(dim=-1)
            assert got.dtype == torch.long and torch.equal(got, want), (x.dtype, n, got, want)
            assert not count.any(), count  # every launch leaves it at zero
        print("ok")

    def check_sampler():
        # StepSampler's greedy draws, unfiltered (the logits as they come, n_valid < V) and filtered, with the
        # kernel (the interpreter on) and with torch's argmax (off): the same ids, step after step
        from tinyllm.decode.sampling import SamplingParams
        from tinyllm.decode.step_sampler import StepSampler
        from tinyllm.kernels import switches

        B, V, n_valid = 2, BLOCK + 300, BLOCK + 290
        g = torch.Generator().manual_seed(5)
        recent = torch.randint(0, 40, (B, 30), generator=g)
        for params in (SamplingParams(), SamplingParams(repeat_penalty=1.3, dry_multiplier=0.8)):
            ids = {}
            for interpret in ("1", "0"):
                switches.SWITCHES = switches.read({"TRITON_INTERPRET": interpret})
                s = StepSampler(B, V, "cpu", n_valid)
                s.load(params, recent)
                assert s._triton(torch.zeros(1, V)) == (interpret == "1")
                g = torch.Generator().manual_seed(6)
                out = []
                for _ in range(8):
                    logits = (torch.randn(B, V, generator=g) * 3).bfloat16()
                    logits[:, n_valid:] = 100.0  # never drawn
                    logits[0, 40] = logits[0, 9] = 60.0  # a tie: id 9
                    s.push(torch.randint(0, 40, (B, 1), generator=g))
                    out.append(s.draw(logits))
                ids[interpret] = torch.stack(out)
            assert torch.equal(ids["1"], ids["0"]) and (ids["1"] < n_valid).all(), (params, ids)
        print("sampler ok")
""")


@interpreted
def test_the_argmax_kernel_draws_torchs_argmax_under_the_triton_interpreter():
    r = run_interpreted(CHECK + "check('cpu')\ncheck_sampler()\n")
    assert r.returncode == 0 and r.stdout.endswith("ok\nsampler ok\n"), r.stdout + r.stderr[-4000:]


@compiled
def test_the_argmax_kernel_compiles_for_the_h100_with_pdl_and_an_acquire_release_count():
    from tinyllm.kernels import argmax as am

    sig = {"x_ptr": "*bf16", "out_ptr": "*i64", "best_ptr": "*fp32", "at_ptr": "*i32", "count_ptr": "*i32",
           "n": "i32", "stride_x": "i32", "P_BLOCK": "constexpr", "BLOCK": "constexpr", "PDL": "constexpr"}
    ptx = sm90_ptx(am._argmax_kernel, sig, {"P_BLOCK": 16, "BLOCK": am.BLOCK, "PDL": True}, num_warps=am.WARPS)
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    assert "atom.global.gpu.acq_rel.add" in ptx, [line for line in ptx.splitlines() if "atom" in line]


@pytest.mark.cuda
def test_cuda_the_argmax_kernel_draws_torchs_argmax():
    namespace = {}
    exec(CHECK, namespace)
    namespace["check"]("cuda")
