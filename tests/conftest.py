"""Shared fixtures: a tiny random model on the CPU; `@pytest.mark.cuda` tests skip without CUDA,
and none ends while a background compile it started still runs. A test that hangs (setup, call
or teardown past HANG_S) ends the run with every thread's stack on stderr, instead of holding
CI until its limit with nothing to read."""

import faulthandler
import os
import threading

import pytest
import torch

from tests.llama_server import llama_server, llama_server_factory  # noqa: F401 (fixtures: a real llama-server)
from tinyllm.model import ModelConfig, Transformer

HANG_S = 900  # the slowest test takes about 60 s on the 2-core CPU
_stderr = -1  # the terminal's stderr, which pytest's capturing of a test's output leaves alone


def pytest_configure(config):
    global _stderr
    config.addinivalue_line("markers", "cuda: needs a CUDA device (run on the H200)")
    _stderr = os.dup(2)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item):
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=_stderr)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_sessionfinish(session):
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=_stderr)  # the end too (event loops shut down)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_compile_outlives_a_cuda_test(request):
    """A session's background compile runs on a daemon thread; left running past its test, its
    CUDA work lands beside the next test's graph capture and invalidates it (seen on the H200:
    one test's two sessions, still compiling, broke the captures of the 13 tests after it).
    CUDA tests therefore end only once every compile thread has."""
    yield
    if request.node.get_closest_marker("cuda") is None:
        return
    for t in threading.enumerate():
        if t.name == "tinyllm-compile":
            t.join(timeout=600)


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.from_name("tiny", **overrides)).init_weights(seed).eval()


@pytest.fixture(scope="module")
def model() -> Transformer:
    return tiny_model()


# ---- a stand-in for the Hugging Face Hub (tests/hub_server.py): tinyllm.formats.hub, /model hf:... ----

@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Repos me/llama (a safetensors Llama folder, plus a file that must not be downloaded), me/qwen3,
    me/one (one GGUF) and me/two (two GGUFs)."""
    from tests.hub_server import HubServer
    from tests.tinyllm.test_gguf import sp_kv, tiny, write_gguf
    from tests.tinyllm.test_hf import make_hf_model
    from tinyllm.tools.testing import make_tiny_tokenizer

    root = tmp_path_factory.mktemp("hub")
    tok = make_tiny_tokenizer(tmp_path_factory.mktemp("sp"))
    llama = root / "me" / "llama"
    make_hf_model(llama, tok.vocab_size, tie=True)
    (llama / "tokenizer.model").write_bytes(tok.serialized())
    (llama / "pytorch_model.bin").write_bytes(b"not read")
    from tests.tinyllm.test_families import make_family
    from tests.tinyllm.test_hf import save_bpe

    qwen3 = root / "me" / "qwen3"  # a family of its own, its chat template in chat_template.jinja
    make_family("qwen3", qwen3, save_bpe(qwen3).get_vocab_size())
    (qwen3 / "chat_template.jinja").write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    import gguf

    q = gguf.GGMLQuantizationType
    for repo, names in (("one", ["m.Q8_0.gguf"]), ("two", ["a.gguf", "b.gguf"])):
        (root / "me" / repo).mkdir(parents=True)
        for name in names:
            model = tiny(tok.vocab_size, tie=False)
            write_gguf(root / "me" / repo / name, model, {k: q.Q8_0 for k in model.state_dict()
                                                          if k.endswith(".weight") and model.state_dict()[k].dim() == 2},
                       sp_kv(tok))
    server = HubServer(root)
    yield server
    server.close()


@pytest.fixture
def endpoint(hub, tmp_path, monkeypatch):
    """This test's own Hub cache, the stand-in as the endpoint (huggingface_hub reads both when
    called, through its constants: set here before any call)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    return hub
