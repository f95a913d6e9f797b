"""Checkpoint folders: round trips (single file and shards) and one clear error per fault."""

import json

import pytest
import torch

from tests.conftest import tiny_model
from tinyllm.checkpoint import inspect_checkpoint, load_checkpoint, save_checkpoint
from tinyllm.testing import make_tiny_checkpoint, make_tiny_tokenizer


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
