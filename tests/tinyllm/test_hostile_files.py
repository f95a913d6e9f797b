"""Hostile model files (issue 12, item 3): malformed GGUF, safetensors and Hugging Face fields
are one-line ValueErrors, never tracebacks; a fuzz over the GGUF and safetensors header
readers; a tokenizer that does not cover the model's vocabulary is refused at load."""

import json
import random
import struct

import numpy as np
import pytest
import torch

from tests.conftest import tiny_model
from tests.tinyllm.formats_common import need
from tinyllm.formats.checkpoint import save_checkpoint
from tinyllm.formats.gguf import gguf_config, read_gguf
from tinyllm.formats.hf import hf_config
from tinyllm.formats.model_files import read_safetensors_header
from tinyllm.tools.testing import make_tiny_tokenizer

U32, F32, STR, ARR, U64 = 4, 6, 8, 9, 10


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(key: str, v: int) -> bytes:
    return _s(key) + struct.pack("<II", U32, v)


def kv_str(key: str, v: str) -> bytes:
    return _s(key) + struct.pack("<I", STR) + _s(v)


def kv_u32_array(key: str, vs: list[int]) -> bytes:
    return _s(key) + struct.pack("<IIQ", ARR, U32, len(vs)) + struct.pack(f"<{len(vs)}I", *vs)


