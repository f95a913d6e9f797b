"""GGUF: our reader and dequantizers against the `gguf` package (the writer and the reference
dequantizer), llama.cpp's Q/K permutation undone, tokenizers from metadata, one-line errors."""

import json

import numpy as np
import pytest
import torch

from tests.tinyllm.formats_common import SMOL_TEMPLATE, TEXTS, need, train_bpe
from tinyllm.formats.convert import main as convert_main
from tinyllm.formats.gguf import dequantize, read_gguf, unpermute_qk
from tinyllm.formats.open_model import inspect_any, open_any
from tinyllm.model import ModelConfig, Transformer
from tinyllm.text.tokenizer import StreamDecoder, Tokenizer
from tinyllm.tools.testing import make_tiny_tokenizer

gguf = need("gguf")
Q = gguf.GGMLQuantizationType
# rms error / rms value a type may add (fp16 and bf16 round; the rest quantize)
TOLERANCE = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 5e-3, Q.Q8_0: 0.01, Q.Q6_K: 0.03, Q.Q5_0: 0.05, Q.Q5_1: 0.05,
             Q.Q4_0: 0.12, Q.Q4_1: 0.12, Q.Q4_K: 0.12}


# ---- K-quant writers (gguf.quants only dequantizes K types; these are simple, not optimal) --

def _safe_div(a, b):
    return np.where(b > 0, a / np.where(b > 0, b, 1), 0)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    lo, hi = np.minimum(sub.min(-1), 0), np.maximum(sub.max(-1), 0)
    scale, mins = (hi - lo) / 15, -lo  # (n, 8)
    d, dmin = (scale.max(-1) / 63).astype(np.float16), (mins.max(-1) / 63).astype(np.float16)
    df, dmf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.round(_safe_div(scale, df)).clip(0, 63).astype(np.uint8)
    mn = np.round(_safe_div(mins, dmf)).clip(0, 63).astype(np.uint8)
    q = np.round(_safe_div(sub + (dmf * mn)[..., None], (df * sc)[..., None])).clip(0, 15).astype(np.uint8)
    s = np.concatenate([(sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),  # the inverse of get_scale_min_k4
                        (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6),
                        (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)], axis=1)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, 128)  # chunk c: sub-block 2c low, 2c+1 high
    return np.concatenate([d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2), s, qs], axis=1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = np.abs(sub).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16)
    df = d.astype(np.float32)[:, None]
    sc = np.round(_safe_div(scale, df)).clip(-128, 127).astype(np.int8)
    q = np.round(_safe_div(sub, (df * sc)[..., None])).clip(-32, 31).astype(np.int16) + 32
    q4 = q.astype(np.uint8).reshape(n, 2, 4, 32)  # (n, half, group, l)
    ql = (q4[:, :, 0:2] & 0xF) | ((q4[:, :, 2:4] & 0xF) << 4)
    qh = sum((q4[:, :, g] >> 4) << (2 * g) for g in range(4)).astype(np.uint8)
    parts = [ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d.view(np.uint8).reshape(n, 2)]
    return np.concatenate(parts, axis=1)


def quantize(w: np.ndarray, qtype) -> np.ndarray:
    """Bytes GGUFWriter.add_tensor takes for `w` (rows, cols) in `qtype`."""
    if qtype == Q.F32:
        return w.astype(np.float32)
    if qtype == Q.F16:
        return w.astype(np.float16)
    if qtype in (Q.Q4_K, Q.Q6_K):
        f = quantize_q4_k if qtype == Q.Q4_K else quantize_q6_k
        return f(w.reshape(-1, 256)).reshape(w.shape[0], -1)
    return gguf.quants.quantize(w, qtype)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: rotate-half -> interleaved rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---- writing a GGUF file of a tinyllm model ----------------------------------------------

GGUF_NAMES = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "attn.wq": "attn_q", "attn.wk": "attn_k",
              "attn.wv": "attn_v", "attn.wo": "attn_output", "ffn.w1": "ffn_gate", "ffn.w3": "ffn_up",
              "ffn.w2": "ffn_down"}


