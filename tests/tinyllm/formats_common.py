"""What the Hugging Face and GGUF importer tests share: optional packages, SmolLM2's chat
template, and texts every tokenizer must round-trip."""

import importlib
import os

import pytest

from tinyllm.tools.testing import CHAT_TEXT


def need(module: str):
    """CI installs the extras (CI=true): there a missing package fails; elsewhere it skips."""
    return importlib.import_module(module) if os.environ.get("CI") else pytest.importorskip(module)


SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXTS = ["Hello! How are you today?", "What is the capital of France? 12345 apples.",
         "<|im_start|>user\nCafé, naïve, 日本語 🙂<|im_end|>\n", "  spaces   and\ttabs\n\n",
         "x<|im_end|>y"]


def train_bpe():
    """A small byte-level BPE (GPT-2 style) with ChatML specials, trained on CHAT_TEXT."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CHAT_TEXT.splitlines() * 5, trainer)
    return tok