def gguf_bytes(kvs: list[bytes], tensors: list[tuple[str, list[int], int, int]] = ()) -> bytes:
    """A GGUF v3 header by hand (the `gguf` writer refuses the malformed values tested here);
    tensors (name, dims fastest first, ggml type, offset); 64 bytes of tensor data."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    for name, dims, typ, off in tensors:
        out += _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", typ, off)
    return out + b"\0" * (-len(out) % 32) + b"\0" * 64


def one_line_error(fn, match: str):
    with pytest.raises(ValueError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)
    return str(e.value)


LLAMA = [kv_str("general.architecture", "llama"), kv_u32("llama.attention.head_count", 4),
         kv_u32("llama.embedding_length", 64), kv_u32("llama.feed_forward_length", 96)]


# ---- GGUF fields -------------------------------------------------------------------------

def test_gguf_alignment_zero(tmp_path):
    p = tmp_path / "a.gguf"
    p.write_bytes(gguf_bytes([kv_u32("general.alignment", 0)], [("t", [4], 0, 0)]))
    one_line_error(lambda: read_gguf(p), "general.alignment 0 is not a positive power of two")


def test_gguf_arrays_nested_5000_deep(tmp_path):
    depth = 5000
    value = struct.pack("<I", ARR) + struct.pack("<IQ", ARR, 1) * (depth - 1) + struct.pack("<IQ", U32, 0)
    p = tmp_path / "deep.gguf"
    p.write_bytes(gguf_bytes([_s("deep") + value]))
    one_line_error(lambda: read_gguf(p), "nest more than")


@pytest.mark.parametrize("bad", [[kv_u32_array("llama.block_count", [2])],
                                 [kv_u32_array("llama.context_length", [128]), kv_u32("llama.block_count", 2)],
                                 [kv_str("llama.block_count", "two")]],
                         ids=["block_count-array", "context_length-array", "block_count-string"])
def test_gguf_scalar_key_with_the_wrong_type(tmp_path, bad):
    p = tmp_path / "typed.gguf"
    p.write_bytes(gguf_bytes(LLAMA + bad))
    g = read_gguf(p)
    one_line_error(lambda: gguf_config(g), r"GGUF metadata llama\.\w+ should be an integer")
    g.close()


def test_gguf_dimensions_whose_product_overflows(tmp_path):
    assert int(np.prod([2**32, 2**32], dtype=np.int64)) == 0  # what the old check computed
    p = tmp_path / "huge.gguf"
    p.write_bytes(gguf_bytes([], [("t", [2**32, 2**32], 0, 0)]))
    one_line_error(lambda: read_gguf(p), "runs past the end of the file")


# ---- safetensors and Hugging Face fields -------------------------------------------------

def write_safetensors(path, header) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 16)


def test_safetensors_header_that_is_a_list(tmp_path):
    write_safetensors(tmp_path / "m.safetensors", [{"dtype": "F32"}])
    one_line_error(lambda: read_safetensors_header(tmp_path / "m.safetensors"), "not an object")


@pytest.mark.parametrize("offsets", [["0", "16"], [0], [0, 8, 16], [-4, 12], [12, 0], [0, 4096], None])
def test_safetensors_bad_data_offsets(tmp_path, offsets):
    write_safetensors(tmp_path / "m.safetensors", {"w": {"dtype": "F32", "shape": [4], "data_offsets": offsets}})
    one_line_error(lambda: read_safetensors_header(tmp_path / "m.safetensors"), "data_offsets|truncated|needs")


def test_safetensors_offsets_that_disagree_with_the_shape(tmp_path):
    write_safetensors(tmp_path / "m.safetensors", {"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4]}})
    one_line_error(lambda: read_safetensors_header(tmp_path / "m.safetensors"), "needs 4000")


@pytest.mark.parametrize("field", [{"quantization_config": "gptq"}, {"rope_parameters": "yarn"}])
def test_hf_config_fields_of_the_wrong_type(field):
    raw = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "intermediate_size": 96, "vocab_size": 300, **field}
    one_line_error(lambda: hf_config(raw), "gptq|rope_parameters")


# ---- tokenizer against the model's vocabulary --------------------------------------------

def test_embeddings_padded_past_the_tokenizer_load_and_are_never_sampled(tmp_path):
    """A model with 64 more embeddings than its tokenizer has tokens (a padded table) loads;
    with the padded rows of the output made the likeliest, greedy and sampled replies still hold
    only ids the tokenizer decodes (it used to fail mid-stream)."""
    from tinyllm.session.chat import open_session

    tok = make_tiny_tokenizer(tmp_path)
    model = tiny_model(vocab_size=tok.vocab_size + 64)
    with torch.no_grad():
        model.lm_head.weight[tok.vocab_size:] = model.lm_head.weight[:tok.vocab_size].abs().max() * 50
    save_checkpoint(model, tok, tmp_path / "padded")
    s = open_session(tmp_path / "padded", "cpu", compile=None, max_len=256)
    s.set_param("max_tokens", "40")
    s.stop_ids = set()
    for temperature in ("0", "1.0"):
        s.set_param("temperature", temperature)
        *_, fin = s.send("Hello")
        assert fin.stats.tokens == 40 and max(s.messages[-1].ids[:40]) < tok.vocab_size


# ---- fuzz ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> bytes:
    """A small valid llama GGUF written by the `gguf` package: metadata, a vocab, 3 tensors."""
    gguf = need("gguf")
    path = tmp_path_factory.mktemp("fuzz") / "small.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("fuzz")
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(16)])
    w.add_token_scores([float(i) for i in range(16)])
    w.add_token_types([1] * 16)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((16, 64)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    g = read_gguf(path)
    assert gguf_config(g).n_layers == 1 and len(g.tensors) == 3
    g.close()
    return data


INTERESTING = [b"\0" * 8, b"\xff" * 8, struct.pack("<Q", 2**63), struct.pack("<Q", 2**32), struct.pack("<I", 9),
               struct.pack("<I", 8), struct.pack("<Q", 5000)]


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    head = min(len(b), 1200)  # most mutations land in the header, where the reader looks
    kind = rng.randrange(4)
    if kind == 0:
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(head)
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del b[rng.randrange(len(b)):]
    elif kind == 2:
        i = rng.randrange(head)
        b[i:i + 8] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    else:
        i = rng.randrange(head)
        v = rng.choice(INTERESTING)
        b[i:i + len(v)] = v
    return bytes(b)


def test_fuzz_gguf_header_reader(tmp_path, small_gguf):
    """Random mutations of a valid file: each loads or is a one-line ValueError (never another
    exception, a hang or a huge allocation: the whole run stays small and fast)."""
    rng = random.Random(12)
    p = tmp_path / "m.gguf"
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(400):
        data = mutate(small_gguf, rng)
        p.write_bytes(data)
        try:
            g = read_gguf(p)
            try:
                gguf_config(g)
            finally:
                g.close()
            outcomes["loaded"] += 1
        except (ValueError, FileNotFoundError) as e:
            assert str(e) and "\n" not in str(e), (case, str(e))
            outcomes["refused"] += 1
    assert outcomes["loaded"] and outcomes["refused"] > 100, outcomes


def test_fuzz_safetensors_header_reader(tmp_path):
    rng = random.Random(7)
    header = {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
              "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}}
    h = json.dumps(header).encode()
    good = struct.pack("<Q", len(h)) + h + b"\0" * 24
    p = tmp_path / "m.safetensors"
    refused = 0
    for case in range(400):
        b = bytearray(good)
        i = rng.randrange(len(b))
        if rng.random() < 0.5:
            b[i] = rng.choice(b'0123456789-"[]{},:.e ' + bytes([rng.randrange(256)]))
        else:
            del b[i:i + rng.randint(1, 6)]
        p.write_bytes(bytes(b))
        try:
            read_safetensors_header(p)
        except (ValueError, FileNotFoundError) as e:
            assert str(e) and "\n" not in str(e), (case, str(e))
            refused += 1
    assert refused > 100


# ---- the command line ------------------------------------------------------------------------

def test_cli_malformed_gguf_is_one_line_and_exit_2(tmp_path, capsys):
    import chat_app.__main__ as cli

    p = tmp_path / "bad.gguf"
    p.write_bytes(gguf_bytes([kv_u32("general.alignment", 0)], [("t", [4], 0, 0)]))
    with pytest.raises(SystemExit) as exc:
        cli.main(["--model", str(p)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tinyllm-chat: error: ") and "Traceback" not in err, err
    assert "GGUF architecture None is not supported" in err  # what is checked first, before the TUI


# ---- weights that are not finite (issue 31, section 5) ----------------------------------------

@pytest.mark.parametrize("form, name, value", [
    ("dense", "blocks.1.ffn.w2.weight", float("nan")),
    ("int8", "blocks.0.attn.wq.scales", float("inf")),  # a quantized matrix: its scales
    ("int4", "blocks.1.ffn.w1.zeros", float("-inf")),  # ... and offsets
])
def test_weights_that_are_not_finite_are_refused_naming_the_tensor(tmp_path, form, name, value):
    """Loaded silently before: tinychat then printed "⁇ ⁇ ⁇" until the context was full."""
    from safetensors.torch import load_file, save_file

    from tinyllm.formats.build import quantize_model
    from tinyllm.formats.checkpoint import load_checkpoint
    from tinyllm.formats.open_model import open_any
    from tinyllm.tools.testing import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path / "dense", ffn_dim=192)
    if form != "dense":
        ckpt = load_checkpoint(path)
        path = save_checkpoint(quantize_model(ckpt.model, form), ckpt.tokenizer, tmp_path / form)
    files = sorted(path.glob("*.safetensors"))
    for f in files:
        state = load_file(f)
        if name in state:
            state[name].view(-1)[7] = value
            save_file(state, f)
            break
    else:
        raise AssertionError(f"{name} not in {files}")
    one_line_error(lambda: open_any(path, "cpu", quant="keep"), f"{name.replace('.', '[.]')} holds NaN or infinite")
