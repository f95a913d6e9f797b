"""The decode step compiled once on a scratch decoder, at the lowest CPU priority: the piece that
the background compile thread (tinyllm.decode.background_compile) and the compile child process
(tinyllm.decode.compile_child) both run, kept below both so neither imports the other.

Contract:
- `compile_step(model, batch, max_len, backend, n_valid, greedy, save_to=None)`: a scratch
  `GraphDecoder` (its own small cache, never the live one) runs the step once with the sampler
  variant asked for, which traces and compiles it. With `save_to`, the step is compiled ahead of
  time and saved there (tinyllm.decode.saved_step) and returned; else torch.compile keeps it on the
  step's code and this returns None.
- `lower_priority()`: the calling thread, and the compiler processes it starts, at the lowest
  CPU priority (Linux); elsewhere nothing.
"""

from __future__ import annotations

import os
import threading
from contextlib import nullcontext
from pathlib import Path

import torch

from tinyllm.cuda_graph import GraphDecoder, prepare_compile
from tinyllm.decode import saved_step
from tinyllm.model import Transformer


def compile_step(model: Transformer, batch: int, max_len: int, backend: str, n_valid: int | None,
                 greedy: bool, save_to: Path | None = None):
    """Compile the step: a scratch decoder (its own small cache) runs it once. With `save_to`,
    compiled ahead of time and saved there (tinyllm.decode.saved_step); returns that step, else None."""
    stream = torch.cuda.Stream() if model.device.type == "cuda" else None
    with torch.no_grad(), torch.cuda.stream(stream) if stream else nullcontext():
        dec = GraphDecoder(model, batch, max_len=max_len, use_graph=False,
                           compile=backend if save_to is None else None, n_valid=n_valid)
        dec.greedy = greedy
        dec.prefill(torch.zeros(batch, 1, dtype=torch.long, device=model.device))
        dec.tok.zero_()  # the warm-up step's input: any token
        fn = None
        if save_to is not None:
            fn = saved_step.build_and_save(dec, dec.bucket(dec.cache.keys_needed(1)), backend,
                                           prepare_compile(backend, model), save_to)
            dec.set_compile(backend, fn)  # run once as a loaded step runs (traced, where fn is None)
        dec.run(1)
        if stream is not None:
            stream.synchronize()
        return fn


def lower_priority() -> None:
    """Run this thread (and the compiler processes it starts, which inherit it) at the lowest
    CPU priority, so the replies decoding meanwhile keep the cores. Linux sets priority per
    thread; elsewhere this does nothing."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
