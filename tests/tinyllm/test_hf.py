"""Hugging Face folders against transformers itself: a random-weight LlamaForCausalLM (GQA, tied
and untied embeddings) saved with save_pretrained must give the same logits and the same
greedy tokens in tinyllm; tokenizer.json tokenizers, Jinja chat templates, ChatSession ids
against apply_chat_template; conversion to a tinyllm folder; one-line errors."""

import json
import random
import shutil

import pytest
import torch

from tests.tinyllm.forced import assert_same_draws
from tests.tinyllm.formats_common import SMOL_TEMPLATE, TEXTS, need, train_bpe
from tinyllm.decode.generate import generate
from tinyllm.formats.convert import main as convert_main
from tinyllm.formats.hf import load_hf
from tinyllm.formats.model_files import read_safetensors_header
from tinyllm.formats.open_model import inspect_any, open_any
from tinyllm.session.chat import ChatSession
from tinyllm.text.bpe_tokenizer import BPETokenizer
from tinyllm.text.jinja_template import JinjaChatTemplate
from tinyllm.text.tokenizer import StreamDecoder, Tokenizer
from tinyllm.tools.testing import make_tiny_tokenizer

transformers = need("transformers")
tokenizers = need("tokenizers")


def make_hf_model(path, vocab_size, tie, seed=0, shard=None, **overrides):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_theta=50000.0,
        tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, **overrides)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # large random weights, so every mapping mistake shows in the logits
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.2) + (1.0 if p.dim() == 1 else 0.0))
    hf.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    return hf


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
    return make_tiny_tokenizer(tmp_path_factory.mktemp("sp"))


@pytest.fixture(scope="module", params=["tied", "untied-sharded"])
def sp_folder(request, tmp_path_factory, sp_tok):
    path = tmp_path_factory.mktemp("hf") / "llama"
    tie = request.param == "tied"
    hf = make_hf_model(path, sp_tok.vocab_size, tie, seed=int(tie), shard=None if tie else "60KB")
    (path / "tokenizer.model").write_bytes(sp_tok.serialized())
    return path, hf


def test_load_reports_each_tensor_read(sp_folder):
    path, hf = sp_folder
    calls: list[tuple[int, int]] = []
    load_hf(path, "cpu", torch.float32, progress=lambda done, total: calls.append((done, total)))
    n = sum(len(read_safetensors_header(f)) for f in path.glob("*.safetensors"))
    assert calls == [(i, n) for i in range(n + 1)] and n > 10


