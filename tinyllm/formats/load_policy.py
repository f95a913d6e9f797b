"""How a model is held where it runs: the device, the dtype and the quantization a load uses.
One rule for every format; tinyllm.formats.quant_rule holds its table (and every --help's words).

- `resolve_device(name)`: "auto" | "cpu" | "cuda" -> a device.
- `holding(device, quant, stored, dtype=None) -> Holding(quant, dtype, int4_as)`: the rule a
  load follows, decided before a weight is read from the forms its file stores (`stored`,
  a set of "int8" / "int4"; `stored_forms(tensors)` for tensors in memory). `quant` "auto"
  becomes what quant_rule.auto_quant says for the device (`resolve_quant`: "keep" on CUDA where
  Triton's kernels are there, tinyllm.kernels.qgemv.available(), else "none"; "keep" on a CPU;
  a kept file's dense matrices in `matrix_dtype`'s dtype, bf16 on CUDA); the dtype is `dtype`,
  else `default_dtype(device, holds_int4(...))`; `int4_as` is
  "int8" under "auto" on a CPU computing in fp32 where fbgemm is there and the AVX2 kernel
  (tinyllm.kernels.cpu_qgemv) cannot be built (fbgemm's int8 kernel is then the fast one), else "int4".
- `default_dtype(device, int4)`, `holds_int4(quant, stored)`: bf16 on CUDA; on a CPU fp32, or
  bf16 for a model holding int4 matrices where the CPU computes bf16 natively (AVX512-BF16 or
  AMX, read from /proc/cpuinfo at run time, `cpu_has_bf16`) and the AVX2 kernel cannot be built.
- `check_quant(quant, group)`: one of QUANTS and a supported int4 group size.
- `matrix_dtype(stored, device, dtype, quant)`: the dtype a dense matrix is held in.
Refuses with one line (ValueError): an unknown quant, group or device; CUDA where there is none.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from tinyllm.core.linear import HALF
from tinyllm.core.quant import GROUPS, QTensor, fbgemm_available
from tinyllm.formats.quant_rule import QUANTS, auto_quant
from tinyllm.kernels import cpu_qgemv, qgemv

__all__ = ["QUANTS", "Holding", "check_quant", "cpu_has_bf16", "default_dtype", "holding", "holds_int4",
           "matrix_dtype", "resolve_device", "resolve_quant", "stored_forms"]


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
    computes bf16 natively but cannot build the AVX2 kernel (tinyllm.kernels.cpu_qgemv): torch's int4
    kernel, its fallback, is fast there in bf16. Measured on a 2-core AVX512-BF16 / AMX CPU
    (docs/BENCHMARKS-LOG.md), compiled, tok/s fp32 against bf16: SmolLM2's Q4_1 at
    W = 128 / 1,024 / 2,048 123 / 82 / 74 against 88 / 61 / 50 (the kernel's prefetch and its
    decode attention); SmolLM2 all int4 109-113 against 104-105; only the 12.6 MB default
    model's Q4_1 ran faster in bf16 at W = 128 (770 against 597), not past it."""
    if device.type == "cuda":
        return torch.bfloat16
    if int4 and cpu_has_bf16() and not cpu_qgemv.available():
        return torch.bfloat16
    return torch.float32


def stored_forms(tensors: Iterable[torch.Tensor | QTensor]) -> frozenset[str]:
    """The quantized forms ("int8", "int4") among these tensors."""
    return frozenset(t.kind for t in tensors if isinstance(t, QTensor))


def holds_int4(quant: str, stored: Collection[str]) -> bool:
    """Whether a model loaded with `quant` from a file storing the forms `stored` holds int4
    matrices (the question default_dtype asks)."""
    return quant == "int4" or (quant in ("keep", "auto") and "int4" in stored)


def resolve_quant(quant: str, device: torch.device) -> str:
    """"auto" as quant_rule.auto_quant says for the device and Triton's kernels; any other quant as it is."""
    return auto_quant(device.type, qgemv.available()) if quant == "auto" else quant


@dataclass(frozen=True)
class Holding:
    """How one load holds its model."""
    quant: str  # "none" | "keep" | "int8" | "int4": the quant asked for, "auto" resolved for the device
    dtype: torch.dtype  # the activations' (and the dense matrices': matrix_dtype)
    int4_as: str  # "int4", or "int8": the form a kept int4 matrix takes


def holding(device: torch.device, quant: str, stored: Collection[str], dtype: torch.dtype | None = None
            ) -> Holding:
    """The one rule (the module docstring): how a load with `quant` holds a model on `device`
    whose file stores the quantized forms `stored`; `dtype` None picks default_dtype's."""
    check_quant(quant)
    resolved = resolve_quant(quant, device)
    dtype = dtype or default_dtype(device, holds_int4(resolved, stored))
    # Asked only where an int4 matrix is there: the question builds the AVX2 kernel (about 20 s
    # of CPU the first time), which a dense model never uses (the default model's first load
    # took 16.6 s instead of 0.2 s).
    as_int8 = (quant == "auto" and resolved == "keep" and "int4" in stored and device.type == "cpu"
               and fbgemm_available() and dtype == torch.float32 and not cpu_qgemv.available())
    return Holding(resolved, dtype, "int8" if as_int8 else "int4")


def check_quant(quant: str, group: int = 32) -> None:
    """One of QUANTS (what each means: tinyllm.formats.quant_rule) and an int4 group size of GROUPS."""
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")
    if group not in GROUPS:
        raise ValueError(f"int4 group size {group} is not supported: use {' or '.join(map(str, GROUPS))}")


def matrix_dtype(stored: torch.dtype, device: torch.device, dtype: torch.dtype, quant: str) -> torch.dtype:
    """The dtype a dense matrix is held in: as stored where a CPU computes in fp32 from a file's
    bf16 or fp16 matrix and `quant` keeps what the file holds ("auto", "keep"), else the
    activations' `dtype`. Held at 16 bits, a decode step reads half the bytes, widened exactly
    where it is read (tinyllm.core.linear): measured on the 2-core CPU, the default model's
    compiled step 1.27x faster and the app 1.42x (docs/BENCHMARKS-LOG.md). "none" is the fp32
    reference."""
    if device.type == "cpu" and dtype == torch.float32 and quant in ("auto", "keep") and stored in HALF:
        return stored
    return dtype
