"""The repetition penalty and DRY in two Triton kernels (tinyllm.kernels.sampler_filters) against
StepSampler.draw's torch code for the same tensors (x = logits.float(), -inf from n_valid, then
sampling.apply_repeat_penalty and sampling.apply_dry). Under Triton's interpreter (the correctly
rounded pow): bit for bit for bases whose powers torch's CPU pow rounds correctly (checked first),
and within 2 ulps at the one id DRY penalizes with 1.3^28, which it does not. On CUDA (libdevice's
powf, as torch's): bit for bit. Both kernels compile for sm_90 with PDL."""

import importlib.util
import textwrap

import pytest
import torch

from tests.triton_interpreter import run_interpreted, sm90_ptx

HAS_TRITON = importlib.util.find_spec("triton") is not None

CHECK = textwrap.dedent("""
    import numpy as np
    import torch
    from tinyllm.decode.sampling import apply_dry, apply_repeat_penalty
    from tinyllm.kernels.sampler_filters import filtered_logits

    def loopy(g, B, N, V):
        # (B, N) ids from a small alphabet with repeated phrases: DRY has matches to find
        phrases = torch.randint(0, min(V, 12), (6, 5), generator=g)
        rows = [torch.cat([phrases[i] for i in torch.randint(0, 6, (N // 5 + 1,), generator=g)])[:N] for _ in range(B)]
        return torch.stack(rows)

    def reference(logits, n_valid, ring, penalty, hist, breaker, dry, dry_n):
        # StepSampler.draw's filtered logits, and the same before DRY
        x = logits.float()
        if n_valid < x.shape[1]:
            x[:, n_valid:] = float("-inf")
        x = apply_repeat_penalty(x, ring, penalty)
        return apply_dry(x, hist, breaker, dry[0:1], dry[1:2], dry_n[0:1], dry_n[1:2]), x

    def pow_rounded(base, device):
        # whether torch's pow on this device gives base^n correctly rounded for n <= 31, laid out as apply_dry's
        # (1,) ** (B, H - 1) is (both the vector loop and its tail on the CPU)
        n = torch.arange(32).repeat(64)[:2 * 1023].view(2, 1023)
        got = (torch.tensor([base], device=device) ** n.float().to(device)).cpu()
        want = torch.from_numpy((np.float64(np.float32(base)) ** n.double().numpy()).astype(np.float32))
        return torch.equal(got, want)

    def case(g, B, V, n_valid, H, filled, penalty, dry, allowed, last_n, dtype, periodic=False, breakers=(3,), shift=0):
        logits = torch.randn(B, V, generator=g) * 4
        logits[:, ::7] = 0.0  # zeros: neither divided nor (visibly) multiplied
        ring = loopy(g, B, 64, V)  # (B, 64) from the alphabet DRY's ids come from: some ids get both
        hist = torch.full((B, H), -1, dtype=torch.long)  # (B, H) -1 before the first id
        if periodic:  # one phrase over and over: runs of DRY_MAX_MATCH, the largest powers
            body = torch.arange(filled) % 5 + 1
            hist[:, H - filled:] = body.expand(B, filled)
        elif filled:
            hist[:, H - filled:] = loopy(g, B, filled, V) + shift  # shift 1: no id 0
        breaker = torch.zeros(V, dtype=torch.bool)
        breaker[list(breakers)] = True
        return dict(logits=logits.to(dtype), n_valid=n_valid, ring=ring, penalty=torch.tensor([penalty]), hist=hist,
                    breaker=breaker, dry=torch.tensor(dry), dry_n=torch.tensor([allowed, last_n]))

    def cases(g, dtypes):
        f32, low = dtypes[0], dtypes[1:]
        for dtype in dtypes:
            yield 3, case(g, 1, 50, 8, 16, 16, 1.3, [0.8, 1.75], 1, 16, dtype, breakers=(40,))  # ids 8-11: -inf
            yield 3, case(g, 3, 1000, 990, 1024, 400, 0.7, [2.0, 1.1], 1, 40, dtype, breakers=(3,))
        yield 16, case(g, 1, 5000, 4096, 1024, 1024, 1.3, [0.5, 3.0], 3, 100, f32, breakers=(40,))
        yield 2, case(g, 3, 5000, 5000, 1024, 700, 1.0, [0.0, 1.75], 2, 1024, low[0])  # DRY off: only the penalty
        yield 3, case(g, 3, 1000, 1000, 1024, 1024, 1.3, [0.8, 1.75], 2, 1024, f32, breakers=(11,))
        yield 3, case(g, 2, 1000, 1000, 300, 200, 1.3, [0.8, 2.0], 1, 1024, f32, periodic=True, breakers=(40,))  # over to 31
        yield 3, case(g, 2, 1000, 1000, 1024, 200, 1.3, [0.8, 1.75], 0, 1024, f32, shift=1)  # allowed 0: -1's spans hit id 0
        yield 3, case(g, 2, 300, 250, 2, 2, 1.3, [0.8, 1.75], 1, 1024, f32)  # H = 2: one span
        yield 3, case(g, 2, 300, 250, 1, 1, 0.7, [0.8, 1.75], 1, 1024, f32)  # H = 1: no DRY

    def compare(got, want, n_valid, before_dry=None):
        # bit for bit; with before_dry, bit for bit only where DRY took nothing, else within 2 ulps of
        # the larger of the value before DRY and DRY's penalty (a pow that rounds the other way)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert not got.isnan().any()
        assert torch.isneginf(got[:, n_valid:]).all() and torch.isfinite(got[:, :n_valid]).all()
        if before_dry is None:
            assert torch.equal(got, want), ((got != want).sum().item(), (got - want).abs().max().item())
        else:
            took = want != before_dry  # (B, V) the ids DRY penalized
            assert torch.equal(got[~took], want[~took])
            tol = 2 ** -22 * (before_dry[took].abs() + (before_dry[took] - want[took]).abs())
            assert ((got[took] - want[took]).abs() <= tol).all(), (got[took] - want[took]).abs().max().item()
        assert torch.equal(got.argmax(dim=-1), want.argmax(dim=-1))

    def check(device, dtypes, exact_pow=True):
        # exact_pow True: the kernel's default, the correctly rounded pow; False: libdevice's (CUDA), within 2 ulps
        rounded = exact_pow
        strict = rounded and all(pow_rounded(base, device) for base in (1.75, 1.1, 3.0, 2.0))
        assert strict or device != "cpu", "torch's CPU pow rounds these bases' powers correctly: bit for bit below"
        g = torch.Generator().manual_seed(0)
        for programs, c in cases(g, dtypes):
            c = {k: v.to(device) if torch.is_tensor(v) else v for k, v in c.items()}
            got = filtered_logits(**c, programs=programs, exact_pow=exact_pow)
            want, before_dry = reference(**c)
            compare(got, want, c["n_valid"], None if strict else before_dry)
        # 1.3^28, which torch's CPU pow rounds the other way: there bit for bit but at the id DRY penalizes
        c = case(g, 2, 1000, 1000, 300, 200, 1.3, [0.8, 1.3], 4, 1024, dtypes[0], periodic=True, breakers=(40,))
        c = {k: v.to(device) if torch.is_tensor(v) else v for k, v in c.items()}
        got, (want, before_dry) = filtered_logits(**c, programs=3, exact_pow=exact_pow), reference(**c)
        compare(got, want, c["n_valid"], before_dry)  # loose: 1.3^28 may round either way (both pows)
        if device == "cpu":
            assert not pow_rounded(1.3, device) and (got != want).sum().item() > 0, "the 1.3 case tests nothing"
        print("strict" if strict else "loose", "1.3:", (got != want).sum().item(), "ids differ")
        print("ok")
""")


