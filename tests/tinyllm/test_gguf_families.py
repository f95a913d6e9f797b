"""GGUF files of every model family, written by llama.cpp's OWN converter, against transformers.

For each family a tiny random Hugging Face folder (test_families.make_family) is converted by
llama.cpp's `convert_hf_to_gguf.py` (--outtype f32, offline, the local folder) and opened by
`open_any`: the logits equal transformers' within fp32 tolerance, the tokenizer the file
declares encodes as the folder's own, and the chat template is the folder's. One family is
converted again with --outtype q8_0: its logits stay close.

The converter comes from the llama.cpp sources that the PyPI sdist of llama-cpp-python vendors
(scripts/build_llama_cpp.sh unpacks it to $LLAMA_CPP_SRC, default /work/llama.cpp-src); without
them these tests skip (with CI=true they fail). It runs with this venv (torch, transformers,
sentencepiece, safetensors) and the sdist's gguf-py on sys.path.

One patch, and why: the converter names a byte-level BPE's pre-tokenizer by hashing the
tokenizer's output on a fixed text against a table of known models' hashes
(`get_vocab_base_pre`), so it refuses any tokenizer it has not seen, a tiny test one included;
llama.cpp's own remedy is to add the hash to that table (convert_hf_to_gguf_update.py). The
wrapper below does the equivalent: it returns the name of the pre-tokenizer the test tokenizer
really uses (each family's own: llama-bpe, qwen2, gpt-4o), and the tokenizer test checks that
claim. Nothing else of the converter is touched.

Gemma: GGUF stores no query_pre_attn_scalar (llama.cpp scales queries by head_dim, or dim /
heads for the 27B shapes), so the Gemma folders here set query_pre_attn_scalar = head_dim, as
the real models of those sizes do; their tokenizer is sentencepiece (tokenizer.model), which
the Gemma converters require.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tests.tinyllm.test_families as tf
from tests.tinyllm.formats_common import SMOL_TEMPLATE, TEXTS, need
from tinyllm.formats.open_model import open_any
from tinyllm.text.bpe_tokenizer import _PRE, BPETokenizer
from tinyllm.text.tokenizer import Tokenizer
from tinyllm.tools.testing import CHAT_TEXT, make_tiny_tokenizer

transformers = need("transformers")
tokenizers = need("tokenizers")
need("sentencepiece")

LLAMA_CPP = Path(os.environ.get("LLAMA_CPP_SRC", "/work/llama.cpp-src")) / "vendor" / "llama.cpp"
HAVE_CONVERTER = (LLAMA_CPP / "convert_hf_to_gguf.py").is_file()
if not HAVE_CONVERTER and os.environ.get("CI"):
    raise RuntimeError(f"llama.cpp's converter is not at {LLAMA_CPP}: run scripts/build_llama_cpp.sh (or set LLAMA_CPP_SRC)")
# a mark, not a skip at collection: a run that selects none of these tests (-m cuda) reports no skip for them
pytestmark = pytest.mark.skipif(
    not HAVE_CONVERTER, reason=f"llama.cpp's converter is not at {LLAMA_CPP} (scripts/build_llama_cpp.sh unpacks it)")

# convert_hf_to_gguf.py with the BPE pre-tokenizer named instead of guessed (see the docstring)
_CONVERT = """
import runpy, sys
src, pre, *args = sys.argv[1:]
sys.path[:0] = [src, src + "/gguf-py"]
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [src + "/convert_hf_to_gguf.py", *args]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""

# family -> the GGUF pre-tokenizer name of its tiny BPE (None: a sentencepiece tokenizer.model)
PRE = {"llama3": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2", "gemma2": None, "gemma3": None,
       "phi3": "gpt-4o", "granite": "llama-bpe"}
ARCH = {"llama3": "llama"}


