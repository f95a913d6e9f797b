"""The native CPU step (tinyllm.decode.cpu_step) on every model family's features, against its
slow twins: the plain static step run eagerly (GraphDecoder use_graph=False), a full forward
without a cache, and generate()'s greedy tokens.

Each family is a tiny random Transformer of that family's ModelConfig (weights scaled up, norms
and biases random, so that a missing or misplaced feature shows in the logits), dense fp32 and
int8 / int4 (tinyllm.formats.build.quantize_model). Runs are 40 steps after a 10-token prompt:
past the 8-key sliding windows and across the buckets 16 -> 32 -> 64. Every step is fed the same
tokens on both sides (teacher-forced, tests/tinyllm/forced.py): generate()'s greedy ones, so a
near-tie that one side breaks the other way changes one draw, never the text the rest compares. The exact Hugging Face
configs of tests/tinyllm/test_families.py (opened from folders transformers writes) run too,
where transformers is installed.
"""

import pytest
import torch

from tests.tinyllm.forced import assert_same_draws, eager_logits
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import cpu_step
from tinyllm.decode.generate import generate
from tinyllm.formats.build import quantize_model
from tinyllm.kernels import cpu_qgemv
from tinyllm.model import ModelConfig, Transformer, native_unsupported

pytestmark = pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")

BASE = dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=128)
GEMMA = dict(head_dim=32, act="gelu_tanh", post_norms=True, embed_scale=8.0, attn_scale=24.0, sliding_window=8,
             tie_embeddings=True)
# family -> its features (each widths a multiple of 32, so that every matrix can be int4)
FAMILIES = {
    "llama3": dict(rope_theta=500000.0, rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 32}),
    "qwen2": dict(qkv_bias=True, tie_embeddings=True),
    "qwen3": dict(head_dim=32, qk_norm=True),  # q_dim 128 != dim 64
    "gemma2": dict(GEMMA, n_layers=3, local_layers=(0, 2), attn_softcap=5.0, final_softcap=3.0),
    "gemma3": dict(GEMMA, n_layers=4, n_kv_heads=1, qk_norm=True, local_layers=(0, 1, 2), rope_theta=1e6,
                   rope_local_theta=10000.0, rope_scaling={"type": "linear", "factor": 8.0}),
    "phi3": dict(rotary_dim=12, rope_scaling={"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0],
                                              "long_factor": [2.0, 2.5, 3.0, 4.0, 5.0, 6.0],
                                              "original_max_position_embeddings": 64}),
    "granite": dict(embed_scale=3.0, attn_scale=120.0, residual_scale=0.5, logit_divisor=2.5, tie_embeddings=True),
    # every feature at once: the step must not depend on which ones come together
    "all": dict(GEMMA, n_layers=3, qkv_bias=True, qk_norm=True, local_layers=(1,), rope_local_theta=10000.0,
                attn_softcap=5.0, final_softcap=3.0, rotary_dim=24, residual_scale=0.5, logit_divisor=2.5),
}
PROMPT, STEPS, BUCKETS = 10, 40, (16, 32, 64)


def family_model(name: str, seed: int = 0, **change) -> Transformer:
    """A tiny random model of `name` (its config changed by `change`): matrices std 0.2, norms
    1 +- 0.3, biases +- 0.3; the same weights for the same shapes and seed."""
    model = Transformer(ModelConfig(family=name, **{**BASE, **FAMILIES[name], **change})).init_weights(seed).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise * 0.3 + (0.0 if pname.endswith("bqkv") else 1.0) if p.dim() == 1 else noise * 0.2)
    return model