@pytest.mark.skipif(not HAS_TRITON or torch.cuda.is_available(),
                    reason="needs triton (its interpreter); on a CUDA machine the CUDA test runs the kernels")
def test_the_filters_equal_the_torch_penalty_and_dry_under_the_triton_interpreter():
    r = run_interpreted(CHECK + "check('cpu', [torch.float32, torch.float16, torch.bfloat16])\n", timeout=900)
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr[-4000:]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (its compiler)")
def test_both_kernels_compile_for_the_h200_with_pdl_and_no_fused_multiply_add():
    """sm_90 PTX: each kernel waits on the one before (PDL); the filters kernel divides with IEEE
    rounding and, with the rounded pow, has no fused multiply-add at all (torch rounds the product,
    then subtracts). libdevice's powf has fmas of its own (its FTZ variant: Triton sets __CUDA_FTZ)."""
    from tinyllm.kernels import sampler_filters as sf

    def ptx(fn, sig, consts):
        return sm90_ptx(fn, sig, consts, num_warps=4, enable_fp_fusion=False)

    copy = ptx(sf._copy_kernel, {"logits_ptr": "*bf16", "x_ptr": "*fp32", "V": "i32", "n_valid": "i32",
                                 "stride_l": "i32", "stride_x": "i32", "BLOCK": "constexpr", "PDL": "constexpr"},
               {"BLOCK": sf.COPY_BLOCK, "PDL": True})
    assert "griddepcontrol.wait" in copy and "griddepcontrol.launch_dependents" in copy
    sig = {"logits_ptr": "*bf16", "x_ptr": "*fp32", "ring_ptr": "*i64", "penalty_ptr": "*fp32", "hist_ptr": "*i64",
           "breaker_ptr": "*i1", "dry_ptr": "*fp32", "dry_n_ptr": "*i64", "V": "i32", "n_valid": "i32",
           "stride_l": "i32", "stride_x": "i32", "stride_r": "i32", "stride_h": "i32"}
    consts = {"R": 64, "H": 1024, "M": 32, "BLOCK_R": 64, "BLOCK_J": 1024, "CHUNK": sf.CHUNK, "PDL": True}
    for exact in (True, False):
        filters = ptx(sf._filters_kernel, {**sig, **dict.fromkeys([*consts, "EXACT_POW"], "constexpr")},
                      {**consts, "EXACT_POW": exact})
        assert "griddepcontrol.wait" in filters and "div.rn.f32" in filters
        assert "fma." not in filters or not exact, [line for line in filters.splitlines() if "fma" in line]


