"""What pyproject.toml cannot say: a wheel built where torch is importable carries the CPU kernels
prebuilt, and then requires the torch release they were built against.

    pip wheel --no-build-isolation --no-deps -w dist .   (from a venv with torch: .ci/run)

- build_py compiles tinyllm/kernels/cpu_*.cpp with the flags a first launch uses
  (tinyllm.kernels.cpu_qgemv: kernel_build.ensure_built in build/, then prebuilt.write) into
  build/lib/tinyllm/kernels/_prebuilt/, where the wheel picks it up; the wheel is then tagged
  py3-none-<platform> (the library links no libpython) and requires `torch==<that release>`
  (tinyllm.kernels.prebuilt says why pinned, not torch's stable ABI).
- Where torch cannot be imported (pip's default isolated build: `pip install .`, `pip wheel .`),
  the machine is not x86-64 Linux, there is no compiler, or TINYLLM_PREBUILT=0: nothing is
  compiled, the wheel is pure and requires torch>=2.4, and the kernels build at first use.
  TINYLLM_PREBUILT=1 makes a wheel without them an error instead (.ci/run sets it).
- Editable installs (`pip install -e`, README's setup) compile nothing here: the kernels build
  at first use into the user cache, as in a clone.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
DEPENDENCIES = [
    "sentencepiece>=0.2",
    "safetensors>=0.4",
    "numpy",  # safetensors.torch.save_file needs it (0.8)
    "textual>=1.0",
    "platformdirs>=4",
    # GGUF and Hugging Face models open from a plain install (tokenizer.json / GGUF gpt2
    # vocabularies, Jinja chat templates): both small, neither pulls torch.
    "tokenizers>=0.15",
    "jinja2>=3.1",
    # --model hf:OWNER/REPO: the Hub's own download, cache, resume and progress (tinyllm.formats.hub).
    "huggingface_hub>=0.34",
    # --model http(s)://HOST:PORT/v1, an OpenAI-compatible server (chat_app.server_api): httpx and the
    # maintained SSE parser httpx-sse, rather than the openai package, which pulls pydantic and more
    # for the one streamed call the app makes. Neither imports torch.
    "httpx>=0.27",
    "httpx-sse>=0.4",
]


def prebuilt_refused() -> str | None:
    """Why this build compiles no kernels into the wheel, or None."""
    if os.environ.get("TINYLLM_PREBUILT") == "0":
        return "TINYLLM_PREBUILT=0"
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"{sys.platform} {platform.machine()} (prebuilt for x86-64 Linux only)"
    if importlib.util.find_spec("torch") is None:
        return "torch cannot be imported here (an isolated build: pip --no-build-isolation from a venv with torch)"
    if not shutil.which(os.environ.get("CXX", "c++")):
        return "no C++ compiler"
    return None


REFUSED = prebuilt_refused()
if REFUSED is not None and os.environ.get("TINYLLM_PREBUILT") == "1":
    raise SystemExit(f"TINYLLM_PREBUILT=1, but the CPU kernels cannot be prebuilt: {REFUSED}")


def torch_requirement() -> str:
    if REFUSED is not None:
        return "torch>=2.4"
    import torch

    return f"torch=={str(torch.__version__).split('+', 1)[0]}"  # the release the library links against


class BuildPyWithKernels(build_py):
    def run(self) -> None:
        super().run()
        if REFUSED is not None or self.editable_mode:
            print(f"tinyllm: no prebuilt CPU kernels in this build ({REFUSED or 'editable install'}); "
                  "they build at first use")
            return
        sys.path.insert(0, str(HERE))  # this tree's tinyllm, not an installed one
        from tinyllm.kernels import cpu_qgemv, kernel_build, prebuilt

        files = [*cpu_qgemv.SOURCES, *cpu_qgemv.HEADERS]
        build = kernel_build.ensure_built(cpu_qgemv.NAME, cpu_qgemv.SOURCES, cpu_qgemv.HEADERS,
                                          (cpu_qgemv.CFLAGS, cpu_qgemv.LDFLAGS), HERE / "build" / "kernels")
        out = Path(self.build_lib) / "tinyllm" / "kernels" / prebuilt.FOLDER.name
        manifest = prebuilt.write(cpu_qgemv.NAME, files, cpu_qgemv.prebuilt_flags(), build.library, out)
        print(f"tinyllm: prebuilt CPU kernels in {out} ({manifest.read_text().strip()})")


class DistributionWithKernels(Distribution):
    def has_ext_modules(self) -> bool:  # a platform wheel, its files at the root (platlib), not .data/purelib
        return REFUSED is None


class WheelForPlatform(bdist_wheel):
    def get_tag(self) -> tuple[str, str, str]:
        python, abi, plat = super().get_tag()
        return (python, abi, plat) if REFUSED is not None else ("py3", "none", plat)


setup(install_requires=[torch_requirement(), *DEPENDENCIES],
      cmdclass={"build_py": BuildPyWithKernels, "bdist_wheel": WheelForPlatform}, distclass=DistributionWithKernels)
