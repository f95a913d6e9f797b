"""`tinyllm convert SRC DST --to hf` against transformers itself: the default model's export
(its int4/int8 matrices dequantized, fp32) and random tiny models of every family load with
AutoModelForCausalLM and give tinyllm's logits; AutoTokenizer gives tinyllm's ids on mixed text;
apply_chat_template gives the ids tinyllm's Conversation feeds; Jinja written from a template
reads back as that template; bad input is one line on stderr and exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tinyllm.formats_common import TEXTS, need, train_bpe
from tinyllm.formats.checkpoint import save_checkpoint
from tinyllm.formats.convert import main as convert_main
from tinyllm.formats.hf_export import export_hf
from tinyllm.formats.open_model import open_any
from tinyllm.model import ModelConfig, Transformer
from tinyllm.session.conversation import Conversation
from tinyllm.text.bpe_tokenizer import BPETokenizer
from tinyllm.text.chat_template import TEMPLATES
from tinyllm.text.jinja_template import JinjaChatTemplate, derive_template, jinja_source
from tinyllm.tools.testing import make_tiny_tokenizer

transformers = need("transformers")
need("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "models" / "tinychat"
MIXED = ["Café, naïve, Zürich — “quotes” 日本語 🙂🚀 👩‍👩‍👧", "  def f(x):\n    return x ** 2 + 12345\n\n\n",
         "\tTabs\tand  double  spaces, trailing   ", "3.14159, 1,000,000 and 0x1F; 2026-12-06", "\n\nnewlines\r\n",
         "   leading spaces", "<|im_start|>user\nhi<|im_end|>\n", "x<|im_end|>y", *TEXTS]
CHAT = [("system", "Be brief."), ("user", "Hi! 🙂 Café, or  code?"), ("assistant", "Hello.\n  x = 42\n"),
        ("user", "And 12345?")]


class NoCache:
    """The cache a Conversation rewinds: none here, only the ids are wanted."""
    n = 0

    def truncate(self, n: int) -> None:
        pass


def tinyllm_prompt(tokenizer, template, chat=CHAT) -> list[int]:
    """The ids tinyllm's Conversation feeds for `chat` (system, user, assistant, user) and the reply prompt."""
    (_, system), *turns, (_, last) = chat
    c = Conversation(tokenizer, template, 4096, NoCache(), system=system)
    c.load_messages(turns)
    c.add_user(last, 64)
    return c.context


def hf_prompt(hf_tok, chat=CHAT) -> list[int]:
    msgs = [{"role": r, "content": t} for r, t in chat]
    return list(hf_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))


# ---- the default model ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def default_export(tmp_path_factory):
    said: list[str] = []
    dst = export_hf(DEFAULT_MODEL, tmp_path_factory.mktemp("export") / "tinychat-hf", "fp32", say=said.append)
    return dst, said


@pytest.fixture(scope="module")
def default_model():
    return open_any(DEFAULT_MODEL, "cpu", torch.float32, quant="none")  # dense: the matrices the export holds


