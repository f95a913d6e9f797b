"""The model families tinyllm runs, one module each: everything about a family in one place.

A family is configuration of the one Transformer (tinyllm.model), never a class of its own. Each
module of this package (but family.py, the record) defines `FAMILIES`: its `Family` records (one;
llama.py's two: Llama and Mistral), which say its Hugging Face model_types, its GGUF
architecture, its config mapping both ways, its tensor names both ways, the ModelConfig features
it turns on, and its preset shapes. The readers (tinyllm.formats.hf, gguf_arch, hf_export;
tinyllm.model.PRESETS; the UI's precheck) loop over this registry and name no family. Adding a
family is one module here (and its row in the family tests): the registry finds it.

Contract:
- `FAMILIES`: every record by its name (ModelConfig.family), modules in file-name order.
- `by_model_type(model_type)`, `by_gguf_arch(arch)`: the record that reads it, or None (for
  any value: a hostile config.json's list or number included).
- `MODEL_TYPES`, `GGUF_ARCHS`: every model_type and GGUF architecture read, for messages.
- `PRESETS`: every family's named shapes, each with its family and features filled in.
Imports neither torch nor the model: the UI process reads it (tinyllm.formats.model_files).
"""

from __future__ import annotations

import importlib
import pkgutil

from tinyllm.families.family import Family, Fields

__all__ = ["FAMILIES", "GGUF_ARCHS", "MODEL_TYPES", "PRESETS", "Family", "by_gguf_arch", "by_model_type"]


def _registry() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for module in pkgutil.iter_modules(__path__):
        if module.name == "family":
            continue
        for f in importlib.import_module(f"{__name__}.{module.name}").FAMILIES:
            assert f.name not in found, f"two families are named {f.name!r}"
            found[f.name] = f
    return found


FAMILIES: dict[str, Family] = _registry()
_BY_MODEL_TYPE = {mt: f for f in FAMILIES.values() for mt in f.model_types}
_BY_GGUF_ARCH = {f.gguf_arch: f for f in FAMILIES.values() if f.gguf_arch}
MODEL_TYPES = tuple(_BY_MODEL_TYPE)
GGUF_ARCHS = tuple(_BY_GGUF_ARCH)
PRESETS: dict[str, Fields] = {name: {"family": f.name, **f.features, **shape}
                              for f in FAMILIES.values() for name, shape in f.presets.items()}


def by_model_type(model_type: object) -> Family | None:
    """The family that reads a config.json of this model_type, or None."""
    return _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None


def by_gguf_arch(arch: object) -> Family | None:
    """The family that reads a GGUF file of this general.architecture, or None."""
    return _BY_GGUF_ARCH.get(arch) if isinstance(arch, str) else None
