"""tinyllm.families is complete: every module registered, every record filled, no name claimed
twice, every model_type and GGUF architecture maps back to its family, each family's tensor
tables name each of the model's tensors exactly once (Hugging Face's and llama.cpp's), each
preset carries its family's features and exports to a config.json that reads back as itself,
and the readers hold no family's name. (test_families.py and test_gguf_families.py check each
family's numbers against transformers and llama.cpp's converter.)
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import tinyllm.families as families
from tinyllm.families import FAMILIES, GGUF_ARCHS, MODEL_TYPES, PRESETS, Family, by_gguf_arch, by_model_type
from tinyllm.families.family import GGUF_FIXED, HF_FIXED
from tinyllm.formats.hf_export import hf_config_json
from tinyllm.formats.tensor_checks import expected_shapes
from tinyllm.model import PRESETS as MODEL_PRESETS
from tinyllm.model import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
READERS = ("tinyllm/formats/hf.py", "tinyllm/formats/gguf_arch.py", "tinyllm/formats/hf_export.py")


def test_every_module_is_registered_in_file_order():
    modules = [m.name for m in pkgutil.iter_modules(families.__path__) if m.name != "family"]
    records = [f for m in modules for f in importlib.import_module(f"tinyllm.families.{m}").FAMILIES]
    assert records == list(FAMILIES.values()) and all(isinstance(f, Family) for f in records)
    assert len(records) >= 7  # llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3


@pytest.mark.parametrize("name", FAMILIES)
def test_each_record_is_filled_and_maps_back(name):
    f = FAMILIES[name]
    assert f.name == name and f.model_types and all(isinstance(mt, str) and mt for mt in f.model_types)
    assert f.hf_class.endswith("ForCausalLM")
    assert all(callable(fn) for fn in (f.from_hf, f.to_hf, f.from_gguf, f.hf_text_config))
    assert set(f.features) <= {fd.name for fd in dataclasses.fields(ModelConfig)}, "features are ModelConfig fields"
    assert f.hf_tensors and f.gguf_tensors
    assert f.presets or not f.gguf_arch, "a family with a GGUF architecture of its own has a preset"
    assert all(by_model_type(mt) is f for mt in f.model_types)
    assert not f.gguf_arch or by_gguf_arch(f.gguf_arch) is f


def test_no_name_is_claimed_twice_and_strangers_map_to_none():
    assert len(MODEL_TYPES) == sum(len(f.model_types) for f in FAMILIES.values())
    assert len(GGUF_ARCHS) == sum(bool(f.gguf_arch) for f in FAMILIES.values())
    assert len(PRESETS) == sum(len(f.presets) for f in FAMILIES.values())
    assert all(MODEL_PRESETS[k] == v for k, v in PRESETS.items()), "tinyllm.model.PRESETS holds every family's"
    for stranger in ("mixtral", "", None, ["llama"], {"llama": 1}, 3):
        assert by_model_type(stranger) is None and by_gguf_arch(stranger) is None


def small(f: Family) -> ModelConfig:
    return ModelConfig(family=f.name, vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                       **f.features)


def parts(tl: str | tuple[str, ...]) -> tuple[str, ...]:
    return tl if isinstance(tl, tuple) else (tl,)


@pytest.mark.parametrize("name", FAMILIES)
def test_tensor_tables_name_each_model_tensor_once(name):
    f = FAMILIES[name]
    want = set(expected_shapes(small(f)))  # untied: lm_head too
    layer = sorted(k.removeprefix("blocks.0.") for k in want if k.startswith("blocks.0."))
    assert sorted(p for tl in f.hf_tensors.values() for p in parts(tl)) == layer
    assert set(HF_FIXED.values()) == set(GGUF_FIXED.values()) == {k for k in want if not k.startswith("blocks.")}
    gguf = {p for tl in f.gguf_tensors.values() for p in parts(tl)}  # llama.cpp's names drop .weight / .bias
    assert {k.rsplit(".", 1)[0] for k in layer} == gguf


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_has_its_features_and_a_hugging_face_form(preset):
    cfg = ModelConfig.from_name(preset)
    f = FAMILIES[cfg.family]
    assert all(getattr(cfg, k) == v for k, v in f.features.items())
    raw = hf_config_json(cfg, SimpleNamespace(bos_id=1, eos_id=2, pad_id=None))  # refuses one that reads back wrong
    assert (raw["model_type"], raw["architectures"]) == (f.model_types[0], [f.hf_class])


def test_the_readers_name_no_family():
    names = set(FAMILIES) | set(MODEL_TYPES) | set(GGUF_ARCHS) | {f.hf_class for f in FAMILIES.values()}
    for path in READERS:
        tree = ast.parse((ROOT / path).read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(
            n, ast.Module | ast.FunctionDef | ast.ClassDef) and n.body and isinstance(n.body[0], ast.Expr)}
        found = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and id(n) not in docstrings and n.value in names}
        assert not found, f"{path} names {sorted(found)}: say it in the family's module (tinyllm/families)"