def prompt_of(model: Transformer, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, model.cfg.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def reference(model: Transformer, prompt: torch.Tensor) -> list[int]:
    """generate()'s STEPS + 1 greedy ids after prompt (1, T): the text every decode here is fed."""
    return [int(t) for t in generate(model, prompt, STEPS + 1)]


@torch.no_grad()
def decode(model: Transformer, native: bool, prompt: torch.Tensor, feed: list[int]) -> tuple[torch.Tensor, list[int]]:
    """Logits (STEPS, V) and the step's own greedy draws (STEPS) of STEPS steps after prefilling
    prompt (1, T), step i fed feed[i] (teacher-forced: feed is reference()'s ids, whose first
    comes from the prefill's logits, as generate() draws it)."""
    dec = GraphDecoder(model, 1, max_len=64, buckets=BUCKETS, use_graph=False)
    if native:
        cpu_step.use_native(dec, torch.float32)  # fp32 K/V: the plain twin's
    dec.prefill(prompt)
    logits, draws = [], []
    for t in feed[:STEPS]:
        dec.tok.fill_(t)
        logits.append(dec.run(1)[0, -1].clone())
        draws.append(int(dec.tok))  # the step's own draw (C++ in the native step)
    assert dec.window == 64  # the buckets were crossed
    return torch.stack(logits), draws


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(1.0, b.abs().max().item()))


def same_draws(model: Transformer, prompt: torch.Tensor, ref: list[int], *sides: tuple[list[int], torch.Tensor],
               tol: float = 1e-4) -> None:
    """generate()'s steps fed ref (their draws are ref's after its first) against the plain step's
    logits at tol; each side's draws are generate()'s wherever no near-tie can flip them."""
    gen = eager_logits(model, prompt, ref[:STEPS])  # (STEPS, V)
    close(gen, sides[-1][1], tol)
    assert_same_draws(gen, ref[1:], *sides)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_native_step_runs_every_family(name):
    model = family_model(name)
    assert native_unsupported(model.cfg) == [] and cpu_step.problem(model, 1) is None


@pytest.mark.parametrize("name", list(FAMILIES))
def test_dense_step_equals_the_plain_step_a_full_forward_and_generate(name):
    model = family_model(name)
    prompt = prompt_of(model)
    ref = reference(model, prompt)
    native, ids = decode(model, True, prompt, ref)
    plain, plain_ids = decode(model, False, prompt, ref)
    close(native, plain)
    with torch.no_grad():
        full = model(torch.cat([prompt, torch.tensor([ref[:STEPS]])], dim=1))[0][0, PROMPT:]  # (STEPS, V)
    close(native, full)
    same_draws(model, prompt, ref, (ids, native), (plain_ids, plain))
    assert native.abs().max() > 1.0  # logits with something in them: the features matter


@pytest.mark.parametrize("name", list(FAMILIES))
def test_int8_step_equals_the_plain_step_at_fp32_tolerance(name):
    """x not rounded to int8 blocks (use_exact_x): the int8 products are the same kernels on
    inputs equal up to fp32 rounding, so the steps meet at fp32 tolerance."""
    model = quantize_model(family_model(name), "int8")
    assert cpu_step.problem(model, 1) is None
    prompt = prompt_of(model)
    before = cpu_qgemv.use_exact_x(True)
    try:
        ref = reference(model, prompt)
        native, ids = decode(model, True, prompt, ref)
        plain, plain_ids = decode(model, False, prompt, ref)
        close(native, plain)
        same_draws(model, prompt, ref, (ids, native), (plain_ids, plain))
    finally:
        cpu_qgemv.use_exact_x(before)


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_quantized_step_with_x_rounded_stays_with_the_plain_step(name, quant):
    """x rounded to int8 blocks (the default; int4 products always round it): an input that sits
    on a rounding boundary may move by a step where the two steps' fp32 rounding differs, and
    that shows in every later step through the cache (seen: 0.054 on logits up to 6, qwen2 and
    gemma3 int4), hence test_cpu_step's looser tolerance for these: 2% of the largest logit. The
    rounding itself (against use_exact_x) moves these logits by up to 5.5% of the largest (llama3
    int8); a few blocks flipped by one step move them far less. Fed one text on both sides: run
    free, the two greedy decodes parted at a near-tie on an AVX-512 VNNI host (llama3 int8) and
    then compared different texts."""
    model = quantize_model(family_model(name), quant)
    assert cpu_step.problem(model, 1) is None
    prompt = prompt_of(model)
    ref = reference(model, prompt)
    native, ids = decode(model, True, prompt, ref)
    plain, plain_ids = decode(model, False, prompt, ref)
    close(native, plain, 2e-2)
    same_draws(model, prompt, ref, (ids, native), (plain_ids, plain), tol=2e-2)


