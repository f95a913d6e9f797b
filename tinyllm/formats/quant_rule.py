"""How a load holds a model's matrices: the choices, the one default, and what "auto" is on each
device, as a table that needs no torch (a CLI writes its --help from it before torch loads).

- `QUANTS`: "auto", "keep", "none", "int8", "int4"; `MEANING`: what each but "auto" does.
- `DEFAULT` ("auto"): the default of every loader (tinyllm.formats.open_model.open_any,
  load_checkpoint, load_hf, load_gguf), of ChatSession's open_session and of every CLI that
  runs a model (tinyllm-chat, tinyllm-bench, tinyllm.tools.eval).
- `AUTO`: what "auto" is on each device type: "none" on CUDA (measured on the H200, SmolLM2's
  Q4_1 in the app: int4 kept ran 459 tok/s compiled but 8.5 tok/s on the plain step, which
  dequantizes whole matrices each token; docs/BENCHMARKS-LOG.md), "keep" on a CPU, where a
  kept int4 matrix is held as int8 instead when the AVX2 kernel (tinyllm.kernels.cpu_qgemv) cannot be
  built but fbgemm's int8 kernel is there (`INT4_ON_CPU`). tinyllm.formats.load_policy applies it.
- `quant_help(choices, default)`: the --help text of a --quant option, written from the table.
"""

from __future__ import annotations

QUANTS = ("auto", "keep", "none", "int8", "int4")
DEFAULT = "auto"
AUTO = {"cuda": "none", "cpu": "keep"}  # device type -> what "auto" holds there
INT4_ON_CPU = "int4 held as int8 where the AVX2 kernel cannot be built but fbgemm is there"
MEANING = {
    "keep": "a GGUF's or checkpoint's int4 and int8 matrices stay quantized",
    "none": "every matrix dense (dequantized)",
    "int8": "every matrix int8 (per output channel)",
    "int4": "every matrix int4 (groups of 32)",
}


def auto_help() -> str:
    """What "auto" does on each device, in the words of what it resolves to there."""
    return (f"the fastest here, on CUDA {MEANING[AUTO['cuda']]} in bf16, on a CPU {MEANING[AUTO['cpu']]} "
            f"({INT4_ON_CPU})")


def quant_help(choices: tuple[str, ...] = QUANTS, default: str = DEFAULT) -> str:
    """The help of a --quant option offering `choices` with `default`."""
    parts = []
    for q in choices:
        mark = " (default)" if q == default else ""
        parts.append(f"{q}{mark}: {auto_help() if q == 'auto' else MEANING[q]}")
    return "how the weights are held: " + "; ".join(parts)
