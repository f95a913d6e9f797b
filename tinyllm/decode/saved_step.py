"""The compiled decode step saved to disk, so that a relaunch loads it instead of tracing it.

Why: torch.compile's on-disk caches (Inductor's, AOTAutograd's) spare a relaunch the code
generation, but not Dynamo's trace of the step, which runs again in the session's process and
holds its GIL. Measured on the 2-core CPU (docs/BENCHMARKS-LOG.md): a warm relaunch
of the app had the compiled step 17 s after launch, and the first reply meanwhile ran at
9 tok/s; loading a saved step took 3-5 s, most of it importing torch's compiler.

Contract:
- `decode_step(dec, window)`: the step as a function of its decoder (`dec.plain_step(window)`),
  which is what gets compiled and saved: the saved code reads the decoder it is given.
- `build(dec, window, backend, options) -> fn`: torch 2.13's `torch.compile(...).aot_compile`
  of decode_step for `dec` (whole graph, dynamic sizes: one step serves every window).
- `build_and_save(...)`: both, or None where the step cannot be built ahead of time (the caller
  compiles it the usual way: nothing fails for want of a saved step).
- `save(fn, path)` / `load(path) -> fn | None`: None where the file is missing or cannot be
  loaded (a torch that changed, a truncated file: the file is removed, and the caller
  compiles anew). The caller keys the path on everything the step depends on
  (compile_child.marker: the spec, torch's version, the model files, tinyllm's sources).
- `SavedStep(fn, dec, fallback)`: the decoder's step function `(window) -> logits`. A loaded
  step checks its guards on every call, as Dynamo's would, but refuses rather than
  recompiling: where they refuse, the step becomes `fallback()` (the traced step) from then
  on, so a call never fails on it.
- `supported()`: torch has the API (2.13 here; torch 2.11, on the device, lacks `aot_compile`: there a
  session compiles the usual way. CUDA sessions use it only under TINYLLM_CUDA_SAVED_STEP=1:
  background_compile).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor


def decode_step(dec, window: int) -> Tensor:
    return dec.plain_step(window)


@functools.cache
def supported() -> bool:
    """torch has both halves of the API: `load_compiled_function`, and `aot_compile` on what
    torch.compile returns (torch 2.11, the device's, has the first only: its build failed)."""
    return hasattr(torch.compiler, "load_compiled_function") and hasattr(torch.compile(decode_step), "aot_compile")


def build(dec, window: int, backend: str, options: dict | None):
    step = torch.compile(decode_step, backend=backend, fullgraph=True, dynamic=True, options=options)
    with torch.no_grad():
        return step.aot_compile(((dec, window), {}))


def save(fn, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fn.save_compiled_function(str(path))  # written whole, then renamed into place


def build_and_save(dec, window: int, backend: str, options: dict | None, path: Path):
    """build() then save(); None, with one line on stderr, where the step cannot be compiled
    ahead of time (the caller then traces it the usual way). A step built but not saved is
    still returned."""
    fn = None
    try:
        fn = build(dec, window, backend, options)
        save(fn, path)
    except Exception as e:
        print(f"tinyllm: the step is not saved ({type(e).__name__}: {str(e).strip()[:200]})", file=sys.stderr)
    return fn


def load(path: Path):
    if not path.exists():
        return None
    try:
        with open(path, "rb") as f:
            return torch.compiler.load_compiled_function(f)
    except Exception:  # stale or damaged: compile anew (and save over it)
        path.unlink(missing_ok=True)
        return None


class SavedStep:
    def __init__(self, fn, dec, fallback: Callable[[], Callable[[int], Tensor]]):
        self.fn, self.dec, self._fallback = fn, dec, fallback
        fn.disable_guard_check()  # checked here instead, once a call
        self._step: Callable[[int], Tensor] | None = None  # the fallback, once guards refused

    def __call__(self, window: int) -> Tensor:
        if self._step is None:
            if self.fn.guard_check(self.dec, window):
                return self.fn(self.dec, window)
            self._step = self._fallback()
        return self._step(window)
