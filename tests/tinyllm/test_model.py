"""The model's cached paths against a full forward without a cache (fp32, CPU)."""

import pytest
import torch

from tests.conftest import tiny_model
from tests.tinyllm.forced import assert_same_draws, eager_logits
from tinyllm.core.ops import CpuOps, CudaOps, Ops, ops_for
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode.generate import generate
from tinyllm.kv_cache import KVCache
from tinyllm.model import ModelConfig, Transformer

TOL = 1e-4


def full_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)[0]  # (B, T, V)


def test_cached_decode_equals_full_forward(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 17))
    cache = KVCache(model.cfg.n_layers, 2, 17 + 64, model.device)
    seq = prompt
    with torch.no_grad():
        logits, _ = model(prompt, cache=cache)
        assert (logits - full_logits(model, prompt)).abs().max() < TOL
        for _ in range(64):
            tok = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            seq = torch.cat([seq, tok], dim=1)
            logits, _ = model(tok, cache=cache)
            ref = full_logits(model, seq)[:, -1:]
            assert (logits - ref).abs().max() < TOL
    assert cache.n == 17 + 64


@pytest.mark.parametrize("kind", ["kv", "static"])
def test_offset_prefill_equals_whole_prefill(model, kind):
    turn1 = torch.randint(0, model.cfg.vocab_size, (1, 23))
    turn2 = torch.randint(0, model.cfg.vocab_size, (1, 11))
    whole = torch.cat([turn1, turn2], dim=1)
    with torch.no_grad():
        if kind == "kv":
            cache = KVCache(model.cfg.n_layers, 1, 128, model.device)
            model(turn1, cache=cache)
            appended, _ = model(turn2, cache=cache)
        else:
            dec = GraphDecoder(model, 1, max_len=128, use_graph=False)
            dec.prefill(turn1)
            appended = dec.append(turn2, all_logits=True)
            assert dec.n == 34
    ref = full_logits(model, whole)[:, 23:]
    assert (appended - ref).abs().max() < TOL


def test_tied_embeddings_share_weight():
    m = Transformer(ModelConfig.from_name("tiny", tie_embeddings=True))
    assert m.lm_head.weight is m.tok_emb.weight
    assert m.num_params() < Transformer(ModelConfig.from_name("tiny")).num_params()


def test_loss_ignores_masked_targets(model):
    ids = torch.randint(0, model.cfg.vocab_size, (1, 8))
    targets = ids.clone()
    targets[:, :4] = -100
    _, loss = model(ids, targets=targets)
    logits = full_logits(model, ids)[:, 4:]
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 4:].reshape(-1))
    assert abs(loss.item() - ref.item()) < 1e-5


def test_generate_streams_greedy_tokens_matching_full_forward(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 9))
    toks = [t.item() for t in generate(model, prompt, 20)]
    assert len(toks) == 20
    # Each yielded token is the argmax of a full forward over what came before (fed generate()'s own
    # tokens), wherever that argmax is clear of the cached step's arithmetic (tests/tinyllm/forced).
    full = torch.stack([full_logits(model, torch.cat([prompt, torch.tensor([toks[:i]], dtype=prompt.dtype)], 1))[0, -1]
                        for i in range(len(toks))])  # (20, V)
    assert_same_draws(full, full.argmax(-1).tolist(), (toks, eager_logits(model, prompt, toks[:-1], prefill=True)))


def test_generate_stops_at_stop_id(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 9))
    first = next(iter(generate(model, prompt, 5))).item()
    assert [t.item() for t in generate(model, prompt, 5, stop_ids=[first])] == [first]


def test_config_errors():
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig(dim=64, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="unknown preset"):
        ModelConfig.from_name("nope")
    with pytest.raises(ValueError, match="unknown config keys"):
        ModelConfig.from_dict({"dim": 64, "bogus": 1})
    with pytest.raises(ValueError, match="max_seq_len"):
        tiny_model(max_seq_len=8)(torch.zeros(1, 9, dtype=torch.long))


def test_fused_projections_save_and_load_as_separate_matrices(model):
    """In memory Q/K/V and gate/up are one matrix each; state_dict() and load_state_dict()
    speak the usual separate names, and the rows land where the separate matrices say."""
    state = model.state_dict()
    assert {"blocks.0.attn.wq.weight", "blocks.0.attn.wk.weight", "blocks.0.attn.wv.weight",
            "blocks.0.ffn.w1.weight", "blocks.0.ffn.w3.weight"} <= set(state)
    assert not any("wqkv" in k or "w13" in k for k in state)
    cfg = model.cfg
    assert state["blocks.1.attn.wk.weight"].shape == (cfg.n_kv_heads * cfg.head_dim, cfg.dim)
    x = torch.randn(1, 3, cfg.dim)
    block = model.blocks[1]
    q = x @ state["blocks.1.attn.wq.weight"].T
    gate = x @ state["blocks.1.ffn.w1.weight"].T
    torch.testing.assert_close(block.attn.wqkv(x)[..., :q.shape[-1]], q)
    torch.testing.assert_close(block.ffn.w13(x)[..., :gate.shape[-1]], gate)
    other = Transformer(cfg)
    other.load_state_dict(state)
    ids = torch.randint(0, cfg.vocab_size, (1, 7))
    assert torch.equal(other(ids)[0], model(ids)[0])


def test_the_ops_follow_the_weights_device():
    """The attention's ops are chosen once for the weights' device (tinyllm.core.ops) and again when
    the weights move; a model built on the meta device gets the reference until it is placed."""
    cpu = tiny_model(1)
    assert type(cpu.ops) is CpuOps and ops_for("cpu") is cpu.ops and type(ops_for("cuda")) is CudaOps
    with torch.device("meta"):
        meta = Transformer(ModelConfig.from_name("tiny"))
    assert type(meta.ops) is Ops
    assert type(cpu.to("meta").ops) is Ops
    assert type(ops_for("mps")) is Ops
