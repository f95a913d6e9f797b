"""open_any: the one entry point that opens every kind of model tinyllm reads.

  a tinyllm checkpoint folder   config.json with "format": "tinyllm"   checkpoint.py
  a Hugging Face folder         config.json with a "model_type"        hf.py (tinyllm.families)
  a GGUF file                   *.gguf (or a folder holding one)       gguf.py (tinyllm.families)

Contract: `open_any(path, device="cpu", dtype=None, template=None, quant="auto", group=32,
progress=None) -> LoadedModel(model, tokenizer, template, name)` (a NamedTuple: it unpacks as
the four; the name is tinyllm.formats.model_files.model_name's). It classifies the path, runs the
format's `inspect` (every check, no weight read), then tinyllm.formats.model_format.load_model: the
one load rule (tinyllm.formats.load_policy: the dtype, bf16 on CUDA and fp32 on a CPU by default, and
the quant, which tinyllm.formats.quant_rule states: "auto", the default, holds the matrices as is
fastest on the device; "keep" as the file stores them; "none" dense; "int8" / "int4" quantized),
the format's `tensors`, read once, and one build (tinyllm.formats.build). `progress(done, total)`
hears each tensor read (tinyllm.formats.model_format.with_progress); the model is in eval mode on
`device`; the tokenizer is a `Tokenizer` (sentencepiece) or a `BPETokenizer` (tokenizer.json /
GGUF gpt2 vocab), both with the interface ChatSession uses. `template` names a built-in chat
template that overrides the model's own.
`inspect_any(path, template=None) -> name` runs every check open_any runs without reading a
weight (config, tensor names, shapes and types, tokenizer, chat template). `classify(path)`
says which of the three a path is (tinyllm.formats.model_files, which also has the checks a process
without torch can make before its UI opens: `precheck`).
Refuses with one line: a missing path (FileNotFoundError); anything else that is not one of
the three (ValueError), and whatever the format refuses (unsupported architecture, missing
tokenizer, unknown quantization type).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tinyllm.formats.load_policy import check_quant
from tinyllm.formats.model_files import classify, named
from tinyllm.formats.model_format import LoadedModel, ModelFormat, Progress, load_model
from tinyllm.formats.quant_rule import DEFAULT

__all__ = ["LoadedModel", "classify", "format_of", "inspect_any", "open_any"]


def format_of(kind: str) -> ModelFormat:
    """The format module of a kind classify() names (imported on first use)."""
    if kind == "tinyllm":
        from tinyllm.formats import checkpoint as fmt
    elif kind == "hf":
        from tinyllm.formats import hf as fmt
    else:
        from tinyllm.formats import gguf as fmt
    return fmt


def inspect_any(path: str | Path, template: str | None = None) -> str:
    """Validate a model without reading its weights (for a CLI, before a UI opens); its name."""
    kind, path = classify(path)
    with format_of(kind).inspect(path, template):
        pass
    return named(kind, path)


def open_any(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
             template: str | None = None, quant: str = DEFAULT, group: int = 32,
             progress: Progress | None = None) -> LoadedModel:
    check_quant(quant, group)
    kind, path = classify(path)
    fmt = format_of(kind)
    with fmt.inspect(path, template) as spec:
        model = load_model(spec, fmt.tensors, device, dtype, quant, group, progress)
    return LoadedModel(model, spec.tokenizer, spec.template, named(kind, path))
