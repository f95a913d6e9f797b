"""Checkpoint folders: round trips (single file and shards) and one clear error per fault."""

import json

import pytest
import torch

from tests.conftest import tiny_model
from tests.tinyllm.forced import assert_same_draws
from tinyllm.formats.checkpoint import inspect_checkpoint, load_checkpoint, save_checkpoint
from tinyllm.tools.testing import make_tiny_checkpoint, make_tiny_tokenizer


@pytest.fixture
def ckpt(tmp_path):
    return make_tiny_checkpoint(tmp_path / "tiny")


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_round_trip_single_file(ckpt):
    c = load_checkpoint(ckpt)
    assert (ckpt / "model.safetensors").exists()
    assert c.info.name == "tiny-test" and c.info.chat == {"template": "chatml"}
    again = save_checkpoint(c.model, c.tokenizer, ckpt.parent / "copy", name="tiny-test")
    d = load_checkpoint(again)
    assert same_weights(c.model, d.model)
    ids = torch.randint(0, c.info.config.vocab_size, (1, 12))
    assert torch.equal(c.model(ids)[0], d.model(ids)[0])
    assert d.tokenizer.encode("Hello!") == c.tokenizer.encode("Hello!")


def test_round_trip_shards_and_tied_embeddings(tmp_path):
    tok = make_tiny_tokenizer(tmp_path)
    model = tiny_model(vocab_size=tok.vocab_size, tie_embeddings=True)
    path = save_checkpoint(model, tok, tmp_path / "sharded", shard_mb=0.15)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and "lm_head.weight" not in index["weight_map"]
    assert all((path / s).stat().st_size <= 0.15 * 2**20 + 4096 for s in shards)
    c = load_checkpoint(path)
    assert c.model.lm_head.weight is c.model.tok_emb.weight
    assert same_weights(model, c.model)


def test_load_reports_each_tensor_read(tmp_path):
    """progress(done, total) over every tensor of every shard: (0, N) first, then one call per
    tensor, ending at (N, N); the weights are the same as without it."""
    tok = make_tiny_tokenizer(tmp_path)
    model = tiny_model(vocab_size=tok.vocab_size)
    path = save_checkpoint(model, tok, tmp_path / "sharded", shard_mb=0.15)
    n = len(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"])
    calls: list[tuple[int, int]] = []
    c = load_checkpoint(path, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(i, n) for i in range(n + 1)] and n > 10
    assert same_weights(model, c.model)


def test_load_to_bf16(ckpt):
    c = load_checkpoint(ckpt, dtype=torch.bfloat16)
    assert c.model.dtype == torch.bfloat16 and c.model.rope.cos.dtype == torch.float32


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        inspect_checkpoint(tmp_path / "nope")


def test_not_a_folder(tmp_path):
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a checkpoint folder"):
        inspect_checkpoint(tmp_path / "file.bin")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.model"])
def test_missing_file(ckpt, name):
    (ckpt / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"has no {name}"):
        inspect_checkpoint(ckpt)


def test_missing_shard(tmp_path):
    tok = make_tiny_tokenizer(tmp_path)
    path = save_checkpoint(tiny_model(vocab_size=tok.vocab_size), tok, tmp_path / "s", shard_mb=0.1)
    next(path.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(FileNotFoundError, match="missing weight shards"):
        inspect_checkpoint(path)


def test_config_weights_shape_mismatch(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model"]["ffn_dim"] = 200
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not match the weights: shape mismatch .*w1.weight"):
        inspect_checkpoint(ckpt)


def test_config_layers_mismatch(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model"]["n_layers"] = 3
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing tensors blocks.2"):
        inspect_checkpoint(ckpt)


def test_truncated_safetensors(ckpt):
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="is truncated"):
        inspect_checkpoint(ckpt)


def test_garbage_safetensors(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 3)
    with pytest.raises(ValueError, match="not a safetensors file"):
        inspect_checkpoint(ckpt)


def test_bad_config_json(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        inspect_checkpoint(ckpt)


def test_tokenizer_larger_than_vocab(ckpt, tmp_path):
    cfg = json.loads((ckpt / "config.json").read_text())
    tok = make_tiny_tokenizer(tmp_path)
    model = tiny_model(vocab_size=tok.vocab_size - 100)
    save_checkpoint(model, tok, tmp_path / "small")
    with pytest.raises(ValueError, match="tokenizer has 512 tokens but the model only 412"):
        load_checkpoint(tmp_path / "small")
    assert cfg["format"] == "tinyllm"


@torch.no_grad()
def test_a_bf16_checkpoint_on_the_cpu_keeps_bf16_matrices_and_computes_as_fp32(tmp_path, monkeypatch):
    """quant "auto" holds a file's bf16 matrices as they are (half the bytes a decode step reads)
    and widens them where they are read: eager logits equal the fp32 model's ("none") bit for
    bit, the compiled step matches them, and norms and activations stay fp32. The compiled step
    here is the one without the AVX2 kernel (Inductor's loop with the widening fused into its
    loads); test_quant_cpu_kernel.py runs it with the kernel's op."""
    from tinyllm.cuda_graph import GraphDecoder
    from tinyllm.kernels import cpu_qgemv

    monkeypatch.setattr(cpu_qgemv, "loaded", lambda: False)

    tok = make_tiny_tokenizer(tmp_path / "tok")
    save_checkpoint(tiny_model(), tok, tmp_path / "ck", dtype=torch.bfloat16)
    held = load_checkpoint(tmp_path / "ck", "cpu", quant="auto").model
    wide = load_checkpoint(tmp_path / "ck", "cpu", quant="none").model
    dtypes = {n: p.dtype for n, p in held.named_parameters()}
    assert held.dtype == torch.float32 and all(
        dt == (torch.float32 if n.endswith("norm.weight") else torch.bfloat16) for n, dt in dtypes.items()), dtypes
    assert all(p.dtype == torch.float32 for p in wide.parameters())
    size = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
    assert size(held) < 0.55 * size(wide)
    ids = torch.randint(0, tok.vocab_size, (1, 24))
    assert torch.equal(held(ids)[0], wide(ids)[0])
    fast = GraphDecoder(held, 1, max_len=64, use_graph=False, compile="inductor")
    ref = GraphDecoder(wide, 1, max_len=64, use_graph=False)
    a, b = fast.prefill(ids), ref.prefill(ids)
    seen = ([], [])  # each step's last logits, the compiled step's and the fp32 one's
    for _ in range(16):
        seen[0].append(a[0, -1].clone())
        seen[1].append(b[0, -1].clone())
        tok_id = b[:, -1].argmax(-1, keepdim=True)  # (1, 1): both fed the fp32 step's greedy token
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            a, b = fast.step(tok_id), ref.step(tok_id)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    got, want = torch.stack(seen[0]), torch.stack(seen[1])  # (16, V)
    assert_same_draws(want, want.argmax(-1).tolist(), (got.argmax(-1).tolist(), got))  # up to a near-tie
    assert not [e for e in prof.events() if e.name.startswith("tinyllm_cpu::")]  # Inductor's own loop