def test_the_window_and_the_caps_change_the_logits():
    """The features are not idle here: the same weights with a window past every position, or
    without the soft-caps, give other logits (and the native step follows the config either way)."""
    prompt = prompt_of(family_model("gemma2"))
    feed = reference(family_model("gemma2"), prompt)  # one text for every model
    base, _ = decode(family_model("gemma2"), True, prompt, feed)
    for change in (dict(sliding_window=64), dict(attn_softcap=0.0), dict(final_softcap=0.0)):
        other = family_model("gemma2", **change)
        native, _ = decode(other, True, prompt, feed)
        close(native, decode(other, False, prompt, feed)[0])
        assert (native - base).abs().max() > 1e-2, change


@torch.no_grad()
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.int8])
def test_a_window_far_into_the_cache(kv_dtype):
    """Positions past 300: a local layer's keys start in the cache's second chunk of 256 (the
    attention then skips the chunks before it, and an int8 cache's scales with them) while the
    global layers read them all."""
    model = family_model("gemma2", max_seq_len=512)
    prompt = torch.randint(0, 256, (1, 300), generator=torch.Generator().manual_seed(3))
    feed = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(4)).tolist()  # both read these
    runs = []
    for native in (True, False):
        dec = GraphDecoder(model, 1, max_len=512, buckets=(256, 512), use_graph=False)
        dec.cache.kv_dtype = kv_dtype  # the plain twin's K/V as the native step's
        if native:
            cpu_step.use_native(dec, kv_dtype)
        dec.prefill(prompt)
        logits = []
        for t in feed:
            dec.tok.fill_(t)
            logits.append(dec.run(1)[0, -1].clone())
        runs.append(torch.stack(logits))
    close(*runs)


def test_what_the_native_step_still_refuses():
    odd = ModelConfig(**{**BASE, "head_dim": 12})  # the decode attention takes multiples of 8
    many = ModelConfig(**{**BASE, "n_heads": 32, "n_kv_heads": 2, "head_dim": 16})  # 16 query heads a key/value head
    assert native_unsupported(odd) == ["a head width of 12 (a multiple of 8 up to 256 runs)"]
    assert native_unsupported(many) == ["16 query heads a key/value head (up to 8 run)"]
    reason = cpu_step.problem(Transformer(odd).init_weights(0), 1)
    assert "native CPU step does not run" in reason and "head width of 12" in reason


@pytest.mark.parametrize("name", ["llama3", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "granite"])
def test_the_hf_configs_of_test_families(name, tmp_path):
    """The exact configs test_families checks against transformers, opened from their folders."""
    from tests.tinyllm.formats_common import need

    need("transformers")
    from tests.tinyllm.test_families import make_family
    from tests.tinyllm.test_hf import save_bpe
    from tinyllm.formats.open_model import open_any

    tok = save_bpe(tmp_path)
    make_family(name, tmp_path, tok.get_vocab_size())
    model = open_any(tmp_path, "cpu", torch.float32).model
    assert cpu_step.problem(model, 1) is None
    prompt = prompt_of(model)
    ref = reference(model, prompt)
    native, ids = decode(model, True, prompt, ref)
    plain, plain_ids = decode(model, False, prompt, ref)
    close(native, plain)
    same_draws(model, prompt, ref, (ids, native), (plain_ids, plain))
