"""The seed's API, called the way the seed (../shared/seed/) calls it.

The seed is `tinyllm/cuda_graph.py`: it imports `causal_kwargs` and `padded_causal_mask` from
`tinyllm.kv_cache` and `Transformer` from `tinyllm.model`, and defines `default_buckets`,
`StaticKVCache`, `StaticLayerKV`, `GraphDecoder` and `SlotGraphDecoder`. Every one of those names
is imported from the seed's own paths and called with the seed's arguments. On a CPU the decoders
run their eager twin (use_graph=False), checked against a full forward; with `-m cuda` graph
replay must equal the same step run eagerly, bit for bit, for both decoders.
"""

import pytest
import torch

from tinyllm.cuda_graph import GraphDecoder, SlotGraphDecoder, StaticKVCache, StaticLayerKV, default_buckets
from tinyllm.kv_cache import SlotKVCache, causal_kwargs, padded_causal_mask
from tinyllm.model import ModelConfig, Transformer


def seed_model(device: str = "cpu", dtype=torch.float32) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.from_name("tiny", vocab_size=256, max_seq_len=512)
    return Transformer(cfg).init_weights(0).to(device, dtype).eval()


def test_default_buckets_as_the_seed_states_them():
    assert default_buckets(1024) == (128, 256, 512, 1024)
    assert default_buckets(300) == (128, 256, 300)
    assert default_buckets(128) == (128,)
    assert default_buckets(100, first=32) == (32, 64, 100)


def test_causal_kwargs_and_padded_causal_mask():
    assert causal_kwargs(0, 1, "cpu") == {}
    assert causal_kwargs(0, 4, "cpu") == {"is_causal": True}
    mask = causal_kwargs(2, 3, "cpu")["attn_mask"]  # 3 queries at 2..4 over keys 0..4
    assert mask.tolist() == [[True, True, True, False, False], [True] * 4 + [False], [True] * 5]
    first_valid = torch.tensor([0, 2])
    m = padded_causal_mask(0, 3, first_valid)  # (B, 1, T, S)
    assert m.shape == (2, 1, 3, 3)
    assert m[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # row 1's two pads are never a key for a real query; a pad query still sees itself
    assert m[1, 0].tolist() == [[True, False, False], [False, True, False], [False, False, True]]


def test_model_protocol_the_seed_relies_on():
    model = seed_model()
    assert model.cfg.n_layers == 2 and model.cfg.max_seq_len == 512
    cos, sin = model.rope(4, 3)
    assert torch.equal(cos, model.rope.cos[3:7]) and torch.equal(sin, model.rope.sin[3:7])
    logits, loss = model(torch.tensor([[1, 2, 3]]))
    assert logits.shape == (1, 3, 256) and loss is None


@torch.no_grad()
def test_static_kv_cache_through_the_seed_protocol():
    """reset, begin_step, layer(i) -> StaticLayerKV (attn_kwargs, update), end_step, nbytes; as the
    model's cache, a prefill through it gives the full forward's logits."""
    model = seed_model()
    cfg = model.cfg
    cache = StaticKVCache(cfg.n_layers, 2, 64, "cpu")
    cache.reset(None)
    assert cache.nbytes() == 0
    idx = torch.randint(0, 256, (2, 7))
    logits, _ = model(idx, cache=cache)
    full, _ = model(idx)
    torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)
    H, D = cfg.n_kv_heads, cfg.head_dim
    assert cache.nbytes() == cfg.n_layers * 2 * (2 * H * (64 + 1) * D) * 4  # one spare position per layer

    # The protocol by hand: one more token, at position 7.
    cos, sin = cache.begin_step(1, model.rope)
    torch.testing.assert_close(cos, model.rope.cos[7:8])
    layer = cache.layer(1)
    assert isinstance(layer, StaticLayerKV)
    assert layer.attn_kwargs == {}  # one query sees every key
    k = torch.randn(2, H, 1, D)
    ks, vs = layer.update(k, k + 1)
    assert ks.shape == (2, H, 8, D) and torch.equal(ks[:, :, 7:], k) and torch.equal(vs[:, :, 7:], k + 1)
    cache.end_step(1)
    assert cache.n == 8

    cache.reset(torch.tensor([0, 3]))  # left pads: the mask comes from padded_causal_mask
    cache.begin_step(5, model.rope)
    assert torch.equal(cache.layer(0).attn_kwargs["attn_mask"], padded_causal_mask(0, 5, torch.tensor([0, 3])))


