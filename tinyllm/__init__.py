"""tinyllm: a small PyTorch library for chatting with local language models.

The front door: the public names by short name, each imported on first use (PEP 562), so
`import tinyllm` costs nothing that a caller does not touch.

    import tinyllm
    session = tinyllm.open_session("models/tinychat", compile="auto")
    for event in session.send("Name three colours."):
        if isinstance(event, tinyllm.Token):
            print(event.text, end="", flush=True)

  open_model(path, device, ...)   any model tinyllm reads -> LoadedModel(model, tokenizer,
                                  template, name)                     (tinyllm.formats.open_model)
  open_session(path, ...)         a model in a ChatSession: turns in, typed events out
  ChatSession                                                          (tinyllm.session.chat)
  Prefilled, Token, Finished      a reply's events, in that order    (tinyllm.session.chat_events)
  generate(model, idx, n, ...)    the eager reference decode          (tinyllm.decode.generate)
  SamplingParams                  temperature, top-k, top-p, ...      (tinyllm.decode.sampling_params)
  GraphDecoder, StaticKVCache, SlotGraphDecoder   the graphed decode step (tinyllm.cuda_graph)
  Engine                          continuous batching                 (tinyllm.decode.engine)
  Transformer, ModelConfig        the one model and its config        (tinyllm.model)
  KVCache, SlotKVCache            the eager and the engine's caches   (tinyllm.kv_cache)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> (module, attribute)
_PUBLIC: dict[str, tuple[str, str]] = {
    "open_model": ("tinyllm.formats.open_model", "open_any"),
    "open_any": ("tinyllm.formats.open_model", "open_any"),
    "LoadedModel": ("tinyllm.formats.model_format", "LoadedModel"),
    "open_session": ("tinyllm.session.chat", "open_session"),
    "ChatSession": ("tinyllm.session.chat", "ChatSession"),
    "Prefilled": ("tinyllm.session.chat_events", "Prefilled"),
    "Token": ("tinyllm.session.chat_events", "Token"),
    "Finished": ("tinyllm.session.chat_events", "Finished"),
    "generate": ("tinyllm.decode.generate", "generate"),
    "SamplingParams": ("tinyllm.decode.sampling_params", "SamplingParams"),
    "GraphDecoder": ("tinyllm.cuda_graph", "GraphDecoder"),
    "StaticKVCache": ("tinyllm.cuda_graph", "StaticKVCache"),
    "SlotGraphDecoder": ("tinyllm.cuda_graph", "SlotGraphDecoder"),
    "Engine": ("tinyllm.decode.engine", "Engine"),
    "Transformer": ("tinyllm.model", "Transformer"),
    "ModelConfig": ("tinyllm.model", "ModelConfig"),
    "KVCache": ("tinyllm.kv_cache", "KVCache"),
    "SlotKVCache": ("tinyllm.kv_cache", "SlotKVCache"),
}

__all__ = ["ChatSession", "Engine", "Finished", "GraphDecoder", "KVCache", "LoadedModel", "ModelConfig",
           "Prefilled", "SamplingParams", "SlotGraphDecoder", "SlotKVCache", "StaticKVCache", "Token",
           "Transformer", "generate", "open_any", "open_model", "open_session"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tinyllm' has no attribute {name!r}")
    module, attr = _PUBLIC[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


if TYPE_CHECKING:  # what type checkers and editors see
    from tinyllm.cuda_graph import GraphDecoder, SlotGraphDecoder, StaticKVCache
    from tinyllm.decode.engine import Engine
    from tinyllm.decode.generate import generate
    from tinyllm.decode.sampling_params import SamplingParams
    from tinyllm.formats.model_format import LoadedModel
    from tinyllm.formats.open_model import open_any
    from tinyllm.formats.open_model import open_any as open_model
    from tinyllm.kv_cache import KVCache, SlotKVCache
    from tinyllm.model import ModelConfig, Transformer
    from tinyllm.session.chat import ChatSession, open_session
    from tinyllm.session.chat_events import Finished, Prefilled, Token
