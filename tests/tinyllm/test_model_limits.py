"""Config sizes are checked before anything is allocated; RoPE tables follow the length used."""

import time

import pytest
import torch

from tinyllm.model import ModelConfig, Rope, Transformer


@pytest.mark.parametrize("field,value", [("n_layers", 1_000_000), ("dim", 10**9), ("max_seq_len", 2 * 10**7),
                                         ("max_seq_len", 4 * 10**9), ("n_heads", 0), ("n_kv_heads", 0),
                                         ("vocab_size", -5), ("ffn_dim", 0), ("dim", 64.5), ("n_layers", True),
                                         ("rope_theta", float("nan")), ("norm_eps", 0.0)])
def test_bad_sizes_are_one_line_value_errors(field, value):
    with pytest.raises(ValueError, match=field) as e:
        ModelConfig.from_name("tiny", **{field: value})
    assert "\n" not in str(e.value)


def test_too_many_parameters_in_total():
    with pytest.raises(ValueError, match="parameters"):
        ModelConfig(vocab_size=1 << 22, dim=1 << 16, n_layers=1024, n_heads=512, n_kv_heads=512, ffn_dim=1 << 18)


def test_rope_is_built_at_the_length_used():
    t0 = time.monotonic()
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_name("tiny", max_seq_len=1 << 21))
    assert model.rope.built == 0 and time.monotonic() - t0 < 10  # nothing built on a meta-device model
    rope = Rope(64, 1 << 21, 10000.0)
    cos, sin = rope(5, 10)
    assert cos.shape == (5, 32) and rope.built < 1024 and cos.device.type == "cpu"
    full = Rope(64, 4096, 10000.0)
    assert torch.equal(full.cos[10:15], cos) and torch.equal(full.sin[10:15], sin)  # growing changes no value
    rope.ensure(3000)
    assert torch.equal(rope(5, 10)[0], cos) and rope.built >= 3000
    with pytest.raises(ValueError, match="exceed max_seq_len"):
        Rope(64, 128, 10000.0)(10, 120)