def test_default_model_export_loads_in_transformers_with_our_logits(default_export, default_model):
    dst, said = default_export
    assert said and said[0].startswith("dequantized ") and "int4" in said[0]  # the shipped model is int4/int8
    config = json.loads((dst / "config.json").read_text())
    assert (config["model_type"], config["torch_dtype"], config["tie_word_embeddings"]) == ("llama", "float32", True)
    model, tok, _, _ = default_model
    hf = transformers.AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([tok.encode("The capital of France is Paris. 12345 🙂\n  def f(x):", bos=True)])  # (1, T)
    with torch.no_grad():
        ours, _ = model(ids)  # (1, T, V)
        ref = hf(ids).logits  # (1, T, V)
    torch.testing.assert_close(ref, ours, rtol=0, atol=2e-4)
    assert ref[0, -1].argmax() == ours[0, -1].argmax()
    generation = json.loads((dst / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": [2, tok.piece_to_id("<|im_end|>")]}


def test_default_model_tokenizer_gives_our_ids(default_export, default_model):
    dst, _ = default_export
    tok = default_model.tokenizer
    ref = transformers.AutoTokenizer.from_pretrained(dst)
    for text in MIXED:
        ids = tok.encode(text)
        assert ref.encode(text, add_special_tokens=False) == ids, text
        assert ref.decode(ids, skip_special_tokens=True) == tok.decode(ids), text
    assert ref.encode("Hi") == [tok.bos_id, *tok.encode("Hi")]  # BOS in front, as LlamaTokenizer adds it
    names = (ref.bos_token_id, ref.eos_token_id, ref.unk_token_id, ref.pad_token_id)
    assert names == (tok.bos_id, tok.eos_id, 0, tok.pad_id) == (1, 2, 0, 3)
    # the tokenizers package alone (an engine without sentencepiece or transformers) reads the same ids
    from tokenizers import Tokenizer as RawTokenizer

    raw = RawTokenizer.from_file(str(dst / "tokenizer.json"))
    assert [raw.encode(t, add_special_tokens=False).ids for t in MIXED] == [tok.encode(t) for t in MIXED]


def test_default_model_chat_template_gives_our_prompt(default_export, default_model):
    dst, _ = default_export
    _, tok, template, _ = default_model
    ref = transformers.AutoTokenizer.from_pretrained(dst)
    assert hf_prompt(ref) == tinyllm_prompt(tok, template)
    assert hf_prompt(ref, CHAT[:2]) == tinyllm_prompt(tok, template, CHAT[:2])


# ---- tiny random models: every family, every built-in template --------------------------------

_GEMMA = dict(act="gelu_tanh", post_norms=True, embed_scale=8.0, attn_scale=16.0, head_dim=16, sliding_window=8,
              local_layers=(0,), tie_embeddings=True)
FAMILIES = {
    "llama": {},
    "llama-rope-llama3": dict(rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": dict(family="mistral"),
    "qwen2": dict(family="qwen2", qkv_bias=True, tie_embeddings=True),
    "qwen3": dict(family="qwen3", qk_norm=True, head_dim=32),
    "gemma2": dict(family="gemma2", attn_softcap=50.0, final_softcap=30.0, **_GEMMA),
    "gemma3": dict(family="gemma3", qk_norm=True, rope_theta=1e6, rope_local_theta=1e4, **_GEMMA),
    "phi3": dict(family="phi3", rotary_dim=8, rope_scaling={
        "type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [1.5, 2.0, 3.0, 4.0],
        "original_max_position_embeddings": 64, "factor": 2.0, "attention_factor": None}),
    # attn_scale: an attention_multiplier's ** -2 (0.09), as tinyllm.families.granite reads one
    "granite": dict(family="granite", embed_scale=3.0, attn_scale=0.09 ** -2, residual_scale=0.5, logit_divisor=2.5,
                    tie_embeddings=True),
}


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def tiny_checkpoint(path, tokenizer, template="chatml", quant="none", **overrides) -> Path:
    """A random tinyllm checkpoint, large random weights (norms and biases too), so every
    mapping mistake shows in the logits."""
    cfg = ModelConfig.from_name("tiny", vocab_size=tokenizer.vocab_size, max_seq_len=128, **overrides)
    model = Transformer(cfg).init_weights(0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() == 1 else 0.2) + (p.dim() == 1))
    if quant != "none":
        from tinyllm.formats.build import quantize_model

        model = quantize_model(model, quant)
    return save_checkpoint(model, tokenizer, path, name="tiny", chat={"template": template})


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_loads_in_transformers_with_our_logits(tmp_path, sp_tok, family):
    src = tiny_checkpoint(tmp_path / "src", sp_tok, **FAMILIES[family])
    dst = export_hf(src, tmp_path / "hf", "fp32")
    model = open_any(src, "cpu", torch.float32).model
    hf = transformers.AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    idx = torch.randint(0, model.cfg.vocab_size, (2, 30), generator=torch.Generator().manual_seed(1))  # (B, T)
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0], rtol=0, atol=1e-4)
    assert json.loads((dst / "config.json").read_text())["model_type"] == {"gemma3": "gemma3_text"}.get(
        family, family.split("-")[0])


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_builtin_template_gives_our_prompt(tmp_path, sp_tok, template):
    src = tiny_checkpoint(tmp_path / "src", sp_tok, template=template)
    dst = export_hf(src, tmp_path / "hf", "bf16")
    _, tok, tmpl, _ = open_any(src)
    ref = transformers.AutoTokenizer.from_pretrained(dst)
    assert hf_prompt(ref) == tinyllm_prompt(tok, tmpl), template
    assert json.loads((dst / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_a_quantized_checkpoint_is_dequantized_to_bf16_by_default(tmp_path, sp_tok, capsys):
    src = tiny_checkpoint(tmp_path / "src", sp_tok, quant="int8")
    assert convert_main([str(src), str(tmp_path / "hf"), "--to", "hf"]) == 0
    err = capsys.readouterr().err
    assert "dequantized 16 int8 matrices to dense bfloat16" in err  # 2 layers x 7, the embedding, lm_head
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    dense = open_any(src, "cpu", torch.float32, quant="none").model
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    idx = torch.arange(20)[None]  # (1, T)
    with torch.no_grad():
        assert (hf(idx).logits - dense(idx)[0]).abs().max() < 0.1  # bf16 weights: close, not exact


def test_a_tokenizer_json_tokenizer_is_kept(tmp_path):
    raw = train_bpe()
    tok = BPETokenizer(raw, bos_id=1, eos_id=2)  # "<|im_start|>" opens, as SmolLM2's BOS
    src = tiny_checkpoint(tmp_path / "src", tok)
    dst = export_hf(src, tmp_path / "hf", "fp32")
    ref = transformers.AutoTokenizer.from_pretrained(dst)
    assert [ref.encode(t, add_special_tokens=False) for t in MIXED] == [tok.encode(t) for t in MIXED]
    _, tok2, tmpl, _ = open_any(src)
    assert hf_prompt(ref) == tinyllm_prompt(tok2, tmpl)


def test_jinja_written_from_a_template_reads_back_as_it():
    for name, t in TEMPLATES.items():
        back = derive_template(jinja_source(t), "<s>", "</s>", True)
        assert (back.system, back.user, back.assistant_prefix, back.assistant_suffix, back.bos,
                back.system_in_first_user) == (t.system, t.user, t.assistant_prefix, t.assistant_suffix, t.bos,
                                               t.system_in_first_user), name
    qwen3 = JinjaChatTemplate(name="jinja", system="<|im_start|>system\n{content}<|im_end|>\n",
                              user="<|im_start|>user\n{content}<|im_end|>\n", assistant_prefix="<|im_start|>assistant\n",
                              assistant_suffix="<|im_end|>\n", stop=("<|im_end|>",), bos=False,
                              thinking=("", "<think>\n\n</think>\n\n"), reasoning_end="</think>",
                              default_system="You are {a} helpful assistant.")
    assert derive_template(jinja_source(qwen3), None, "<|im_end|>", False, name="jinja") == qwen3


# ---- refusals: one line on stderr, exit code 2 ---------------------------------------------------

def test_bad_input_is_one_line_and_exit_code_2(tmp_path, sp_tok, capsys):
    src = tiny_checkpoint(tmp_path / "src", sp_tok)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    (tmp_path / "notes.txt").write_text("not a model")
    cases = [([str(src), str(busy), "--to", "hf"], "exists and is not empty; pick another DST or pass --force"),
             ([str(tmp_path / "notes.txt"), str(tmp_path / "o1"), "--to", "hf"], "is not a model"),
             ([str(tmp_path / "nope"), str(tmp_path / "o2"), "--to", "hf"], "does not exist"),
             ([str(src), str(tmp_path / "o3"), "--to", "hf", "--quant", "int8"], "--to hf writes dense weights"),
             ([str(tiny_checkpoint(tmp_path / "bias", sp_tok, qkv_bias=True)), str(tmp_path / "o4"), "--to", "hf"],
              "this llama model has no Hugging Face llama form")]
    for argv, message in cases:
        assert convert_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("tinyllm.formats.convert: error:") and message in err and err.count("\n") == 1, err
    assert (busy / "notes.txt").read_text() == "mine" and not (tmp_path / "o4").exists()
    assert convert_main([str(src), str(busy), "--to", "hf", "--force"]) == 0  # --force writes beside it


def test_the_command_refuses_without_a_traceback(tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "tinyllm.tools.cli", "convert", str(DEFAULT_MODEL), str(busy),
                           "--to", "hf"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "exists and is not empty" in proc.stderr