def gguf_name(name: str) -> str:
    fixed = {"tok_emb.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if name in fixed:
        return fixed[name]
    _, i, rest = name.split(".", 2)
    return f"blk.{i}.{GGUF_NAMES[rest.rsplit('.', 1)[0]]}.weight"


def write_gguf(path, model: Transformer, types: dict, tokenizer_kv, arch="llama", extra=None) -> dict:
    """Write `model` as llama.cpp would; returns {tinyllm name: what a reader must load}
    (the reference dequantization of what was written, permutation undone)."""
    cfg = model.cfg
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-gguf")
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.dim)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    tokenizer_kv(w)
    if extra:
        extra(w)
    expected = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_embeddings:
            continue
        arr = t.detach().numpy().astype(np.float32)
        heads = {"wq": cfg.n_heads, "wk": cfg.n_kv_heads}.get(name.split(".")[-2], 0)
        if heads:
            arr = permute(arr, heads)
        qtype = types.get(name, Q.F32) if arr.ndim == 2 else Q.F32
        if qtype == Q.IQ4_NL:  # a type tinyllm cannot read: the bytes do not matter
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            w.add_tensor(gguf_name(name), np.zeros((arr.shape[0], arr.shape[1] // block * size), np.uint8),
                         raw_dtype=qtype)
            continue
        data = quantize(arr, qtype)
        w.add_tensor(gguf_name(name), data, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)
        ref = torch.from_numpy(gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(arr.shape))
        expected[name] = (unpermute_qk(ref, heads) if heads else ref, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def sp_kv(tok: Tokenizer, chat_template=None, unk_kind=2):
    """`unk_kind` 3: "<unk>" typed as a control piece, as Gemma's GGUF files type it."""
    sp = tok._sp

    def kind(i):
        if sp.is_unknown(i):
            return unk_kind
        if sp.is_control(i):
            return 3
        if sp.is_byte(i):
            return 6
        return 4 if sp.id_to_piece(i) in ("<|im_start|>", "<|im_end|>") else 1

    def add(w):
        w.add_tokenizer_model("llama")
        w.add_token_list([sp.id_to_piece(i) for i in range(tok.vocab_size)])
        w.add_token_scores([sp.get_score(i) for i in range(tok.vocab_size)])
        w.add_token_types([kind(i) for i in range(tok.vocab_size)])
        w.add_bos_token_id(tok.bos_id)
        w.add_eos_token_id(tok.eos_id)
        w.add_unk_token_id(0)
        w.add_pad_token_id(tok.pad_id)
        w.add_add_space_prefix(False)
        w.add_add_bos_token(True)
        if chat_template:
            w.add_chat_template(chat_template)
    return add


def bpe_kv(tok, chat_template=SMOL_TEMPLATE):
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}

    def add(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list([tok.id_to_token(i) for i in range(tok.get_vocab_size())])
        w.add_token_types([3 if i in special else 1 for i in range(tok.get_vocab_size())])
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)
        w.add_chat_template(chat_template)
    return add


def tiny(vocab, tie, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=512,
                      max_seq_len=128, rope_theta=50000.0, norm_eps=1e-5, tie_embeddings=tie)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.1) + (1.0 if p.dim() == 1 else 0.0))
    return model


LINEARS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.w1", "ffn.w3", "ffn.w2")
MIXED = {"tok_emb.weight": Q.Q8_0, "lm_head.weight": Q.Q6_K, **{
    f"blocks.{i}.{k}.weight": t for i, types in enumerate([
        (Q.Q4_K, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1),
        (Q.Q6_K, Q.Q4_K, Q.Q8_0, Q.Q6_K, Q.Q4_K, Q.Q6_K, Q.Q4_K)])
    for k, t in zip(LINEARS, types, strict=True)}}


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
    return make_tiny_tokenizer(tmp_path_factory.mktemp("sp"))


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory, sp_tok):
    """Untied, every weight in another type, sentencepiece vocab."""
    model = tiny(sp_tok.vocab_size, tie=False)
    path = tmp_path_factory.mktemp("gguf") / "mixed.gguf"
    expected = write_gguf(path, model, MIXED, sp_kv(sp_tok))
    return path, model, expected