def greedy_steps(dec, logits, n):
    """The seed's loop: argmax of the last logits, then dec.step(tok); every step's logits."""
    out = []
    for _ in range(n):
        tok = logits[:, -1].float().argmax(-1, keepdim=True)  # (B, 1)
        logits = dec.step(tok).clone()
        out.append(logits)
    return torch.cat(out, 1)  # (B, n, V)


@torch.no_grad()
def test_graph_decoder_eager_twin_equals_a_full_forward():
    model = seed_model()
    dec = GraphDecoder(model, 2, 256, (32, 64, 256), False)
    assert dec.bucket(1) == 32 and dec.bucket(33) == 64 and dec.bucket(65) == 256
    idx = torch.randint(0, 256, (2, 20))
    logits = dec.prefill(idx, None)
    steps = greedy_steps(dec, logits, 30)  # crosses the 32 -> 64 bucket
    # the same tokens through a full forward: each step's logits are those of its position
    toks = [logits[:, -1].argmax(-1)]
    for i in range(29):
        toks.append(steps[:, i].argmax(-1))
    seq = torch.cat([idx, torch.stack(toks, 1)], 1)  # (2, 50)
    full, _ = model(seq)
    torch.testing.assert_close(steps, full[:, 20:], rtol=1e-4, atol=1e-4)


def slot_decoder_run(model, use_graph, device, prompts, n_steps):
    """SlotGraphDecoder(model, slots, buckets, use_graph) over slots the engine would fill: each
    prompt prefilled into its slot and admitted, then dec.step(tok) n_steps times."""
    slots = SlotKVCache(model.cfg.n_layers, len(prompts), 256, device)
    dec = SlotGraphDecoder(model, slots, (32, 64, 256), use_graph)
    last = []
    for s, ids in enumerate(prompts):
        slots.start_prefill([s], [len(ids)])
        logits, _ = model(torch.tensor([ids], device=device), cache=slots, last_only=True)  # (1, 1, V)
        slots.admit([s])
        last.append(logits[:, -1])
    if use_graph:
        assert dec.capture((64,)) >= 0 and dec.captured_windows == [64]
    logits = torch.cat(last)[:, None]  # (S, 1, V)
    return greedy_steps(dec, logits, n_steps)


@torch.no_grad()
def test_slot_graph_decoder_eager_twin_equals_a_full_forward():
    model = seed_model()
    prompts = [[5, 6, 7], list(range(10, 40)), [9] * 12]
    steps = slot_decoder_run(model, False, "cpu", prompts, 8)  # (3, 8, V); slot 1 crosses 32 -> 64
    for s, ids in enumerate(prompts):
        drawn = steps[s, :-1].argmax(-1).tolist()
        first = model(torch.tensor([ids]))[0][0, -1].argmax().item()
        full, _ = model(torch.tensor([ids + [first] + drawn]))
        torch.testing.assert_close(steps[s], full[0, len(ids):], rtol=1e-4, atol=1e-4)
    dec = SlotGraphDecoder(model, SlotKVCache(2, 3, 256, "cpu"), None, False)
    assert dec.bucket(200) == 256 and dec.buckets == default_buckets(256)


@pytest.mark.cuda
@torch.no_grad()
def test_graph_decoder_replay_equals_its_eager_twin_bit_for_bit():
    model = seed_model("cuda", torch.bfloat16)
    idx = torch.randint(0, 256, (2, 20), device="cuda")
    runs = []
    for use_graph in (False, True):
        dec = GraphDecoder(model, 2, 256, (32, 64, 256), use_graph)
        logits = dec.prefill(idx, None)
        if use_graph:
            assert dec.capture() >= 0 and dec.captured_windows == [32, 64, 256]  # every bucket, ahead
        runs.append(greedy_steps(dec, logits, 60))
    assert torch.equal(runs[0], runs[1])


@pytest.mark.cuda
@torch.no_grad()
def test_slot_graph_decoder_replay_equals_its_eager_twin_bit_for_bit():
    model = seed_model("cuda", torch.bfloat16)
    prompts = [[5, 6, 7], list(range(10, 40)), [9] * 12]
    eager = slot_decoder_run(model, False, "cuda", prompts, 40)
    graph = slot_decoder_run(model, True, "cuda", prompts, 40)
    assert torch.equal(eager, graph)