def convert(folder: Path, out: Path, pre: str | None, outtype: str = "f32") -> Path:
    cmd = [sys.executable, "-c", _CONVERT, str(LLAMA_CPP), pre or "default", str(folder), "--outtype", outtype,
           "--outfile", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_LOCAL_GGUF": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def save_split_bpe(folder: Path, pre: str) -> int:
    """A tiny byte-level BPE whose pre-tokenizer is the regex GGUF's `pre` names (as the real
    models' tokenizer.json split), with ChatML specials; its vocab size."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_PRE[pre]), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CHAT_TEXT.splitlines() * 5, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>", "chat_template": SMOL_TEMPLATE,
        # Phi-4-mini's class: the Phi-3 converter reads a BPE only under this name
        "tokenizer_class": "GPT2Tokenizer" if pre == "gpt-4o" else "PreTrainedTokenizerFast"}))
    return tok.get_vocab_size()


def make_folder(family: str, folder: Path):
    """The family's tiny HF folder with its tokenizer; the transformers model."""
    pre = PRE[family]
    if pre is None:
        sp = make_tiny_tokenizer(folder.parent / f"{family}_sp")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tokenizer.model").write_bytes(sp.serialized())
        vocab = sp.vocab_size
    else:
        vocab = save_split_bpe(folder, pre)
    cls, model, own = tf.FAMILIES[family]
    if family.startswith("gemma"):
        own = {**own, "query_pre_attn_scalar": own["head_dim"]}  # what GGUF (llama.cpp) assumes
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(tf.FAMILIES, family, (cls, model, own))
        return tf.make_family(family, folder, vocab)


@pytest.fixture(scope="module", params=list(PRE))
def converted(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp("gguf_family")
    hf = make_folder(family, root / family)
    path = convert(root / family, root / f"{family}.gguf", PRE[family])
    return family, root / family, path, hf


def ids(vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (2, 40), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_logits_equal_transformers(converted):
    family, _, path, hf = converted
    model = open_any(path, "cpu", torch.float32, quant="none").model
    assert model.cfg.family == ARCH.get(family, family)
    idx = ids(model.cfg.vocab_size)
    err = (model(idx)[0] - hf(idx).logits).abs().max()
    assert err < 1e-4, (family, err)


def test_tokenizer_and_template_equal_the_folders(converted):
    family, folder, path, _ = converted
    _, tok, template, _ = open_any(path, "cpu", torch.float32, quant="none")
    _, ref, ref_template, _ = open_any(folder, "cpu", torch.float32)
    if PRE[family] is None:  # Gemma: sentencepiece without the dummy prefix (add_space_prefix false)
        assert isinstance(tok, Tokenizer) and (tok.bos_id, tok.eos_id) == (ref.bos_id, ref.eos_id)
        for text in TEXTS[:2]:
            assert tok.decode(tok.encode(text)) == text
        return
    assert isinstance(tok, BPETokenizer) and (tok.bos_id, tok.eos_id) == (1, 2)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in [*TEXTS, "I've 1234567 CamelCase words, HTTPServer's\r\n\n  done"]:
        assert tok.encode(text) == hf_tok.encode(text, add_special_tokens=False), (family, text)
    assert template == ref_template


@torch.no_grad()
def test_q8_0_file_keeps_the_logits(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf_q8")
    hf = make_folder("qwen3", root / "qwen3")
    path = convert(root / "qwen3", root / "qwen3-q8_0.gguf", PRE["qwen3"], "q8_0")
    idx = ids(hf.config.vocab_size, seed=2)
    ref = hf(idx).logits
    for quant in ("none", "auto"):  # dequantized to fp32; held as int8 (the default)
        model = open_any(path, "cpu", torch.float32, quant=quant).model
        err = (model(idx)[0] - ref).norm() / ref.norm()
        assert err < 0.05, (quant, err)


@pytest.mark.parametrize("arch, kv, message", [
    ("qwen2moe", {}, "GGUF architecture 'qwen2moe' is not supported (tinyllm reads "),
    ("qwen2", {"rope.scaling.type": "yarn"}, "rope scaling ('yarn') is not supported"),
    ("qwen3", {"expert_count": 8}, "mixture-of-experts qwen3 models are not supported"),
    ("granite", {"feed_forward_length": 128, "rope.scaling.finetuned": 0}, "granite layers without RoPE"),
])
def test_missing_families_and_features_are_one_line_refusals(tmp_path, arch, kv, message):
    import gguf

    from tinyllm.formats.gguf import gguf_config, read_gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), arch)
    for key, v in {"attention.head_count": 4, "embedding_length": 64, "block_count": 2, **kv}.items():
        (w.add_string if isinstance(v, str) else w.add_uint32)(f"{arch}.{key}", v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    g = read_gguf(tmp_path / "m.gguf")
    with pytest.raises(ValueError) as e:
        gguf_config(g)
    g.close()
    assert message in str(e.value) and "\n" not in str(e.value)
