"""Every TINYLLM_* environment switch of the library, read once into one frozen `Switches`.

Contract:
- `SWITCHES`: the switches of this process, read from os.environ when this module is first
  imported; modules read its fields, never the environment. A switch changed in the
  environment later (os.environ, monkeypatch.setenv) changes nothing in this process: set it
  before the process starts (a child process reads its own), or, in a test, replace the object:
  `monkeypatch.setattr(switches, "SWITCHES", switches.read({...}))` (modules that must see that
  read `switches.SWITCHES` when they are called; those that fix a constant at import do not).
- `read(env) -> Switches`: the switches an environment mapping sets; unset or empty ones keep
  the default, and a value means what it meant when each module read it itself: "0" turns a
  path off, anything else leaves it on. Refuses (ValueError, one line naming the variable) a
  TINYLLM_ATTN_TILE that is not a whole number >= 0; any such number launches (the kernel walks
  a long tile in blocks that fit in shared memory: tinyllm.kernels.decode_attention_triton),
  a TINYLLM_INT4_DP4A other than 0, 1 or auto, a TINYLLM_INT4_KERNEL or TINYLLM_INT8_KERNEL other
  than bytes or words, and a TINYLLM_CUDA_AUTO other than inductor or plain.
- Most switches exist to measure (a path turned off against the one that runs) or to tune;
  the defaults are what runs. The app's own folders (TINYLLM_CHAT_DATA_DIR,
  TINYLLM_CHAT_CONFIG_DIR) are chat_app's, and the C++ kernels read three switches themselves
  when the library loads: TINYLLM_CPU_VNNI=0 (one-row products on AVX2 even where the CPU has
  AVX512-VNNI: cpu_vnni.cpp), TINYLLM_CPU_EXACT_X=1 (int8 products on x as it is:
  cpu_products.cpp) and TINYLLM_CPU_MIN_BLOCKS=N (a product takes another thread only with N
  blocks of 32 weights a thread, 512 by default: cpu_kernels.h); tinyllm.kernels.cpu_qgemv.use_vnni
  and use_exact_x change the first two at run time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Switches:
    cpu_kernel: bool = True  # TINYLLM_CPU_KERNEL=0: never build or load the CPU kernels (tinyllm.kernels.cpu_qgemv)
    cache_dir: str = ""  # TINYLLM_CACHE_DIR: where those kernels build ("": XDG_CACHE_HOME/tinyllm, ~/.cache/tinyllm)
    qgemv: bool = True  # TINYLLM_QGEMV=0: no Triton products for quantized matrices on CUDA (tinyllm.kernels.qgemv)
    qgemv_fold: str = "plain"  # TINYLLM_QGEMV_FOLD: where those products take their norm and residual: plain | compiled | 0
    # TINYLLM_POST_FOLD=1: a post-norm (Gemma 2/3) inside its product's kernel (the row's last program normalizes
    # it); off, a kernel of its own after it: Gemma 3's plain step ran 1,535 tok/s folded against 1,582 apart
    # on an H100 (2026-12-07), the count's acquire-release atomic in every program costing more than the launch
    post_fold: bool = False
    qgemv_blocks: str = ""  # TINYLLM_QGEMV_BLOCKS="P,B,W,S,R": every product's block rule (tinyllm.kernels.qgemv_triton)
    int4_dp4a: str = "0"  # TINYLLM_INT4_DP4A: int4 products of groups of 32 on x rounded to int8 (qgemv_dp4a):
    # 0 never | 1 always | auto where the matrix is large (tinyllm.kernels.qgemv.DP4A_MIN_BYTES)
    int4_kernel: str = "words"  # TINYLLM_INT4_KERNEL: words (qgemv_words) | bytes (qgemv_triton._int4_kernel)
    int8_kernel: str = "words"  # TINYLLM_INT8_KERNEL: words (qgemv_words) | bytes (qgemv_triton._int8_kernel)
    # TINYLLM_FUSED_FILTERS=0: on CUDA (or under the interpreter) the plain step's repetition penalty and DRY as about
    # 40 torch kernels, not two Triton ones (tinyllm.kernels.sampler_filters): the app's plain step on the default
    # model ran 1,648-1,672 tok/s that way against 1,763-1,787 on an H100 (2026-12-07)
    fused_filters: bool = True
    decode_attn: bool = True  # TINYLLM_DECODE_ATTN=0: no Triton decode attention on CUDA (tinyllm.kernels.decode_attention)
    rope_attn: bool = True  # TINYLLM_ROPE_ATTN=0: RoPE and the cache write apart from that attention
    cpu_attn: bool = True  # TINYLLM_CPU_ATTN=0: the compiled CPU step keeps Inductor's attention loop
    attn_tile: int = 128  # TINYLLM_ATTN_TILE: windows up to this many keys one program a head (0: always split)
    pdl: str = "1"  # TINYLLM_PDL: 1 | 0 (no PDL) | kernels (our kernels only, not Inductor's: tinyllm.kernels.pdl)
    trace_dir: str = ""  # TINYLLM_TRACE_DIR: a Chrome trace of each profiled step there (tinyllm.tools.bench_profile)
    # TINYLLM_CUDA_SAVED_STEP=1: a CUDA session opened from a path saves its compiled step and a relaunch loads
    # it (tinyllm.decode.saved_step), as CPU sessions do; off until measured on a GPU
    cuda_saved_step: bool = False
    # TINYLLM_CUDA_AUTO: what a session's compile="auto" (the app's default) runs on CUDA: plain (the plain step's
    # graphs, captured ahead: our Triton kernels, nothing to compile; tinyllm.session.step_policy) | inductor (the
    # plain step's graphs until Inductor's compile, in the background, takes over). On an H100 (2026-12-07, the
    # default model in the app) the plain step replied at 1,763-1,787 tok/s from the first reply on, the compiled
    # one at 1,799-1,827 once ready, 55 s after a launch whose Inductor cache was cold
    cuda_auto: str = "plain"
    # TINYLLM_PRECOMPILE=1: a CUDA graph capture compiles the plain step's Triton kernels all at once on a thread
    # pool first (tinyllm.kernels.precompile), not one by one as its warm-up reaches them; off until run on a GPU
    precompile: bool = False
    # TRITON_INTERPRET=1 (Triton's own switch: its interpreter runs the kernels on the CPU): our Triton
    # paths (tinyllm.kernels.qgemv, decode_attention) then take CPU tensors too, so a CPU runs CUDA's step (tests)
    triton_interpret: bool = False


def read(env: Mapping[str, str]) -> Switches:
    def get(name: str, default: str = "") -> str:
        return env.get(f"TINYLLM_{name}") or default

    def on(name: str) -> bool:  # "0" turns a path off; anything else leaves it on
        return get(name) != "0"

    tile = get("ATTN_TILE", "128")
    try:
        attn_tile = int(tile)
    except ValueError:
        attn_tile = -1
    if attn_tile < 0:
        raise ValueError(f"TINYLLM_ATTN_TILE must be a whole number of keys, got {tile!r} (0 or more; 0: always split)")
    dp4a = get("INT4_DP4A", "0")
    if dp4a not in ("0", "1", "auto"):
        raise ValueError(f"TINYLLM_INT4_DP4A must be 0, 1 or auto, got {dp4a!r}")
    int4_kernel = get("INT4_KERNEL", "words")
    if int4_kernel not in ("bytes", "words"):
        raise ValueError(f"TINYLLM_INT4_KERNEL must be bytes or words, got {int4_kernel!r}")
    int8_kernel = get("INT8_KERNEL", "words")
    if int8_kernel not in ("bytes", "words"):
        raise ValueError(f"TINYLLM_INT8_KERNEL must be bytes or words, got {int8_kernel!r}")
    cuda_auto = get("CUDA_AUTO", "plain")
    if cuda_auto not in ("inductor", "plain"):
        raise ValueError(f"TINYLLM_CUDA_AUTO must be inductor or plain, got {cuda_auto!r}")
    return Switches(cpu_kernel=on("CPU_KERNEL"), cache_dir=get("CACHE_DIR"), qgemv=on("QGEMV"),
                    qgemv_fold=get("QGEMV_FOLD", "plain"), post_fold=get("POST_FOLD") == "1",
                    qgemv_blocks=get("QGEMV_BLOCKS"),
                    int4_dp4a=dp4a, int4_kernel=int4_kernel, int8_kernel=int8_kernel,
                    fused_filters=on("FUSED_FILTERS"),
                    decode_attn=on("DECODE_ATTN"), rope_attn=on("ROPE_ATTN"), cpu_attn=on("CPU_ATTN"),
                    attn_tile=attn_tile, pdl=get("PDL", "1"), trace_dir=get("TRACE_DIR"),
                    cuda_saved_step=get("CUDA_SAVED_STEP") == "1", cuda_auto=cuda_auto,
                    precompile=get("PRECOMPILE") == "1",
                    triton_interpret=env.get("TRITON_INTERPRET") == "1")


SWITCHES = read(os.environ)
