"""open_any: the one entry point that opens every kind of model tinyllm reads.

  a tinyllm checkpoint folder   config.json with "format": "tinyllm"   checkpoint.py
  a Hugging Face folder         config.json with a "model_type"        hf.py (llama, mistral)
  a GGUF file                   *.gguf (or a folder holding one)       gguf.py (llama)

Contract: `open_any(path, device="cpu", dtype=None, template=None, quant="none",
progress=None) -> LoadedModel(model, tokenizer, template, name)` (a NamedTuple: it unpacks as
the four; the name is tinyllm.model_files.model_name's); `progress(done, total)` hears
each tensor read (tinyllm.build.with_progress); the model is in eval mode on `device` in `dtype` (bf16 on
CUDA, fp32 on the CPU by default); `quant` ("auto", "keep", "none", "int8", "int4") is how
its matrices are held (tinyllm.build; "none", the default, dequantizes; "keep" keeps a GGUF's
or checkpoint's quantized matrices; "auto" too, in the form fastest on the device); the
tokenizer is a `Tokenizer` (sentencepiece) or a `BPETokenizer` (tokenizer.json / GGUF gpt2
vocab), both with the interface ChatSession uses. `template` names a built-in chat template
that overrides the model's own. A tinyllm folder's template is config.json's chat.template,
or the full spec in chat.spec (what `tinyllm.convert` writes for a template taken from Jinja).
`inspect_any(path, template=None) -> name` runs every check open_any runs without reading a
weight (config, tensor names, shapes and types, tokenizer, chat template). `classify(path)`
says which of the three a path is (tinyllm.model_files, which also has the checks a process
without torch can make before its UI opens: `precheck`).
Refuses with one line: a missing path (FileNotFoundError); anything else that is not one of
the three (ValueError), and whatever the importer refuses (unsupported architecture,
missing tokenizer, unknown quantization type).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from tinyllm.build import Progress
from tinyllm.chat_template import ChatTemplate, get_template
from tinyllm.jinja_template import template_from_dict
from tinyllm.model import Transformer
from tinyllm.model_files import classify, named

__all__ = ["LoadedModel", "classify", "inspect_any", "open_any"]


class LoadedModel(NamedTuple):
    """What open_any returns: the model, its tokenizer (`Tokenizer` or `BPETokenizer`), its chat
    template and its display name."""

    model: Transformer
    tokenizer: object
    template: ChatTemplate
    name: str


def inspect_any(path: str | Path, template: str | None = None) -> str:
    """Validate a model without reading its weights (for a CLI, before a UI opens); its name."""
    kind, path = classify(path)
    if kind == "tinyllm":
        from tinyllm.checkpoint import inspect_checkpoint

        info = inspect_checkpoint(path)
        _tinyllm_template(info.chat, template)  # an unknown name or a bad spec fails here, before any UI
    elif kind == "hf":
        from tinyllm.hf import inspect_hf

        inspect_hf(path, template)
    else:
        from tinyllm.gguf import inspect_gguf, read_gguf

        g = read_gguf(path)
        try:
            inspect_gguf(g, template)
        finally:
            g.close()
    return named(kind, path)


def open_any(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
             template: str | None = None, quant: str = "none", group: int = 32,
             progress: Progress | None = None) -> LoadedModel:
    from tinyllm.load_policy import check_quant

    check_quant(quant, group)
    kind, path = classify(path)
    if kind == "tinyllm":
        loaded = _open_tinyllm(path, device, dtype, template, quant, group, progress)
    elif kind == "hf":
        from tinyllm.hf import load_hf

        loaded = load_hf(path, device, dtype, template, quant, group, progress)
    else:
        from tinyllm.gguf import load_gguf

        loaded = load_gguf(path, device, dtype, template, quant, group, progress)
    return LoadedModel(*loaded[:3], named(kind, path))  # the loaders' own names pick templates only


def _open_tinyllm(path: Path, device, dtype, template: str | None, quant: str, group: int,
                  progress: Progress | None):
    from tinyllm.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path, device, dtype, quant, group, progress)
    return ckpt.model, ckpt.tokenizer, _tinyllm_template(ckpt.info.chat, template), ckpt.info.name


def _tinyllm_template(chat: dict, template: str | None) -> ChatTemplate:
    """--template, else config.json's chat.spec, else its chat.template name (ValueError if bad)."""
    if template:
        return get_template(template)
    if isinstance(chat.get("spec"), dict):
        return template_from_dict(chat["spec"])
    return get_template(chat.get("template", "chatml"))
