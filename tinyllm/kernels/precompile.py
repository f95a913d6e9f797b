"""Every Triton kernel a step launches, compiled at once on a thread pool before the step first runs (CUDA).

Contract: `ahead(run, threads=None) -> int` calls `run()` once with every Triton launch of this
thread turned into a compile that launches nothing (Triton's warm-up), the compiles spread over
`threads` threads (default: one a core, at most 32) through Triton's own AsyncCompileMode, and
returns once all have finished, with how many kernels it made ready (compiled, or loaded from
Triton's cache on disk); 0, without calling `run`, unless TINYLLM_PRECOMPILE=1, or where this
Triton has no such mode. Off by default: it has not run on a GPU yet (its CUDA test,
tests/tinyllm/test_precompile.py, and `scripts/device_issue50.sh lease8` wait for a lease). Each
lands in its kernel's cache as its launch would have compiled it, so the launches that follow
compile nothing. A compile that fails here is left to its launch, which compiles it again and
fails as it always did: `ahead` changes when kernels compile, never what runs.

`run()` runs with its Triton kernels skipped, so what they would write is not written: the
caller puts back any state the run advanced, and the run must not feed a skipped kernel's
output to anything that checks it on the host. `GraphDecoder.capture` calls it with one plain
step per bucket (a step has no host sync: it is captured in a graph) and puts the decoder's state
back after each, as its warm-ups do.

Why: Triton compiles a kernel the first time a process launches it with new constexprs,
one after another, each holding the next launch up. A cold launch of the app on the default model
spent 14.7 s so (H100, its 16-core host, 2026-12-07). Triton's compiler releases the GIL: two
compiles on two threads took 0.70 s, one after the other 1.40 s (the 2-core CPU, for sm_90).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tinyllm.kernels import switches

_dry = threading.local()  # .on: this thread's Triton launches are warm-ups
_patch_lock = threading.Lock()


def ahead(run: Callable[[], None], threads: int | None = None) -> int:
    """Run `run` with this thread's Triton launches compiled on a pool, not launched; the kernels made ready."""
    if not switches.SWITCHES.precompile:
        return 0
    try:
        from triton.runtime import _async_compile
        from triton.runtime.jit import JITFunction
    except ImportError:  # an older Triton, without the mode: each launch compiles its kernel itself
        return 0
    with _patch_lock, ThreadPoolExecutor(threads or min(32, os.cpu_count() or 1)) as pool:
        launch = JITFunction.run

        def warm_up_here(self, *args, grid, warmup, **kwargs):
            return launch(self, *args, grid=grid, warmup=warmup or getattr(_dry, "on", False), **kwargs)

        mode = _async_compile.AsyncCompileMode(pool, ignore_errors=True)  # a failed compile: its launch's again
        try:
            JITFunction.run, _dry.on = warm_up_here, True
            with mode:  # leaving it waits for every compile and puts each kernel in its cache
                run()
        finally:
            JITFunction.run, _dry.on = launch, False
            if _async_compile.active_mode.get() is mode:  # left early (an interrupt): no compile goes to a closed pool
                _async_compile.active_mode.set(None)
    return sum(f.kernel is not None for f in mode.future_kernels.values())
