"""tinyllm.formats.model_files: the checks a process without torch makes before its UI opens."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tinyllm.formats.model_files import model_name, precheck
from tinyllm.tools.testing import make_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


def copy_with(ckpt, dst, name: str, data: bytes | None):
    dst.mkdir()
    for f in ckpt.iterdir():
        if f.name != name:
            (dst / f.name).write_bytes(f.read_bytes())
        elif data is not None:
            (dst / f.name).write_bytes(data)
    return dst


def test_precheck_names_a_good_model_without_importing_torch(ckpt, tmp_path):
    code = ("import sys\nfrom tinyllm.formats.model_files import precheck\n"
            f"print(precheck({str(ckpt)!r}))\nassert 'torch' not in sys.modules, 'precheck imported torch'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tiny-test"
    hf = copy_with(ckpt, tmp_path / "hf", "config.json", json.dumps({"model_type": "llama"}).encode())
    assert precheck(hf) == "hf"  # no _name_or_path: the folder's name


def test_one_name_for_a_model_its_file_or_folder(ckpt, tmp_path):
    """Issue 34, item 9: the file's or folder's name, not general.name nor _name_or_path; a
    tinyllm checkpoint's config name; the repo's name for a folder in the Hub's cache."""
    config = json.dumps({"model_type": "llama", "_name_or_path": "/home/someone/run7"}).encode()
    hf = copy_with(ckpt, tmp_path / "SmolLM2-135M-Instruct", "config.json", config)
    assert precheck(hf) == model_name(hf) == "SmolLM2-135M-Instruct"
    cached = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots"
    cached.mkdir(parents=True)
    hf.rename(cached / "0123abcd")
    assert precheck(cached / "0123abcd") == "SmolLM2-135M-Instruct"
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    assert model_name(gguf) == "SmolLM2-135M-Instruct.Q4_1" and model_name(ckpt) == "tiny-test"


@pytest.mark.parametrize("name, data, message", [
    ("model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{}", "truncated"),
    ("model.safetensors", None, "no model.safetensors"),
    ("tokenizer.model", None, "no tokenizer"),
    ("config.json", b"{not json", "not valid JSON"),
])
def test_precheck_refuses_with_one_line(ckpt, tmp_path, name, data, message):
    broken = copy_with(ckpt, tmp_path / "broken", name, data)
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        precheck(broken)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_precheck_refuses_a_truncated_weight_file(ckpt, tmp_path):
    data = (ckpt / "model.safetensors").read_bytes()
    broken = copy_with(ckpt, tmp_path / "broken", "model.safetensors", data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated"):
        precheck(broken)


def test_precheck_of_a_gguf_file_and_of_nothing(tmp_path):
    from tests.tinyllm.test_hostile_files import gguf_bytes, kv_str, kv_u32

    llama = [kv_str("general.architecture", "llama"), kv_str("tokenizer.ggml.model", "gpt2")]
    (tmp_path / "m.gguf").write_bytes(gguf_bytes(llama))
    assert precheck(tmp_path / "m.gguf") == "m"  # the tensors are the loader's to check
    for kvs, message in [([kv_str("general.architecture", "mamba")] + llama[1:], "architecture 'mamba' is not"),
                         (llama + [kv_u32("llama.expert_count", 8)], "mixture-of-experts"),
                         (llama[:1] + [kv_str("tokenizer.ggml.model", "rwkv")], "tokenizer model 'rwkv'")]:
        (tmp_path / "x.gguf").write_bytes(gguf_bytes(kvs))
        with pytest.raises(ValueError, match=message):
            precheck(tmp_path / "x.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"junk\n")
    with pytest.raises(ValueError, match="not a GGUF file"):
        precheck(tmp_path / "junk.gguf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        precheck(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a model"):
        precheck(tmp_path / "notes.txt")


def test_precheck_names_the_architecture_before_the_tokenizer_and_weighs_the_memory(ckpt, tmp_path, monkeypatch):
    """Issue 46, item 5: a folder of an unread architecture and no tokenizer is refused for its
    architecture (what a user can do least about); weights larger than the free RAM, before the UI."""
    import json
    import shutil

    from tinyllm.formats import model_files

    hf = tmp_path / "mixtral"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
    shutil.copy(ckpt / "model.safetensors", hf / "model.safetensors")
    with pytest.raises(ValueError, match="model_type 'mixtral' is not supported"):
        precheck(hf)
    monkeypatch.setattr(model_files, "available_memory", lambda: 1000)
    with pytest.raises(ValueError, match=r"weights take .* GB of memory is free"):
        precheck(ckpt)
