"""tinyllm.kernels.prebuilt: the CPU kernels' library a wheel carries. Where it fits (this torch
release and C++ ABI, these sources), cpu_qgemv loads it with no compiler and the native step runs
from it; where it does not (another torch, no library, other sources, a library that does not
load), cpu_qgemv builds from the sources as a clone does, or says why not in one line.

The library here is the one this session's build made (cpu_qgemv.available()), written as a
wheel's build writes it (prebuilt.write); .ci/run checks the real wheel the same way."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tinyllm.kernels import cpu_qgemv, kernel_build, prebuilt

ROOT = Path(__file__).resolve().parents[2]
FILES = [*cpu_qgemv.SOURCES, *cpu_qgemv.HEADERS]


def write_prebuilt(folder: Path, library: Path | None = None) -> Path:
    """A prebuilt folder as setup.py writes it, of `library` (default: a file that is no library)."""
    if library is None:
        library = folder.parent / "not_a_library.so"
        library.write_bytes(b"not an ELF file")
    return prebuilt.write(cpu_qgemv.NAME, FILES, cpu_qgemv.prebuilt_flags(), library, folder)


def edit_manifest(manifest: Path, **changes) -> None:
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), **changes}))


@pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")
def test_a_matching_prebuilt_library_loads_with_no_compiler_and_runs_the_native_step(tmp_path):
    built = kernel_build.finished(cpu_qgemv.build_folder())
    assert built is not None
    write_prebuilt(tmp_path / "_prebuilt", built)
    cache = tmp_path / "cache"
    cache.mkdir()
    code = f"""
import sys, warnings
from pathlib import Path
warnings.simplefilter("error")  # the kernel's "is off" warning fails this
import torch
from tinyllm.kernels import cpu_qgemv, prebuilt
prebuilt.FOLDER = Path({str(tmp_path / "_prebuilt")!r})
seen = []
cpu_qgemv.on_build(seen.append)
assert cpu_qgemv.available()
assert [s.state for s in seen] == ["cached"], seen
maps = Path("/proc/self/maps").read_text()
assert str(prebuilt.library(cpu_qgemv.NAME)) in maps, "not loaded from the prebuilt library"
from tests.conftest import tiny_model
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import cpu_step
model = tiny_model(3, dim=128, n_heads=4, n_kv_heads=2, ffn_dim=192)
assert cpu_step.problem(model, 1) is None
dec = GraphDecoder(model, 1, max_len=64, use_graph=False)
step = cpu_step.use_native(dec)
with torch.no_grad():
    dec.prefill(torch.arange(5)[None])
    dec.tok.copy_(torch.tensor([[4]]))  # the first step's input: a fixed id
    dec.run(4)
assert not step.refused and dec.compile == "native", (step.refused, dec.compile)
print("native from the prebuilt library")
"""
    env = {k: v for k, v in os.environ.items() if k != "TINYLLM_CACHE_DIR"}
    env.update(CXX="/nonexistent", XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "native from the prebuilt library" in run.stdout
    assert list(cache.iterdir()) == [], "nothing is built into the cache"


@pytest.fixture
def loads(monkeypatch, tmp_path):
    """cpu_qgemv._load with the prebuilt folder in tmp_path and the build a stand-in: what it
    built ("build") and which libraries torch was asked to load."""
    monkeypatch.setattr(prebuilt, "FOLDER", tmp_path / "_prebuilt")
    seen: list[str] = []
    monkeypatch.setattr(cpu_qgemv, "_build", lambda: seen.append("build"))
    real_load = torch.ops.load_library

    def load_library(path):
        seen.append(str(path))
        return real_load(path)  # only the stand-in file gets here: dlopen refuses it (OSError)

    monkeypatch.setattr(torch.ops, "load_library", load_library)
    monkeypatch.setenv("CXX", sys.executable)  # any program on PATH: "a compiler is there"
    return seen


def test_a_prebuilt_library_for_another_torch_release_is_not_loaded_and_the_sources_build(loads, tmp_path):
    edit_manifest(write_prebuilt(tmp_path / "_prebuilt"), torch_release="2.12.0")
    why = prebuilt.mismatch(cpu_qgemv.NAME, FILES, cpu_qgemv.prebuilt_flags())
    assert why is not None and "torch 2.12.0" in why and f"this is torch {torch.__version__.split('+')[0]}" in why
    assert cpu_qgemv._load() is None and loads == ["build"]


def test_no_prebuilt_library_builds_as_a_clone_does(loads, tmp_path):
    assert prebuilt.mismatch(cpu_qgemv.NAME, FILES, cpu_qgemv.prebuilt_flags()) == "no prebuilt library shipped"
    assert cpu_qgemv._load() is None and loads == ["build"]
    manifest = write_prebuilt(tmp_path / "_prebuilt")
    prebuilt.library(cpu_qgemv.NAME).unlink()  # a manifest without its library
    assert prebuilt.mismatch(cpu_qgemv.NAME, FILES, cpu_qgemv.prebuilt_flags()) == "no prebuilt library shipped"
    assert manifest.is_file()


def test_a_library_of_other_sources_or_abi_is_not_loaded(loads, tmp_path):
    manifest = write_prebuilt(tmp_path / "_prebuilt")
    edited = tmp_path / "cpu_step.cpp"
    edited.write_text(cpu_qgemv.STEP_SOURCE.read_text() + "\n// edited\n")
    assert "other sources" in prebuilt.mismatch(cpu_qgemv.NAME, [edited, *FILES[1:]], cpu_qgemv.prebuilt_flags())
    assert "other sources" in prebuilt.mismatch(cpu_qgemv.NAME, FILES, [*cpu_qgemv.prebuilt_flags(), "-DX"])
    edit_manifest(manifest, cxx11_abi=not torch._C._GLIBCXX_USE_CXX11_ABI)
    assert "C++11 ABI" in prebuilt.mismatch(cpu_qgemv.NAME, FILES, cpu_qgemv.prebuilt_flags())
    assert cpu_qgemv._load() is None and loads == ["build"]


def test_a_prebuilt_library_that_does_not_load_falls_back_to_building(loads, tmp_path):
    write_prebuilt(tmp_path / "_prebuilt")  # it matches, but it is no shared library
    assert prebuilt.mismatch(cpu_qgemv.NAME, FILES, cpu_qgemv.prebuilt_flags()) is None
    assert cpu_qgemv._load() is None
    assert loads == [str(prebuilt.library(cpu_qgemv.NAME)), "build"]


def test_with_no_compiler_and_no_fitting_library_it_says_both(loads, tmp_path, monkeypatch):
    edit_manifest(write_prebuilt(tmp_path / "_prebuilt"), torch_release="2.12.0")
    monkeypatch.setenv("CXX", "/nonexistent")
    why = cpu_qgemv._load()
    assert why is not None and why.startswith("no C++ compiler (/nonexistent) on PATH, and the prebuilt library is for "
                                              "torch 2.12.0"), why
    assert loads == []
