"""The skeleton every model format follows, and the one load that runs it.

A format is a module with two functions (the `ModelFormat` protocol): tinyllm.formats.checkpoint
(tinyllm folders), tinyllm.formats.hf (Hugging Face folders), tinyllm.formats.gguf (GGUF files); none imports
another, and each hands its tensors down to tinyllm.formats.build.
- `inspect(path, template=None) -> ModelSpec`: every check that reads no weight (the config;
  each tensor's name, shape and type against it; the tokenizer against the vocabulary; the
  chat template, `template` naming a built-in that overrides the model's own). The spec is a
  context manager: leaving it closes what `inspect` opened (a GGUF file's map).
- `tensors(spec, quant, dtype, progress=None) -> {tinyllm name: tensor or QTensor}`: the
  weights under tinyllm's names (separate attn.wq/wk/wv, ffn.w1/w3): dense ones as stored,
  quantized ones as QTensors in the forms `spec.stored` names. `quant` is resolved (never
  "auto"): under "none" a format whose matrices are not QTensors in memory (GGUF blocks)
  reads them dequantized, in `dtype`; any other format may ignore both. Each tensor read is
  told to `progress(done, total)` (`with_progress`).
`load_model(spec, tensors, device, dtype=None, quant=DEFAULT, group=32, progress=None) ->
Transformer`: the load policy (tinyllm.formats.load_policy.holding: the dtype and the quant, one rule,
from the forms the file stores), the tensors read once, the model built once (tinyllm.formats.build),
in eval mode on `device`.
`LoadedModel(model, tokenizer, template, name)`: what open_any and load_hf / load_gguf return.
`with_progress(items, progress)`: the items in order, telling `progress(done, total)` (0, total)
before the first and (done, total) after each, from the loading thread (a UI shows it as a
determinate bar).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

import torch

from tinyllm.core.quant import QTensor
from tinyllm.formats.build import build_transformer
from tinyllm.formats.load_policy import check_quant, holding
from tinyllm.formats.quant_rule import DEFAULT
from tinyllm.model import ModelConfig, Transformer
from tinyllm.text.chat_template import ChatTemplate

if TYPE_CHECKING:
    from tinyllm.text.bpe_tokenizer import BPETokenizer
    from tinyllm.text.tokenizer import Tokenizer

__all__ = ["LoadedModel", "ModelFormat", "ModelSpec", "Progress", "Tensors", "load_model", "with_progress"]

Progress = Callable[[int, int], None]  # progress(tensors read, tensors in all)
Tensors = dict[str, torch.Tensor | QTensor]
T = TypeVar("T")


@dataclass
class ModelSpec:
    """What a format's `inspect` found: everything but the weights."""
    path: Path  # the folder or file
    config: ModelConfig
    tokenizer: Tokenizer | BPETokenizer
    template: ChatTemplate
    name: str  # the model's own metadata name (built-in template guesses read it)
    stored: frozenset[str]  # the quantized forms among its matrices: "int8", "int4"
    source: object = field(default=None, repr=False)  # what the format's `tensors` reads (its own)
    close: Callable[[], None] = field(default=lambda: None, repr=False)

    def __enter__(self) -> ModelSpec:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ModelFormat(Protocol):
    """A format module: checkpoint.py, hf.py, gguf.py."""

    def inspect(self, path: Path, template: str | None = None) -> ModelSpec: ...

    def tensors(self, spec: ModelSpec, quant: str, dtype: torch.dtype,
                progress: Progress | None = None) -> Tensors: ...


class LoadedModel(NamedTuple):
    """A loaded model: the model, its tokenizer (`Tokenizer` or `BPETokenizer`), its chat
    template and its name (a NamedTuple: it unpacks as the four)."""

    model: Transformer
    tokenizer: Tokenizer | BPETokenizer
    template: ChatTemplate
    name: str


def load_model(spec: ModelSpec, tensors: Callable[..., Tensors], device: str | torch.device = "cpu",
               dtype: torch.dtype | None = None, quant: str = DEFAULT, group: int = 32,
               progress: Progress | None = None) -> Transformer:
    """Policy, tensors, build (the module docstring); `tensors` is the spec's format's."""
    check_quant(quant, group)
    device = torch.device(device)
    hold = holding(device, quant, spec.stored, dtype)
    state = tensors(spec, hold.quant, hold.dtype, progress)
    return build_transformer(spec.config, state, device, hold.dtype, quant, group)


def with_progress(items: Sequence[T], progress: Progress | None) -> Iterator[T]:
    """The items in order, telling `progress(done, total)` before the first and after each."""
    if progress is not None:
        progress(0, len(items))
    for done, item in enumerate(items, 1):
        yield item
        if progress is not None:
            progress(done, len(items))
