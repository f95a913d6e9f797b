"""The CPU kernels' library as a wheel carries it: compiled when the wheel is built (setup.py),
so that a machine with no C++ compiler gets the native step, and a first launch compiles nothing.

Why pinned to one torch, not torch's stable ABI: the library links libtorch's C++ symbols
(at::Tensor, TORCH_LIBRARY, at::parallel_for), and cpu_step.cpp's Step and Sampler are
torch::CustomClassHolder classes (`m.class_`). torch 2.13's stable C ABI (torch/csrc/stable:
STABLE_TORCH_LIBRARY over torch::stable::Tensor) registers ops over stable tensors, but has no
custom classes: one build for a range of torch versions would need the step rewritten as ops
over an opaque handle. So the library serves the one torch release it was built against: the
wheel requires that release (setup.py pins `torch==X.Y.Z`), and it is loaded only under that
release with the same C++ ABI; anything else builds from the sources as a clone does.

Contract:
- `FOLDER`: tinyllm/kernels/_prebuilt/, present only in a wheel built with torch beside it
  (a clone and an editable install have none and build at first use).
- `source_digest(files, flags) -> str`: sha256 of the files' names and contents and the flags:
  what a library was built from (no torch version, Python or compiler in it).
- `mismatch(name, files, flags, folder=FOLDER) -> str | None` (FOLDER as it is at the call):
  why the library `name` in `folder` must not be loaded here (none shipped; another machine, torch release or C++ ABI;
  other sources than `files` and `flags`), one line, or None: `library(name, folder)` fits.
- `write(name, files, flags, library, folder) -> Path`: copy a built `library` of `files` and
  `flags` into `folder` with its manifest (NAME.json: what `mismatch` compares, and the
  compiler and torch build it came from, to read); returns the manifest's path. The library
  does not depend on the Python version (it links no libpython), so the wheel is py3-none.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

FOLDER = Path(__file__).with_name("_prebuilt")


def source_digest(files: Sequence[Path], flags: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    for part in flags:
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def _release(version: str) -> str:
    return version.split("+", 1)[0]  # "2.13.0+cpu" -> "2.13.0": the CPU and CUDA builds of one release


def _here() -> dict[str, object]:
    import torch

    return {"machine": platform.machine(), "torch_release": _release(str(torch.__version__)),
            "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI)}


def library(name: str, folder: Path | None = None) -> Path:
    return (folder or FOLDER) / f"{name}.so"


def mismatch(name: str, files: Sequence[Path], flags: Sequence[str], folder: Path | None = None) -> str | None:
    folder = folder or FOLDER
    try:
        manifest = json.loads((folder / f"{name}.json").read_text())
    except (OSError, ValueError):
        return "no prebuilt library shipped"
    if not library(name, folder).is_file():
        return "no prebuilt library shipped"
    here = _here()
    for key, what in (("machine", "a {} machine"), ("torch_release", "torch {}"), ("cxx11_abi", "C++11 ABI {}")):
        if manifest.get(key) != here[key]:
            return (f"the prebuilt library is for {what.format(manifest.get(key))}, "
                    f"this is {what.format(here[key])}")
    if manifest.get("sources") != source_digest(files, flags):
        return "the prebuilt library was built from other sources than these"
    return None


def write(name: str, files: Sequence[Path], flags: Sequence[str], built: Path, folder: Path) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built, library(name, folder))
    library(name, folder).chmod(0o755)
    try:
        version = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True, text=True)
        compiler = version.stdout.splitlines()[0]
    except (OSError, IndexError):
        compiler = "unknown"
    manifest = {**_here(), "torch": str(torch.__version__), "sources": source_digest(files, flags),
                "compiler": compiler, "files": [p.name for p in files], "flags": list(flags)}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path