def test_dequantizers_match_the_reference_bit_for_bit():
    rng = np.random.default_rng(0)
    f16_at = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0], Q.Q2_K: [80, 82],
              Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
    for qtype, offsets in f16_at.items():
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (6, 2 * size), dtype=np.uint8)  # 6 rows of 2 blocks
        for off in offsets:  # sane scales (random bytes may be NaN/inf as fp16)
            for b in range(2):
                raw[:, b * size + off:b * size + off + 2] = (
                    rng.uniform(-1, 1, 6).astype(np.float16).view(np.uint8).reshape(6, 2))
        ref = gguf.quants.dequantize(raw, qtype)
        ours = dequantize(torch.from_numpy(raw.copy()), int(qtype), (6, 2 * block))
        assert torch.equal(ours, torch.from_numpy(ref.astype(np.float32))), qtype.name
    x = rng.standard_normal((3, 64)).astype(np.float32)
    for qtype, dt in ((Q.F16, np.float16), (Q.BF16, None)):
        data = x.astype(dt) if dt else gguf.quants.quantize(x, Q.BF16)
        ref = gguf.quants.dequantize(data.view(np.uint8), qtype) if dt is None else data.astype(np.float32)
        assert torch.equal(dequantize(torch.from_numpy(data.view(np.uint8).copy()), int(qtype), (3, 64)),
                           torch.from_numpy(np.asarray(ref, np.float32)))


