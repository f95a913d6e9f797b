"""Decoding eagerly while another thread traces with FX (what a background compile's AOTAutograd
does): FX's tracers replace torch.nn.Module.__call__ process-wide for the whole trace, and a model
called meanwhile went through the tracer and failed ("NameError: module is not installed as a
submodule", seen in the app on a CPU, a reply during the first compile). The trace here is held
open on an Event, so the test does not depend on timing."""

import threading

import pytest
import torch
from torch import nn

from tinyllm.decode.generate import generate
from tinyllm.formats.build import quantize_model
from tinyllm.session.chat import open_session
from tinyllm.tools.testing import make_tiny_checkpoint


class HeldTrace:
    """torch.fx.symbolic_trace of a module whose forward waits: the patch stays on until close()."""

    def __init__(self):
        self.inside, self.go = threading.Event(), threading.Event()
        held = self

        class Waits(nn.Module):
            def forward(self, x):
                held.inside.set()
                held.go.wait(60)
                return x + 1

        self.thread = threading.Thread(target=torch.fx.symbolic_trace, args=(Waits(),), daemon=True)

    def __enter__(self):
        self.thread.start()
        assert self.inside.wait(60)
        assert torch.nn.Module.__call__ is not torch.fx._symbolic_trace._orig_module_call  # patched now
        return self

    def __exit__(self, *exc):
        self.go.set()
        self.thread.join(60)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", max_seq_len=256)


@pytest.mark.parametrize("quant", ["none", "int8"])
@torch.no_grad()
def test_generate_beside_an_fx_trace_equals_generate_alone(model, quant):
    m = model if quant == "none" else quantize_model(model, quant)
    prompt = torch.randint(0, m.cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    alone = torch.stack(list(generate(m, prompt, 16)))
    with HeldTrace():
        beside = torch.stack(list(generate(m, prompt, 16)))
    assert torch.equal(beside, alone)


def test_a_chat_reply_beside_an_fx_trace_equals_one_alone(ckpt):
    s = open_session(ckpt, "cpu", max_len=256, compile=None)
    s.set_param("max_tokens", "24")
    alone = list(s.send("Hello!"))[-1].text
    s.new_chat()
    with HeldTrace():
        beside = list(s.send("Hello!"))[-1].text
    assert beside == alone
