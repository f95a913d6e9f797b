"""`Module`: the base of tinyllm's own layers, an `nn.Module` called through the `__call__` torch
had when this file was imported.

Why: FX's tracers (AOTAutograd's among them, inside a background compile) replace
`torch.nn.Module.__call__` for the whole process while they trace. A module that another thread
calls meanwhile (a reply decoding eagerly beside the compile: every step on a CPU, the prefill
on CUDA) went through the tracer and failed with "NameError: module is not installed as a
submodule" (seen in the app on a CPU). A subclass finds its class's own `__call__` first, so the
patch never reaches tinyllm's layers; torch's own layers that a model holds are subclassed with
this one first (tinyllm.core.linear's DenseLinear, DenseEmbedding), so they find it too.
Tested in tests/tinyllm/test_beside_a_trace.py with a trace held open.
"""

from torch import nn


class Module(nn.Module):
    __call__ = nn.Module.__call__