def test_weights_round_trip_within_quantization_error(llama_file):
    path, model, expected = llama_file
    loaded, tok, tmpl, name = open_any(path, "cpu", torch.float32, quant="none")
    assert name == path.stem and not loaded.cfg.tie_embeddings and loaded.cfg.rope_theta == 50000.0
    state, orig = loaded.state_dict(), model.state_dict()
    for k, (ref, qtype) in expected.items():
        assert torch.equal(state[k], ref), k  # exactly the reference dequantization, un-permuted
        err = (state[k] - orig[k]).pow(2).mean().sqrt() / orig[k].pow(2).mean().sqrt()
        assert err <= TOLERANCE[qtype] + 1e-7, (k, qtype.name, float(err))
    # the model computes with exactly those weights
    ref_model = tiny(model.cfg.vocab_size, tie=False)
    ref_model.load_state_dict({**orig, **{k: v for k, (v, _) in expected.items()}})
    idx = torch.randint(0, model.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (loaded(idx)[0] - ref_model(idx)[0]).abs().max() < 1e-4


def test_load_reports_each_tensor_read(llama_file):
    path, _, _ = llama_file
    calls: list[tuple[int, int]] = []
    open_any(path, "cpu", torch.float32, progress=lambda done, total: calls.append((done, total)))
    g = read_gguf(path)
    n = len(g.tensors)
    g.close()
    assert calls == [(i, n) for i in range(n + 1)] and n > 10


def test_qk_permutation_is_undone_exactly(tmp_path, sp_tok):
    model = tiny(sp_tok.vocab_size, tie=True, seed=1)
    write_gguf(tmp_path / "f32.gguf", model, {}, sp_kv(sp_tok))
    loaded, *_ = open_any(tmp_path / "f32.gguf")
    idx = torch.randint(0, model.cfg.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (loaded(idx)[0] - model(idx)[0]).abs().max() < 1e-5
    assert loaded.cfg.tie_embeddings and loaded.lm_head.weight is loaded.tok_emb.weight


def test_sentencepiece_vocab_from_metadata(llama_file, sp_tok):
    path, _, _ = llama_file
    _, tok, tmpl, _ = open_any(path)
    assert isinstance(tok, Tokenizer) and tok.vocab_size == sp_tok.vocab_size
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (sp_tok.bos_id, sp_tok.eos_id, sp_tok.pad_id)
    for text in TEXTS:
        assert tok.encode(text) == sp_tok.encode(text), text
        assert tok.decode(sp_tok.encode(text)) == text
    assert tmpl.name == "chatml"  # no template in the file: the built-in guess


def test_gpt2_vocab_tokenizer_and_template_from_metadata(tmp_path):
    need("tokenizers")
    ref = train_bpe()
    model = tiny(ref.get_vocab_size(), tie=True, seed=2)
    write_gguf(tmp_path / "bpe.gguf", model, {"tok_emb.weight": Q.Q8_0}, bpe_kv(ref))
    _, tok, tmpl, _ = open_any(tmp_path / "bpe.gguf")
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        dec = StreamDecoder(tok)
        assert "".join(dec.push(i) for i in ids) + dec.flush() == tok.decode(ids)
    assert tok.encode("<|im_start|>") == [1] and (tok.bos_id, tok.eos_id) == (1, 2)
    assert tmpl.user == "<|im_start|>user\n{content}<|im_end|>\n" and not tmpl.bos
    assert tmpl.stop == ("<|im_end|>",) and tmpl.default_system.startswith("You are a helpful AI")


def test_convert_gguf_to_tinyllm_folder(tmp_path, llama_file):
    path, _, _ = llama_file
    assert convert_main([str(path), str(tmp_path / "out")]) == 0
    a, tok_a, tmpl_a, _ = open_any(path, quant="none")  # convert's default writes dense fp32
    b, tok_b, tmpl_b, name = open_any(tmp_path / "out")
    assert name == path.stem and tmpl_a == tmpl_b and tok_a.encode(TEXTS[2]) == tok_b.encode(TEXTS[2])
    idx = torch.randint(0, a.cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(a(idx)[0], b(idx)[0])


# ---- refusals ------------------------------------------------------------------------------

@pytest.mark.parametrize("case, message", [
    ("arch", "GGUF architecture 'gpt2' is not supported"),
    ("tokenizer", "has no tokenizer in its metadata"),
    ("rope", "rope scaling (linear) is not supported"),
    ("quant", "quantization type IQ4_NL is not supported"),
])
def test_unsupported_files_are_one_line_errors(tmp_path, sp_tok, case, message):
    model = tiny(sp_tok.vocab_size, tie=True)
    path = tmp_path / "bad.gguf"
    kv = sp_kv(sp_tok) if case != "tokenizer" else (lambda w: None)
    extra = (lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)) if case == "rope" else None
    types = {"blocks.1.ffn.w2.weight": Q.IQ4_NL} if case == "quant" else {}
    write_gguf(path, model, types, kv, arch="gpt2" if case == "arch" else "llama", extra=extra)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        open_any(path)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        inspect_any(path)
    if case == "quant":
        g = read_gguf(path)
        with pytest.raises(ValueError, match="quantization type IQ4_NL is not supported"):
            g.tensor("blk.1.ffn_down.weight")
        g.close()


def test_truncated_file_and_cli_exit_code(tmp_path, llama_file, capsys):
    path, _, _ = llama_file
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated"):
        open_any(cut)
    assert convert_main([str(cut), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tinyllm.formats.convert: error:") and "truncated" in err and err.count("\n") == 1


@torch.no_grad()
@pytest.mark.parametrize("qtype,dtype", [(Q.F16, torch.float16), (Q.BF16, torch.bfloat16)])
def test_16_bit_matrices_stay_16_bit_on_the_cpu_and_compute_as_fp32(tmp_path, sp_tok, qtype, dtype):
    """An F16 / BF16 GGUF under quant "auto" holds its matrices as the file does (half the bytes
    of fp32), and its eager logits equal those of the same file widened at load ("none")."""
    model = tiny(sp_tok.vocab_size, tie=True)
    path = tmp_path / "half.gguf"
    write_gguf(path, model, {k: qtype for k, v in model.state_dict().items() if v.dim() == 2}, sp_kv(sp_tok))
    held = open_any(path, "cpu", quant="auto")[0]
    wide = open_any(path, "cpu", quant="none")[0]
    assert held.dtype == torch.float32 and held.tok_emb.weight.dtype == dtype
    assert held.blocks[1].attn.wqkv.weight.dtype == dtype and held.norm.weight.dtype == torch.float32
    ids = torch.randint(0, sp_tok.vocab_size, (1, 12))
    assert torch.equal(held(ids)[0], wide(ids)[0])


def test_a_gemma_file_with_a_control_unk_and_no_template_opens_and_chats(tmp_path, sp_tok):
    """Gemma 3 270M's GGUF (the base model): "<unk>" typed as a control piece (sentencepiece then
    had no unknown id, and looking up a piece not in the vocab raised IndexError when the session
    opened), and no chat template (the built-in guess was chatml, whose markers Gemma lacks)."""
    from tinyllm.session.chat import open_session
    from tinyllm.text.jinja_template import pick_template

    path = tmp_path / "gemma-3-tiny.gguf"
    write_gguf(path, tiny(sp_tok.vocab_size, tie=True), {}, sp_kv(sp_tok, unk_kind=3))
    _, tok, _, _ = open_any(path)
    assert tok.piece_to_id("<end_of_turn>") is None and tok.piece_to_id("<nowhere>") is None
    for hint in ("Gemma 3 270m (gemma3)", "tiny-gguf (gemma2)"):  # the name and family pick_template is given
        tmpl = pick_template(None, tok, True, None, hint)
        assert tmpl.name == "gemma" and tmpl.render_user("hi", "be brief") == (
            "<start_of_turn>user\nbe brief\n\nhi<end_of_turn>\n")
    session = open_session(path, "cpu", max_len=64, compile=None)
    session.set_param("max_tokens", "3")
    assert [type(e).__name__ for e in session.send("hi")][-1] == "Finished"
