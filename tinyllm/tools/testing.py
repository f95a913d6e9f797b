"""Small real parts for tests and demos: a sentencepiece model trained on a few lines of chat
text and a tiny random-weight checkpoint folder (real safetensors, real tokenizer.model).

`make_tiny_checkpoint(path)` writes a checkpoint that `load_checkpoint` and `tinyllm-chat
--model` open; its replies are noise (random weights), but every code path is real.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tinyllm.model import ModelConfig, Transformer
from tinyllm.text.tokenizer import Tokenizer, train_sentencepiece

CHAT_TEXT = """Hello! How are you today? I am fine, thank you.
What is the capital of France? The capital of France is Paris.
Tell me a joke about computers. Why did the computer go to the doctor? It had a virus.
Can you write a short poem about the sea? The sea is wide, the sea is deep.
Numbers: 1 2 3 4 5 6 7 8 9 10, and 2026 is a year.
Café, naïve, Zürich, über, señor. 日本語のテキスト。中文。🙂🚀
Markdown: **bold**, *italic*, `code`, - a list item, # a heading.
"""


def make_tiny_tokenizer(path: str | Path, vocab_size: int = 512) -> Tokenizer:
    lines = [line for line in CHAT_TEXT.splitlines() if line] * 20
    model = train_sentencepiece(lines, Path(path) / "tiny_sp", vocab_size,
                                special_pieces=["<|im_start|>", "<|im_end|>"])
    return Tokenizer.load(model)


def make_tiny_checkpoint(path: str | Path, seed: int = 0, max_seq_len: int = 512, **overrides) -> Path:
    from tinyllm.formats.checkpoint import save_checkpoint

    path = Path(path)
    tok = make_tiny_tokenizer(path.parent / (path.name + "_tok"))
    cfg = ModelConfig.from_name("tiny", vocab_size=tok.vocab_size, max_seq_len=max_seq_len, **overrides)
    torch.manual_seed(seed)
    model = Transformer(cfg).init_weights(seed)
    return save_checkpoint(model, tok, path, name="tiny-test", chat={"template": "chatml"})