@pytest.mark.cuda
@pytest.mark.parametrize("exact_pow", [True, False], ids=["rounded-pow", "libdevice-pow"])
def test_cuda_the_filters_equal_the_torch_penalty_and_dry(exact_pow):
    """The default, the correctly rounded pow: bit for bit if torch's CUDA pow rounds these bases'
    powers correctly (it did on an H100: bit for bit), else within 2 ulps where DRY penalized.
    libdevice's powf: within 2 ulps where DRY penalized (on an H100 two ids of 2.0^31 differed by 2)."""
    namespace = {}
    exec(CHECK, namespace)
    namespace["check"]("cuda", [torch.float32, torch.bfloat16, torch.float16], exact_pow=exact_pow)


DRAWS = textwrap.dedent("""
    import torch
    from tinyllm.decode.sampling import SamplingParams
    from tinyllm.decode.step_sampler import StepSampler
    from tinyllm.kernels import switches

    B, V, n_valid = 2, 300, 290
    g = torch.Generator().manual_seed(5)
    phrases = torch.randint(0, 12, (6, 5), generator=g)
    recent = torch.stack([torch.cat([phrases[i] for i in torch.randint(0, 6, (40,), generator=g)]) for _ in range(B)])
    settings = [SamplingParams(repeat_penalty=1.1, dry_multiplier=0.8),  # the app's defaults: greedy, both on
                SamplingParams(repeat_penalty=1.3), SamplingParams(dry_multiplier=2.0, dry_allowed_length=1),
                SamplingParams(temperature=0.8, top_k=20, seed=4, repeat_penalty=1.2, dry_multiplier=0.8)]
    for params in settings:
        ids = {}
        for fused in ("0", "1"):
            switches.SWITCHES = switches.read({"TINYLLM_FUSED_FILTERS": fused, "TRITON_INTERPRET": "1"})
            s = StepSampler(B, V, "cpu", n_valid)
            s.load(params, recent)
            assert s._fused_filters(torch.zeros(1, V)) == (fused == "1")
            g = torch.Generator().manual_seed(6)
            out = []
            for _ in range(12):
                logits = (torch.randn(B, V, generator=g) * 3).half()
                s.push(torch.randint(0, 12, (B, 1), generator=g))
                out.append(s.draw(logits))
            ids[fused] = torch.stack(out)
        assert torch.equal(ids["0"], ids["1"]), (params, ids)
    print("ok")
""")


@pytest.mark.skipif(not HAS_TRITON or torch.cuda.is_available(),
                    reason="needs triton (its interpreter); on a CUDA machine the CUDA test runs the kernels")
def test_the_sampler_draws_the_same_ids_with_the_fused_filters_under_the_triton_interpreter():
    """StepSampler.draw with TINYLLM_FUSED_FILTERS=1 (the two kernels) against the torch code, the
    same tensors, twelve steps of pushes and draws: the same ids, greedy with the app's defaults, each
    filter alone, and sampling (base 1.75, whose powers torch rounds correctly)."""
    r = run_interpreted(DRAWS, timeout=900)
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr[-4000:]


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (the module imports it)")
def test_the_kernels_count_a_repeat_as_far_as_the_samplers_do():
    from tinyllm.decode.sampling_params import DRY_MAX_MATCH
    from tinyllm.kernels import sampler_filters

    assert sampler_filters.DRY_MAX_MATCH == DRY_MAX_MATCH
