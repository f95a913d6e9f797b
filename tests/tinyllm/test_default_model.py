"""The shipped default model (models/tinychat): it loads, its config matches its weights, and
it answers in its own chat template."""

from pathlib import Path

from tinyllm.chat import open_session
from tinyllm.checkpoint import inspect_checkpoint, load_checkpoint

MODEL = Path(__file__).resolve().parents[2] / "models" / "tinychat"


def test_shipped_checkpoint_is_valid_and_within_limits():
    info = inspect_checkpoint(MODEL)  # config vs every tensor's shape, tokenizer vs vocabulary
    assert info.n_params <= 50_000_000
    size = sum(f.stat().st_size for f in MODEL.iterdir())
    assert size <= 64 * 2**20
    assert all(f.stat().st_size <= 15 * 2**20 for f in info.weight_files)
    assert info.chat["template"] == "chatml"
    ckpt = load_checkpoint(MODEL)
    assert ckpt.model.num_params() == info.n_params
    assert ckpt.tokenizer.piece_to_id("<|im_end|>") is not None
    assert len(ckpt.tokenizer.encode("<|im_start|>user\n")) == 3  # marker, "user", newline


def test_greedy_reply_to_hello_ends_at_end_of_turn():
    session = open_session(MODEL, "cpu", compile=None)
    events = list(session.send("Hello!"))
    finished = events[-1]
    assert finished.reason == "eos"  # it closed its turn with <|im_end|> ...
    assert finished.text.strip()  # ... after some text
    assert "<|im_end|>" not in finished.text and "<|im_start|>" not in finished.text
    assert session.messages[-1].ids[-2:] == session.encode("<|im_end|>\n")