def test_logits_match_transformers(sp_folder):
    path, hf = sp_folder
    if not hf.config.tie_word_embeddings:
        assert (path / "model.safetensors.index.json").is_file()  # the sharded variant is sharded
    loaded = open_any(path, "cpu", torch.float32)
    model, tok, tmpl, name = loaded  # a LoadedModel unpacks as the four, and names them
    assert (loaded.model, loaded.tokenizer, loaded.template, loaded.name) == (model, tok, tmpl, name)
    assert inspect_any(path) == name
    assert model.cfg.tie_embeddings == hf.config.tie_word_embeddings
    assert model.cfg.rope_theta == 50000.0 and model.cfg.n_kv_heads == 2
    idx = torch.randint(0, model.cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(idx)
        ref = hf(idx).logits
    assert (ours - ref).abs().max() < 1e-4


@torch.no_grad()
def test_greedy_generation_matches_transformers(sp_folder):
    """generate()'s greedy tokens against transformers' argmax on the same text (teacher-forced:
    two free-running decodes part at the first near-tie), wherever no near-tie can flip them."""
    path, hf = sp_folder
    model, tok, _, _ = open_any(path, "cpu", torch.float32)
    prompt = torch.tensor([tok.encode("What is the capital of France?", bos=True)])
    ours = torch.stack(list(generate(model, prompt, 32)), dim=1)  # (1, 32)
    seq = torch.cat([prompt, ours[:, :-1]], dim=1)  # what each of our draws came after
    theirs = hf(seq).logits[0, prompt.shape[1] - 1:]  # (32, V)
    mine = model(seq)[0][0, prompt.shape[1] - 1:]  # (32, V)
    assert_same_draws(theirs, theirs.argmax(-1).tolist(), (ours[0].tolist(), mine))


def test_tokenizer_model_with_added_tokens(tmp_path, sp_folder, sp_tok):
    n = sp_tok.vocab_size
    dst = tmp_path / "added"
    make_hf_model(dst, n + 2, tie=True)  # embeddings for the two added tokens too
    (dst / "tokenizer.model").write_bytes(sp_tok.serialized())
    added = {str(n): {"content": "<|assistant|>", "special": True}, str(n + 1): {"content": "<tool>"}}
    (dst / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    _, tok, _, _ = open_any(dst)
    assert isinstance(tok, Tokenizer) and tok.vocab_size == n + 2
    assert tok.encode("<|assistant|>hi<tool>") == [n, *sp_tok.encode("hi"), n + 1]


# ---- tokenizer.json (byte-level BPE), Jinja template, ChatSession ------------------------

def save_bpe(folder):
    tok = train_bpe()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": SMOL_TEMPLATE}))
    return tok


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("bpe") / "smol"
    hf_tok = save_bpe(path)
    make_hf_model(path, hf_tok.get_vocab_size(), tie=True, seed=3)
    return path


def test_bpe_tokenizer_matches_transformers(bpe_folder):
    tok = BPETokenizer.load(bpe_folder)
    ref = transformers.AutoTokenizer.from_pretrained(str(bpe_folder))
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert tok.encode("<|im_start|>") == [1] and tok.piece_to_id("<|im_end|>") == 2


def test_stream_decoder_on_bpe_equals_decode(bpe_folder):
    tok = BPETokenizer.load(bpe_folder)
    rng = random.Random(0)
    noise = [[rng.randrange(tok.vocab_size) for _ in range(60)] for _ in range(20)]
    streams = [tok.encode(t) for t in TEXTS] + noise
    for ids in streams:
        dec = StreamDecoder(tok)
        pieces = [dec.push(i) for i in ids]
        text = "".join(pieces) + dec.flush()
        assert text == tok.decode(ids)
        assert not any(p.endswith("\ufffd") and "\ufffd" not in tok.decode(ids) for p in pieces)


def test_jinja_template_and_chat_ids_match_apply_chat_template(bpe_folder):
    model, tok, tmpl, _ = open_any(bpe_folder, "cpu")
    assert isinstance(tmpl, JinjaChatTemplate) and tmpl.name == "chatml" and not tmpl.bos
    assert tmpl.stop == ("<|im_end|>",)
    assert tmpl.default_system.startswith("You are a helpful AI assistant named SmolLM")
    ref = transformers.AutoTokenizer.from_pretrained(str(bpe_folder))
    convo = [("user", "What is the capital of France?"), ("assistant", "Paris 2 3."), ("user", "Café 🙂")]
    for system in (None, "Be terse."):
        s = ChatSession(model, tok, tmpl, max_len=128, system=system or tmpl.default_system, compile=None)
        s.load_messages(convo)
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": r, "content": c} for r, c in convo]
        want = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert s.context == list(want)
    s.set_param("max_tokens", "5")
    assert list(s.send("Hi"))[-1].reason in ("eos", "max_tokens")


def test_convert_hf_to_tinyllm_folder(tmp_path, sp_folder):
    path, hf = sp_folder
    assert convert_main([str(path), str(tmp_path / "out")]) == 0
    model, tok, tmpl, name = open_any(tmp_path / "out")
    idx = torch.randint(0, model.cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max() < 1e-4
    assert json.loads((tmp_path / "out" / "config.json").read_text())["format"] == "tinyllm"


def test_convert_keeps_a_jinja_template(tmp_path, bpe_folder):
    import tinyllm.formats.checkpoint

    if not hasattr(tinyllm.formats.checkpoint, "TOKENIZER_JSON"):
        pytest.skip("checkpoint folders cannot hold tokenizer.json yet (see the checkpoint.py diff)")
    assert convert_main([str(bpe_folder), str(tmp_path / "out")]) == 0
    _, tok, tmpl, _ = open_any(tmp_path / "out")
    _, tok0, tmpl0, _ = open_any(bpe_folder)
    assert tmpl == tmpl0 and isinstance(tok, BPETokenizer)
    assert [tok.encode(t) for t in TEXTS] == [tok0.encode(t) for t in TEXTS]


# ---- refusals: one line, naming what is unsupported --------------------------------------

@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"head_dim": 32}, "config.json does not match the weights: shape mismatch"),  # a head_dim of its own: Qwen 3
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "lacks 'factor'"),
    ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, "rope scaling 'yarn' is not supported"),
    ({"attention_bias": True}, "attention_bias=true is not supported for llama"),
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window=true is not supported for qwen2"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantized weights (gptq) are not supported"),
])
def test_unsupported_configs_are_one_line_errors(tmp_path, sp_folder, change, message):
    path, _ = sp_folder
    dst = tmp_path / "m"
    shutil.copytree(path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(change)
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        open_any(dst)
    assert "\n" not in str(e.value)


def test_missing_tokenizer_and_bad_paths(tmp_path, sp_folder, capsys):
    path, _ = sp_folder
    dst = tmp_path / "m"
    shutil.copytree(path, dst)
    (dst / "tokenizer.model").unlink()
    with pytest.raises(FileNotFoundError, match="has no tokenizer"):
        open_any(dst)
    with pytest.raises(FileNotFoundError, match="has no tokenizer"):
        inspect_any(dst)  # the CLI's check before its UI opens, without reading weights
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_any(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="is not a model"):
        open_any(tmp_path / "notes.txt")
    assert convert_main([str(dst), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tinyllm.formats.convert: error:") and "has no tokenizer" in err and err.count("\n") == 1


# ---- Jinja templates of well-known model families ------------------------------------------

ALTERNATE = "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}" + ALTERNATE + "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}")
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}" + ALTERNATE + "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
L3_PREFIX = "<|start_header_id|>assistant<|end_header_id|>\n\n"


@pytest.mark.parametrize("source, bos, eos, want", [
    (LLAMA2, "<s>", "</s>", dict(user="<s>[INST] {content} [/INST]", assistant_suffix=" </s>", bos=False,
                                 system="<<SYS>>\n{content}\n<</SYS>>\n\n", system_in_first_user=True)),
    (ZEPHYR, "<s>", "</s>", dict(name="zephyr", user="<|user|>\n{content}</s>\n", bos=True, stop=("</s>",),
                                 assistant_prefix="<|assistant|>\n")),
    (MISTRAL, "<s>", "</s>", dict(user="[INST] {content} [/INST]", assistant_suffix="</s>", bos=True,
                                  system_in_first_user=True)),
    (LLAMA3, "<|begin_of_text|>", "<|eot_id|>",
     dict(bos=True, stop=("<|eot_id|>",), assistant_suffix="<|eot_id|>", assistant_prefix=L3_PREFIX)),
])
def test_jinja_templates_of_model_families(source, bos, eos, want):
    from tinyllm.text.jinja_template import derive_template

    t = derive_template(source, bos, eos, add_bos=True)
    assert {k: getattr(t, k) for k in want} == want


def test_a_template_that_does_not_split_falls_back_with_a_warning(bpe_folder, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(bpe_folder, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    # numbers every turn by the conversation's length: not per message
    cfg["chat_template"] = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ messages | length }}"
                            "\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning, match="using the built-in 'chatml' chat template"):
        _, _, tmpl, _ = open_any(dst)
    assert tmpl.name == "chatml"
