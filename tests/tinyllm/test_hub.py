"""Models by name (`hf:OWNER/REPO[:FILE]`, tinyllm.formats.hub): the real huggingface_hub download code
against a local stand-in for the Hub (tests/hub_server.py, through HF_ENDPOINT): a Hugging Face
Llama folder and a GGUF open after the download, a second fetch reads the cache, offline reads
the cache or says so in one line, a missing repo or file is one line, and the app takes it."""

import subprocess
import sys

import pytest

from tests.tinyllm.formats_common import need

transformers = need("transformers")
need("gguf")


def test_a_hugging_face_folder_downloads_once_and_opens(endpoint):
    from tinyllm.formats import hub
    from tinyllm.formats.open_model import open_any

    path = hub.fetch("hf:me/llama", progress=False)
    assert path.is_dir() and (path / "config.json").is_file() and not (path / "pytorch_model.bin").exists()
    model, tok, _, _ = open_any(path)
    assert model.cfg.n_layers == 2 and tok.vocab_size == model.cfg.vocab_size
    before = endpoint.requests
    assert hub.fetch("hf:me/llama", progress=False) == path  # the Hub's cache answers
    assert endpoint.requests == before


def test_a_family_folder_downloads_with_its_own_chat_template(endpoint):
    from tinyllm.formats import hub
    from tinyllm.formats.open_model import open_any

    path = hub.fetch("hf:me/qwen3", progress=False)
    assert (path / "chat_template.jinja").is_file()
    model, _, template, _ = open_any(path)
    assert model.cfg.family == "qwen3" and model.cfg.qk_norm
    assert template.render_user("hi") == "<|user|>hi\n" and template.assistant_prefix == "<|assistant|>"


def test_a_gguf_repo_and_a_named_file(endpoint):
    from tinyllm.formats import hub
    from tinyllm.formats.open_model import open_any

    one = hub.fetch("hf:me/one", progress=False)
    assert one.name == "m.Q8_0.gguf" and open_any(one).model.cfg.n_layers == 2
    assert hub.fetch("hf:me/two:b.gguf", progress=False).name == "b.gguf"
    with pytest.raises(ValueError, match=r"holds 2 GGUF files: name one, e\.g\. hf:me/two:a\.gguf"):
        hub.fetch("hf:me/two", progress=False)


@pytest.mark.parametrize("spec, message", [
    ("hf:me/nothere", "the Hub has no model me/nothere"),
    ("hf:me/one:missing.gguf", "me/one on the Hub has no file missing.gguf"),
    ("hf:me", "is not a Hub model: write hf:OWNER/REPO"),
    ("hf:me/one:", "is not a Hub model"),
])
def test_what_the_hub_does_not_have_is_one_line(endpoint, spec, message):
    from tinyllm.formats import hub

    with pytest.raises(ValueError, match=message) as e:
        hub.fetch(spec, progress=False)
    assert "\n" not in str(e.value)


def test_offline_the_cache_answers_and_anything_else_is_one_line(endpoint, monkeypatch):
    from huggingface_hub import constants

    from tinyllm.formats import hub

    folder, one = hub.fetch("hf:me/llama", progress=False), hub.fetch("hf:me/one", progress=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert hub.fetch("hf:me/llama", progress=False) == folder
    assert hub.fetch("hf:me/one", progress=False) == one
    with pytest.raises(ValueError, match=r"cannot reach the Hub \(http://127.0.0.1:9\) and it is not in the Hub's cache"):
        hub.fetch("hf:me/two:a.gguf", progress=False)


def test_the_app_takes_a_hub_name_and_refuses_a_bad_one_in_one_line(endpoint, tmp_path):
    """`tinyllm-chat --model hf:...`: downloaded before the window opens (its progress on
    stderr); a repo the Hub does not have is one line and exit 2. (--check: validate and exit.)"""
    env = {"HF_ENDPOINT": endpoint.url, "HF_HUB_CACHE": str(tmp_path / "hub-cache"),
           "TINYLLM_CHAT_DATA_DIR": str(tmp_path / "data"), "TINYLLM_CHAT_CONFIG_DIR": str(tmp_path / "config"),
           "PATH": "/usr/bin:/bin"}
    bad = subprocess.run([sys.executable, "-m", "chat_app", "--model", "hf:me/nothere"], env=env,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    lines = bad.stderr.strip().splitlines()  # what it is getting, then the one error line
    assert bad.returncode == 2 and len(lines) == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert lines[-1].startswith("tinyllm-chat: error: hf:me/nothere: the Hub has no model me/nothere")
    good = subprocess.run([sys.executable, "-c", "from chat_app.__main__ import resolve_model; "
                           "print(resolve_model('hf:me/one'))"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert good.returncode == 0 and good.stdout.strip().endswith("m.Q8_0.gguf"), good.stderr
