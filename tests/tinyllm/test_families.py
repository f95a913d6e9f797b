"""Every model family against transformers' own implementation, through every path tinyllm has.

A tiny random model of each family (transformers' config and model classes, fp32, weights
scaled up so that a mapping mistake shows in the logits) is saved as a Hugging Face folder with
a byte-level BPE tokenizer, then opened by `open_any`: its logits equal transformers' within fp32
tolerance, greedy tokens are transformers' on the same text (teacher-forced), and the fast paths (the static step's
eager twin, the slot step, the converted checkpoint, int8 weights) agree with the full forward.
Windows are 8 keys and sequences 40, so sliding-window layers really cut keys off. With
`-m cuda`, graph replay equals the same step eagerly, bit for bit, and the compiled step stays
close to the plain one.
"""

import pytest
import torch

from tests.tinyllm.forced import assert_same_draws
from tests.tinyllm.formats_common import need
from tests.tinyllm.test_engine import assert_generates
from tests.tinyllm.test_hf import save_bpe
from tinyllm.cuda_graph import GraphDecoder, SlotGraphDecoder
from tinyllm.decode.generate import generate
from tinyllm.decode.sampling import SamplingParams
from tinyllm.formats.convert import main as convert_main
from tinyllm.formats.open_model import open_any
from tinyllm.kv_cache import SlotKVCache
from tinyllm.model import native_unsupported

transformers = need("transformers")

SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
# family -> (config class, model class, the config's own fields)
FAMILIES = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}, rope_theta=500000.0)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=32, sliding_window=8, query_pre_attn_scalar=24,
                                                          attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=32, num_hidden_layers=6, sliding_window=8, query_pre_attn_scalar=24,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        partial_rotary_factor=0.75, original_max_position_embeddings=64, pad_token_id=0,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0],
                      "long_factor": [2.0, 2.5, 3.0, 4.0, 5.0, 6.0]})),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(
        embedding_multiplier=3.0, attention_multiplier=0.09, residual_multiplier=0.5, logits_scaling=2.5,
        tie_word_embeddings=True)),
}


def make_family(family: str, path, vocab_size: int, seed: int = 0):
    cfg_cls, model_cls, own = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(**{**SMALL, "vocab_size": vocab_size, **own})
    hf = getattr(transformers, model_cls)(cfg).eval()
    hf.config._attn_implementation = "eager"  # soft-caps: eager is transformers' reference
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 1:  # norms (Gemma's scale by 1 + w) and biases
                p.copy_(torch.randn_like(p) * 0.3 + (0.0 if "bias" in name or family.startswith("gemma") else 1.0))
            else:
                p.copy_(torch.randn_like(p) * 0.2)
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("family") / request.param
    tok = save_bpe(path)
    hf = make_family(request.param, path, tok.get_vocab_size())
    model = open_any(path, "cpu", torch.float32).model
    return request.param, path, hf, model


