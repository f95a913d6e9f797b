"""Triton's interpreter as the CPU tests use it (TRITON_INTERPRET=1, in a child process).

`fix_numpy_index()`: Triton 3.6's interpreter turns a scalar tensor into a Python int with
`int(ndarray)` (a loop bound such as `range(first, last)` of two scalars); NumPy 2.4 refuses that
for a 1-element array of one dimension ("only 0-dimensional arrays can be converted to Python
scalars"), so every kernel with such a loop failed under the interpreter. This patches the
interpreter's `__index__` to take the element itself; nothing else changes. Call it in the child
before the first launch.

`interpreted` and `compiled`: the skip marks of a kernel's interpreter test (Triton installed, no
CUDA: on a CUDA machine its CUDA test runs the kernel) and of its sm_90 compile test (Triton).
"""

import importlib.util

import numpy as np
import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
interpreted = pytest.mark.skipif(not HAS_TRITON or torch.cuda.is_available(),
                                 reason="needs triton (its interpreter); on a CUDA machine the CUDA test runs the kernel")
compiled = pytest.mark.skipif(not HAS_TRITON, reason="needs triton (its compiler)")


def fix_numpy_index() -> None:
    from triton.runtime import interpreter

    set_attr = interpreter._LangPatchScope.set_attr
    if getattr(set_attr, "_fixed", False):
        return

    def patched(self, obj, name, value):
        if name == "__index__":
            def value(t):
                return int(np.asarray(t.handle.data).reshape(-1)[0])
        set_attr(self, obj, name, value)

    patched._fixed = True
    interpreter._LangPatchScope.set_attr = patched


def run_interpreted(script: str, timeout: float = 600):
    """`script` (Python source) in a child process under Triton's interpreter, fix_numpy_index()
    applied first, from the repo's root: the CompletedProcess (stdout and stderr as text)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = "from tests.triton_interpreter import fix_numpy_index\nfix_numpy_index()\n" + script
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def sm90_ptx(fn, signature: dict, constexprs: dict, **options) -> str:
    """The PTX Triton compiles `fn` to for sm_90 (an H100 / H200), with no GPU: signature
    {arg: "*bf16" | "i32" | "constexpr" ...}, the constexprs' values, compile options (num_warps...)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    return triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                          options=options).asm["ptx"]
