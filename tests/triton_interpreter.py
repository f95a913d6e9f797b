"""Triton's interpreter as the CPU tests use it (TRITON_INTERPRET=1, in a child process).

`fix_numpy_index()`: Triton 3.6's interpreter turns a scalar tensor into a Python int with
`int(ndarray)` (a loop bound such as `range(first, last)` of two scalars); NumPy 2.4 refuses that
for a 1-element array of one dimension ("only 0-dimensional arrays can be converted to Python
scalars"), so every kernel with such a loop failed under the interpreter. This patches the
interpreter's `__index__` to take the element itself; nothing else changes. Call it in the child
before the first launch.
"""

import numpy as np


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
