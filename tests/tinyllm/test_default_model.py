"""The shipped default model (models/tinychat): within its size limits, its config matches its
weights, its tokenizer is sentencepiece, and at the shipped quantization it answers in its own
chat template and knows a few plain facts."""

from pathlib import Path

import pytest

from tinyllm.core.quant_linear import QuantEmbedding, QuantLinear
from tinyllm.formats.checkpoint import inspect_checkpoint
from tinyllm.session.chat import open_session
from tinyllm.text.tokenizer import Tokenizer

MODEL = Path(__file__).resolve().parents[2] / "models" / "tinychat"
# Greedy, the app's defaults; each answer was checked against the teacher's (model card).
FACTS = [("What is the capital of France?", "paris"), ("What is the capital of Japan?", "tokyo"),
         ("What is the largest ocean on Earth?", "pacific")]


@pytest.fixture(scope="module")
def session():
    return open_session(MODEL, "cpu", compile=None, quant="auto")  # the app's default


def test_shipped_checkpoint_is_valid_and_within_limits():
    info = inspect_checkpoint(MODEL)  # config vs every tensor's shape, tokenizer vs vocabulary
    weights = sum(f.stat().st_size for f in info.weight_files)
    assert weights <= 80e6, f"{weights / 1e6:.1f} MB of weights, over 80 MB"
    assert all(f.stat().st_size <= 15 * 2**20 for f in info.weight_files)
    assert info.chat["template"] == "chatml"
    tok = Tokenizer.load(MODEL / "tokenizer.model")  # sentencepiece, not a BPE tokenizer.json
    assert not (MODEL / "tokenizer.json").exists() and tok.vocab_size == info.config.vocab_size
    assert [len(tok.encode(p)) for p in ("<|im_start|>", "<|im_end|>")] == [1, 1]


def test_matrices_are_held_quantized_as_shipped(session):
    model = session.model
    assert isinstance(model.tok_emb, QuantEmbedding) and isinstance(model.lm_head, QuantLinear)
    kinds = {m.kind for m in model.modules() if isinstance(m, QuantLinear)}
    assert kinds == {"int4", "int8"}  # int4 body, a few sensitive layers int8 (the card's table)


def test_greedy_reply_to_hello_ends_at_end_of_turn(session):
    session.new_chat()
    finished = list(session.send("Hello!"))[-1]
    assert finished.reason == "eos"  # it closed its turn with <|im_end|> ...
    assert finished.text.strip()  # ... after some text
    assert "<|im_end|>" not in finished.text and "<|im_start|>" not in finished.text
    assert session.messages[-1].ids[-2:] == session.encode("<|im_end|>\n")


@pytest.mark.parametrize("question,answer", FACTS)
def test_greedy_replies_hold_plain_facts(session, question, answer):
    session.new_chat()
    finished = list(session.send(question))[-1]
    assert finished.reason == "eos" and answer in finished.text.lower(), finished.text


def test_the_middle_layers_are_the_teachers_bit_for_bit():
    """The card's claim: layers 1-25 were never trained, and int4 gave the teacher's Q4_1 back."""
    import torch

    from tests.tinyllm.test_real_model import find_smollm2
    from tinyllm.formats.checkpoint import load_checkpoint
    from tinyllm.formats.open_model import open_any

    gguf = find_smollm2()
    if gguf is None:
        pytest.skip("no SmolLM2 GGUF here (.ci/run fetches it)")
    ours = load_checkpoint(MODEL, quant="none", dtype=torch.float32).model.state_dict()
    teacher = open_any(gguf, quant="none", dtype=torch.float32)[0].state_dict()
    middle = [k for k in ours if k.startswith("blocks.") and 1 <= int(k.split(".")[1]) <= 25
              and ours[k].dim() == 2]
    assert len(middle) == 25 * 7
    assert all(torch.equal(ours[k], teacher[k]) for k in middle)
    assert not torch.equal(ours["blocks.0.attn.wq.weight"], teacher["blocks.0.attn.wq.weight"])  # trained