def ids(n: int, vocab: int, seed: int = 1, rows: int = 2) -> torch.Tensor:
    return torch.randint(3, vocab, (rows, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_logits_equal_transformers(family):
    name, path, hf, model = family
    assert model.cfg.family == {"llama3": "llama"}.get(name, name)
    idx = ids(40, model.cfg.vocab_size)
    ours, _ = model(idx)
    ref = hf(idx).logits
    assert (ours - ref).abs().max() < 1e-4, (ours - ref).abs().max()


@torch.no_grad()
def test_greedy_tokens_are_transformers_own_on_the_same_text(family):
    """generate()'s 40 greedy tokens (past every window), and transformers' argmax after each of
    them on that same text: equal wherever no near-tie can flip them (two free-running decodes
    would part at the first one and compare different texts from there)."""
    _, _, hf, model = family
    prompt = ids(12, model.cfg.vocab_size, seed=2, rows=1)
    ours = torch.stack(list(generate(model, prompt, 40)), dim=1)  # (1, 40)
    seq = torch.cat([prompt, ours[:, :-1]], dim=1)  # what each of our draws came after
    theirs = hf(seq).logits[0, prompt.shape[1] - 1:]  # (40, V)
    mine = model(seq)[0][0, prompt.shape[1] - 1:]  # (40, V)
    assert_same_draws(theirs, theirs.argmax(-1).tolist(), (ours[0].tolist(), mine))


def teacher_forced(dec_step, logits, seq, start):
    """Feed seq[:, start:] one token at a time; each step's logits (B, n, V)."""
    out = []
    for i in range(start, seq.shape[1]):
        out.append(dec_step(seq[:, i:i + 1]).clone())
    return torch.cat(out, 1)


@torch.no_grad()
def test_static_step_eager_twin_equals_the_full_forward(family):
    _, _, _, model = family
    seq = ids(48, model.cfg.vocab_size, seed=3)
    full, _ = model(seq)
    dec = GraphDecoder(model, 2, max_len=64, buckets=(16, 32, 64), use_graph=False)
    dec.prefill(seq[:, :10])
    steps = teacher_forced(dec.step, None, seq, 10)  # (2, 38, V): crosses 16 -> 32 -> 64
    torch.testing.assert_close(steps, full[:, 10:], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_slot_step_equals_the_full_forward(family):
    _, _, _, model = family
    prompts = [ids(n, model.cfg.vocab_size, seed=4 + n, rows=1)[0].tolist() for n in (5, 20, 11)]
    slots = SlotKVCache(model.cfg.n_layers, 3, 64, "cpu")
    dec = SlotGraphDecoder(model, slots, (16, 32, 64), use_graph=False)
    for s, p in enumerate(prompts):
        slots.start_prefill([s], [len(p)])
        model(torch.tensor([p]), cache=slots, last_only=True)
        slots.admit([s])
    feed = ids(16, model.cfg.vocab_size, seed=9, rows=3)  # (3, 16) teacher-forced
    steps = teacher_forced(dec.step, None, feed, 0)  # (3, 16, V)
    for s, p in enumerate(prompts):
        full, _ = model(torch.tensor([p + feed[s].tolist()]))
        torch.testing.assert_close(steps[s], full[0, len(p) - 1 + 1:][:16], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_converted_checkpoint_and_int8_keep_the_logits(family, tmp_path):
    _, path, _, model = family
    idx = ids(40, model.cfg.vocab_size, seed=5)
    ref, _ = model(idx)
    assert convert_main([str(path), str(tmp_path / "ckpt")]) == 0
    again = open_any(tmp_path / "ckpt", "cpu", torch.float32).model
    assert again.cfg == model.cfg
    torch.testing.assert_close(again(idx)[0], ref, rtol=1e-5, atol=1e-5)
    q8 = open_any(path, "cpu", torch.float32, quant="int8").model
    err = (q8(idx)[0] - ref).norm() / ref.norm()
    assert err < 0.05, err


def test_the_native_step_runs_every_family(family):
    """Every family's features run in the native CPU step (tests/tinyllm/test_cpu_step_families.py
    checks its logits); nothing falls back to a slower step."""
    from tinyllm.decode import cpu_step

    _, _, _, model = family
    assert native_unsupported(model.cfg) == []
    assert cpu_step.problem(model, 1) is None


# ---- CUDA ------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("compile", [None, "inductor"])
@torch.no_grad()
def test_cuda_graph_replay_equals_its_eager_twin(family, compile):
    _, path, _, _ = family
    model = open_any(path, "cuda").model  # bf16 on CUDA
    seq = ids(48, model.cfg.vocab_size, seed=6).cuda()
    runs = []
    for use_graph in (False, True):
        dec = GraphDecoder(model, 2, max_len=64, buckets=(16, 32, 64), use_graph=use_graph, compile=compile)
        dec.prefill(seq[:, :10])
        runs.append(teacher_forced(dec.step, None, seq, 10).float())
    assert torch.equal(runs[0], runs[1])
    full = model(seq)[0][:, 10:].float()
    err = (runs[0] - full).norm() / full.norm()
    assert err < 3e-2, err


def engine_replies(model, prompts, device="cpu", use_graph=None, compile=None):
    from tinyllm.decode.engine import Engine
    from tinyllm.decode.sampling_params import SamplingParams

    eng = Engine(model, n_slots=2, max_len=64, use_graph=use_graph, buckets=(16, 32, 64), compile=compile)
    greedy = SamplingParams(temperature=0.0, max_tokens=30, repeat_penalty=1.0)
    rids = [eng.add_request(p, greedy) for p in prompts]
    out = eng.run_until_done()
    return [out[r] for r in rids]


@torch.no_grad()
def test_engine_greedy_equals_generate(family):
    """Three requests through two slots (one waits for a slot): each reply is generate()'s, up to a
    near-tie of generate()'s logits where they part (the engine draws in its step: it cannot be fed)."""
    _, _, _, model = family
    prompts = [ids(n, model.cfg.vocab_size, seed=20 + n, rows=1)[0].tolist() for n in (4, 17, 9)]
    replies = engine_replies(model, prompts)
    for p, reply in zip(prompts, replies, strict=True):
        assert_generates(model, p, reply, SamplingParams(max_tokens=30), max_len=64)


@pytest.mark.cuda
@torch.no_grad()
def test_cuda_engine_graphs_equal_the_engine_eager(family):
    _, path, _, _ = family
    model = open_any(path, "cuda").model
    prompts = [ids(n, model.cfg.vocab_size, seed=30 + n, rows=1)[0].tolist() for n in (4, 17, 9)]
    assert engine_replies(model, prompts, use_graph=True) == engine_replies(model, prompts, use_graph=False)


@torch.no_grad()
def test_phi3_long_factors_past_its_original_context(tmp_path):
    """LongRoPE (issue 44): past `original_max_position_embeddings` (64 here) Phi-3 takes its long
    factors, as transformers does for a longer sequence; the model keeps its own context (128), a
    decoder whose context passes 64 runs the long factors from its first position (as llama.cpp
    does by its context), and one within 64 the short ones."""
    tok = save_bpe(tmp_path)
    hf = make_family("phi3", tmp_path, tok.get_vocab_size())
    model = open_any(tmp_path, "cpu", torch.float32).model
    assert model.cfg.max_seq_len == 128  # not capped at the original 64 any more
    seq = ids(100, model.cfg.vocab_size, seed=7)
    full, _ = model(seq)
    torch.testing.assert_close(full, hf(seq).logits, rtol=1e-4, atol=1e-4)  # long factors, as transformers
    short, _ = model(seq[:, :48])
    torch.testing.assert_close(short, hf(seq[:, :48]).logits, rtol=1e-4, atol=1e-4)  # short ones
    assert (short - full[:, :48]).abs().max() > 1e-3  # the two really differ
    dec = GraphDecoder(model, 2, max_len=128, buckets=(32, 64, 128), use_graph=False)
    dec.prefill(seq[:, :10])
    torch.testing.assert_close(teacher_forced(dec.step, None, seq, 10), full[:, 10:], rtol=1e-4, atol=1e-4)
    within = GraphDecoder(model, 2, max_len=64, buckets=(32, 64), use_graph=False)
    within.prefill(seq[:, :10])
    torch.testing.assert_close(teacher_forced(within.step, None, seq[:, :48], 10), short[:, 10:], rtol=1e-4, atol=1e-4)
