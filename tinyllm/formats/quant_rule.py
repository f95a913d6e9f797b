"""How a load holds a model's matrices: the choices, the one default, and what "auto" is on each
device, as a table that needs no torch (a CLI writes its --help from it before torch loads).

- `QUANTS`: "auto", "keep", "none", "int8", "int4"; `MEANING`: what each but "auto" does.
- `DEFAULT` ("auto"): the default of every loader (tinyllm.formats.open_model.open_any,
  load_checkpoint, load_hf, load_gguf), of ChatSession's open_session and of every CLI that
  runs a model (tinyllm-chat, tinyllm-bench, tinyllm.tools.eval).
- `auto_quant(device_type, triton)`: what "auto" is, a pure function of the device type and
  whether Triton's quantized kernels are there (tinyllm.kernels.qgemv.available(), asked by
  tinyllm.formats.load_policy, which applies the rule):
    CUDA with Triton   "keep": a file's int4 / int8 matrices stay as they are, read in place by
                       tinyllm.kernels.qgemv (tinyllm.core.quant_linear.TritonLinear; the token
                       table a QuantEmbedding); its dense (F16 / BF16 / F32) matrices in bf16.
                       Measured on the H200 (docs/BENCHMARKS-LOG.md): the 1.1B shape int8 1.62x
                       its bf16 speed, SmolLM2's Q4_1 kept int4 1.02x its bf16 load. Held dense,
                       an 8B Q4_K_M (a 4.9 GB file) is 16 GB of bf16.
    CUDA without       "none" (`NO_TRITON`): every matrix dense in bf16; the reference kernel
    Triton             would dequantize whole matrices each token (SmolLM2's int4 plain step
                       ran 8.5 tok/s that way).
    a CPU (any other)  "keep", where a kept int4 matrix is held as int8 instead when the AVX2
                       kernel (tinyllm.kernels.cpu_qgemv) cannot be built but fbgemm's int8
                       kernel is there (`INT4_ON_CPU`).
- `quant_help(choices, default)`: the --help text of a --quant option, written from the table.
"""

from __future__ import annotations

QUANTS = ("auto", "keep", "none", "int8", "int4")
DEFAULT = "auto"
AUTO = {"cuda": "keep", "cpu": "keep"}  # device type -> what "auto" holds there, its kernels present
NO_TRITON = "none"  # what "auto" holds on CUDA without Triton
INT4_ON_CPU = "int4 held as int8 where the AVX2 kernel cannot be built but fbgemm is there"
MEANING = {
    "keep": "a GGUF's or checkpoint's int4 and int8 matrices stay quantized",
    "none": "every matrix dense (dequantized)",
    "int8": "every matrix int8 (per output channel)",
    "int4": "every matrix int4 (groups of 32)",
}


def auto_quant(device_type: str, triton: bool) -> str:
    """What "auto" holds on a device of `device_type` ("cuda", "cpu"; another counts as a CPU),
    `triton` saying whether tinyllm.kernels.qgemv's Triton kernels are there (the module docstring)."""
    if device_type == "cuda" and not triton:
        return NO_TRITON
    return AUTO.get(device_type, AUTO["cpu"])


def auto_help() -> str:
    """What "auto" does on each device, in the words of what it resolves to there."""
    return (f"as each device runs best: on CUDA {MEANING[auto_quant('cuda', True)]}, dense ones in bf16 "
            f"(without Triton {MEANING[auto_quant('cuda', False)]} in bf16); "
            f"on a CPU {MEANING[auto_quant('cpu', True)]} ({INT4_ON_CPU})")


def quant_help(choices: tuple[str, ...] = QUANTS, default: str = DEFAULT) -> str:
    """The help of a --quant option offering `choices` with `default`."""
    parts = []
    for q in choices:
        mark = " (default)" if q == default else ""
        parts.append(f"{q}{mark}: {auto_help() if q == 'auto' else MEANING[q]}")
    return "how the weights are held: " + "; ".join(parts)
