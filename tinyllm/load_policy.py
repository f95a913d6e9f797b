"""How a model is held where it runs: the device, the dtype and the quantization a load uses.

- `resolve_device(name)`: "auto" | "cpu" | "cuda" -> a device.
- `default_dtype(device, int4)`, `holds_int4(quant, tensors)`: bf16 on CUDA; on a CPU fp32, or
  bf16 for a model holding int4 matrices where the CPU computes bf16 natively (AVX512-BF16 or
  AMX, read from /proc/cpuinfo at run time, `cpu_has_bf16`) and the AVX2 kernel cannot be built.
- `check_quant(quant, group)`: one of QUANTS ("auto", "keep", "none", "int8", "int4"; what
  each means: tinyllm.build) and a supported int4 group size.
- `matrix_dtype(stored, device, dtype, quant)`: the dtype a dense matrix is held in.
Refuses with one line (ValueError): an unknown quant, group or device; CUDA where there is none.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path

import torch

from tinyllm import cpu_qgemv
from tinyllm.model import HALF
from tinyllm.quant import GROUPS, QTensor

QUANTS = ("auto", "keep", "none", "int8", "int4")


def resolve_device(device: str) -> torch.device:
    """"auto" | "cpu" | "cuda" -> a device; a ValueError for CUDA where there is none."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (use --device cpu)")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


@cache
def cpu_has_bf16() -> bool:
    """AVX512-BF16 or AMX-BF16 in /proc/cpuinfo (False where it cannot be read)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def default_dtype(device: torch.device, int4: bool = False) -> torch.dtype:
    """bf16 on CUDA; fp32 on a CPU, except for a model holding int4 matrices on a CPU that
    computes bf16 natively but cannot build the AVX2 kernel (tinyllm.cpu_qgemv): torch's int4
    kernel, its fallback, is fast there in bf16. Measured on a 2-core AVX512-BF16 / AMX CPU
    (docs/BENCHMARKS-LOG.md, eleventh session), compiled, tok/s fp32 against bf16: SmolLM2's Q4_1 at
    W = 128 / 1,024 / 2,048 123 / 82 / 74 against 88 / 61 / 50 (the kernel's prefetch and its
    decode attention); SmolLM2 all int4 109-113 against 104-105; only the 12.6 MB default
    model's Q4_1 ran faster in bf16 at W = 128 (770 against 597), not past it. (In the tenth
    session, before those two, bf16 won for int4 models and was the rule.)"""
    if device.type == "cuda":
        return torch.bfloat16
    if int4 and cpu_has_bf16() and not cpu_qgemv.available():
        return torch.bfloat16
    return torch.float32


def holds_int4(quant: str, tensors: Iterable[torch.Tensor | QTensor]) -> bool:
    """Whether a model loaded with `quant` from these tensors holds int4 matrices (the
    question default_dtype asks)."""
    kept = quant in ("keep", "auto") and any(isinstance(t, QTensor) and t.kind == "int4" for t in tensors)
    return quant == "int4" or kept


def check_quant(quant: str, group: int = 32) -> None:
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")
    if group not in GROUPS:
        raise ValueError(f"int4 group size {group} is not supported: use {' or '.join(map(str, GROUPS))}")


def matrix_dtype(stored: torch.dtype, device: torch.device, dtype: torch.dtype, quant: str) -> torch.dtype:
    """The dtype a dense matrix is held in: as stored where a CPU computes in fp32 from a file's
    bf16 or fp16 matrix and `quant` keeps what the file holds ("auto", "keep"), else the
    activations' `dtype`. Held at 16 bits, a decode step reads half the bytes, widened exactly
    where it is read (tinyllm.model.linear): measured on the 2-core CPU, the default model's
    compiled step 1.27x faster and the app 1.42x (docs/BENCHMARKS-LOG.md). "none" is the fp32
    reference."""
    if device.type == "cpu" and dtype == torch.float32 and quant in ("auto", "keep") and stored in HALF:
        return stored
    return dtype
