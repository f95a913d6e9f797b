"""The AVX2 CPU kernel for quantized weights and decode attention, prebuilt in a wheel or built at
first use: the ops'
torch side cpu_qgemv.cpp over kernel files that include no torch header (cpu_kernels.h names
them: cpu_quantize, cpu_tiles, cpu_vnni, cpu_products, cpu_qmm, cpu_pool, cpu_half, cpu_dequant,
cpu_attention .cpp), with the native decode step cpu_step.cpp and its sampler cpu_sampler.cpp
(cpu_sampler.h) in the same library.

Contract:
- `available() -> bool`: whether the ops below can run here. The first call loads the library
  a wheel carries prebuilt (tinyllm.kernels.prebuilt: built with the wheel for its torch release,
  on x86-64 Linux) where it fits this torch and these sources, with no compiler needed; else it
  builds SOURCES with the system compiler (torch.utils.cpp_extension, ninja, a file per job in
  parallel; about 20 s on a 2-core machine) into `build_folder()` under `cache_dir()`, or loads
  the build already there without running ninja (tinyllm.kernels.kernel_build: one folder per
  source, torch version and flags, shared by every install of that source, a clone's and a
  wheel's alike); a change to any of SOURCES and HEADERS, or another torch version, builds into
  a new folder. A build killed midway (Ctrl+C on a first launch) leaves nothing that blocks the
  next one: processes take the folder in turn through an OS lock. False, with ONE warning saying
  why, where the CPU is not x86-64 with AVX2 + FMA, where nothing prebuilt fits and there is no
  compiler or the build fails, or where the environment says TINYLLM_CPU_KERNEL=0 (then
  silently: a deliberate choice).
- `on_build(listener)`: `listener(kernel_build.BuildStatus)` hears the first `available()`'s
  build as it goes ("cached", the prebuilt library's load included, or "building" with the
  sources compiled so far, then "built" or "failed"); None stops it. The app's model process
  tells the app (tinyllm.session.chat_server).
- `qmm_int8(x, qweight, scales)` and `qmm_int4(x, qweight, scales, zeros)`: x fp32 (M, K) times
  a canonical tinyllm.core.quant QTensor's transpose -> (M, N) fp32, read in place (no copy of the
  weights). They are torch ops (`torch.ops.tinyllm_cpu.*`) with fake implementations, so a
  torch.compile(fullgraph=True) graph keeps them. x is quantized to int8 in blocks of 32 inside
  (as llama.cpp does), so results differ from x @ dequantize(qt).T by that rounding: about
  max|x block| / 254 per element of x, summed over K with the weights.
  One-row products (decode) use AVX512-VNNI where the CPU has it (`vpdpbusd`, two blocks of 32
  an instruction), else AVX2; both give the same sums up to fp32 rounding.
  `use_vnni(on) -> bool` picks the path for the products that follow (on: VNNI where the CPU
  has it) and returns the setting before; TINYLLM_CPU_VNNI=0 keeps AVX2 from the start.
  `use_exact_x(on) -> bool`: int8 products of a few rows take x as it is instead (fp32 sums of
  the widened weights: x @ dequantize(qt).T up to fp32 rounding), slower; TINYLLM_CPU_EXACT_X=1
  from the start.
- `loaded() -> bool`: whether `available()` has already said yes here (no build).
- `mm_half(x, w)`: x fp32 (M, K) times a bf16 or fp16 (N, K) matrix's transpose -> (M, N) fp32,
  in fp32 (x is not rounded): the compiled CPU step's product for matrices held at 16 bits
  (tinyllm.core.linear.HalfCpuLinear). Measured for (2816, 512) bf16 at 1 thread: 418 us (6.9 GB/s) against
  584 us for Inductor's reduction with the widening fused in.
- `linear(x, qweight, scales, zeros)`: the product quant_linear.CpuQgemvLinear calls: the kernel for fewer than
  PREFILL_M rows, else `torch.ops.tinyllm_cpu.dequantize` (fp32 (N, K)) and the fp32 GEMM.
- `ffn(x, w13, w2)`: the SwiGLU feed-forward w2(silu(gate) * up) of two quantized layers (the
  buffers `(qweight, scales, zeros)` of each; gate and up are w13's two halves of rows) for
  fewer than PREFILL_M rows, as ONE op (`torch.ops.tinyllm_cpu.qmm_ffn`): equal to
  linear(silu(gate) * up) after linear(x) up to the rounding of the hidden row to int8 (the
  fused op's SiLU is its own AVX2 exp, within about 1 ulp of torch's).
- Threads: the ops run on torch.get_num_threads() threads, their own pool (not OpenMP's), in
  chunks that a late thread finds taken: no call waits for a thread that has not started.
- `decode_attention(q, k, v, mask, scale)`: one decode position over a window of W keys on the
  CPU, `ops.window_attention`'s contract for fp32 or bf16 (q (B, Hkv, R, D) with R <= 8, k and v
  (B, Hkv, W, D) read in place through their strides, D a multiple of 8 up to 256, mask
  (B, 1, 1, W) bool): chunks of 256 keys of each head on the pool's threads, masked keys never
  read, a row with no key gets 0 (window_attention gives NaN). For the compiled CPU step
  (tinyllm.kernels.decode_attention), whose own attention loop runs on one thread.
- `cache_dir()`: $TINYLLM_CACHE_DIR, else $XDG_CACHE_HOME/tinyllm, else ~/.cache/tinyllm.
"""

from __future__ import annotations

import os
import platform
import shutil
import warnings
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from tinyllm.kernels import kernel_build, prebuilt, switches

SOURCE = Path(__file__).with_name("cpu_qgemv.cpp")  # the ops' torch side: checks, results, registration
# Built into the same library: the whole decode step (tinyllm.decode.cpu_step), and the kernels, files
# with no torch header (each compiles in about a second; a torch header costs several per file).
STEP_SOURCE = SOURCE.with_name("cpu_step.cpp")
KERNELS = [SOURCE.with_name(f"cpu_{name}.cpp")
           for name in ("tiles", "attention", "qmm", "vnni", "half", "quantize", "products", "pool", "dequant",
                        "sampler")]
# Longest compile first (ninja starts them in this order, cores + 2 at once): the two files with
# torch's headers (measured on the 2-core CPU: cpu_step.cpp 9-11 s of CPU, cpu_qgemv.cpp 7-9),
# then the kernels (0.2-3 s each).
SOURCES = [STEP_SOURCE, SOURCE, *KERNELS]
HEADERS = [SOURCE.with_name(name) for name in ("cpu_kernels.h", "cpu_simd.h", "cpu_matrix.h", "cpu_sampler.h")]
# From this many rows of x up (prefill), dequantize once and use the fp32 GEMM: the kernel costs
# about one decode product per row, measured on the 2-core AVX2 CPU for (3072, 576), 1 thread:
# M=16 kernel 2.8 ms vs fp32 GEMM 2.5 ms; M=128 27 ms vs 7.8 ms.
PREFILL_M = 16
# -fopenmp: at::parallel_for (dequantize) is inline code that threads only under OpenMP; the
# library links the libgomp.so.1 torch has already loaded. The products use their own pool.
CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-std=c++17", "-fopenmp"]
LDFLAGS = ["-fopenmp"]
NAME = "tinyllm_cpu_qgemv"


def cache_dir() -> Path:
    if switches.SWITCHES.cache_dir:
        return Path(switches.SWITCHES.cache_dir)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tinyllm"


def _cpu_problem() -> str | None:
    """Why this CPU cannot run the kernel, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the CPU is {platform.machine()}, not x86-64"
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "/proc/cpuinfo cannot be read to check for AVX2"
    missing = [f for f in ("avx2", "fma") if f not in flags]
    return f"the CPU lacks {', '.join(missing)}" if missing else None


_loaded = False  # available() has said yes (a plain global: a compiled step's trace reads it)


def loaded() -> bool:
    """Whether available() has said yes in this process already (never builds anything)."""
    return _loaded


@cache
def available() -> bool:
    if not switches.SWITCHES.cpu_kernel:
        return False
    problem = _cpu_problem()
    if problem is None:
        problem = _load()
    if problem is not None:
        warnings.warn(f"tinyllm: the AVX2 quantized kernel is off ({problem}); quantized CPU matrices use "
                      "PyTorch's kernels, which are several times slower here", RuntimeWarning, stacklevel=2)
        return False
    _register_fakes()
    global _loaded
    _loaded = True
    return True


def _load() -> str | None:
    """Load the wheel's prebuilt library where it fits this torch, else build (or find built) the
    sources in the cache: None once loaded, else why not (one line)."""
    skipped = prebuilt.mismatch(NAME, [*SOURCES, *HEADERS], prebuilt_flags())
    if skipped is None:
        try:
            torch.ops.load_library(str(prebuilt.library(NAME)))
            _report(kernel_build.BuildStatus("cached"))
            return None
        except OSError as e:  # an older libstdc++ than the build's, a torch build with other symbols: build instead
            skipped = f"the prebuilt library did not load: {str(e).strip().splitlines()[-1]}"
    compiler = os.environ.get("CXX", "c++")
    if not shutil.which(compiler):
        return f"no C++ compiler ({compiler}) on PATH, and {skipped}"
    try:
        _build()
    except Exception as e:  # a failed build must not stop a model from loading
        last = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
        return f"building the C++ kernels (cpu_*.cpp) failed: {last}"
    return None


def prebuilt_flags() -> list[str]:
    """The flags a prebuilt library's manifest records (tinyllm.kernels.prebuilt)."""
    return [*CFLAGS, "|", *LDFLAGS]


def build_folder() -> Path:
    """Where this source, these flags and this torch version build: one folder per combination,
    whatever folder the sources were installed in."""
    return kernel_build.build_folder(NAME, SOURCES, HEADERS, (CFLAGS, LDFLAGS), cache_dir())


_listener: kernel_build.Report | None = None


def on_build(listener: kernel_build.Report | None) -> None:
    """`listener` hears the build (or the cached build) of the first available() from now on."""
    global _listener
    _listener = listener


def _report(status: kernel_build.BuildStatus) -> None:
    if _listener is not None:
        _listener(status)


def _build() -> None:
    build = kernel_build.ensure_built(NAME, SOURCES, HEADERS, (CFLAGS, LDFLAGS), cache_dir(), _report)
    torch.ops.load_library(str(build.library))  # (the process that built it has it already: no-op)


@cache
def _register_fakes() -> None:
    """The ops' fake implementations (shapes only), for torch.compile: once a process."""

    @torch.library.register_fake("tinyllm_cpu::qmm_int8")
    def _(x: Tensor, qweight: Tensor, scales: Tensor) -> Tensor:
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("tinyllm_cpu::dequantize")
    def _(qweight: Tensor, scales: Tensor, zeros: Tensor | None) -> Tensor:
        k = qweight.shape[1] * (1 if zeros is None else 2)
        return qweight.new_empty(qweight.shape[0], k, dtype=torch.float32)

    @torch.library.register_fake("tinyllm_cpu::qmm_int4")
    def _(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor) -> Tensor:
        return x.new_empty(x.shape[0], qweight.shape[0])

    @torch.library.register_fake("tinyllm_cpu::mm_half")
    def _(x: Tensor, w: Tensor) -> Tensor:
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("tinyllm_cpu::decode_attention")
    def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("tinyllm_cpu::qmm_ffn")
    def _(x: Tensor, q13: Tensor, s13: Tensor, z13: Tensor | None, q2: Tensor, s2: Tensor,
          z2: Tensor | None) -> Tensor:
        return x.new_empty(x.shape[0], q2.shape[0])


def linear(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None) -> Tensor:
    """x (M, K) fp32 @ dequantize(QTensor).T -> (M, N): the kernel for up to PREFILL_M - 1 rows,
    else the matrix dequantized once (in C++) and the library's fp32 GEMM."""
    if x.shape[0] >= PREFILL_M:
        return torch.nn.functional.linear(x, torch.ops.tinyllm_cpu.dequantize(qweight, scales, zeros))
    return qmm_int8(x, qweight, scales) if zeros is None else qmm_int4(x, qweight, scales, zeros)


QParts = tuple[Tensor, Tensor, Tensor | None]  # (qweight, scales, zeros) of one layer


def ffn(x: Tensor, w13: QParts, w2: QParts) -> Tensor:
    """x (M, K) fp32 -> w2(silu(gate) * up) (M, D): one op for up to PREFILL_M - 1 rows, else
    the two dequantized products and the elementwise work between them in PyTorch."""
    if x.shape[0] >= PREFILL_M:
        gate, up = linear(x, *w13).chunk(2, dim=-1)
        return linear(torch.nn.functional.silu(gate) * up, *w2)
    return torch.ops.tinyllm_cpu.qmm_ffn(x, *w13, *w2)


def use_vnni(on: bool) -> bool:
    """One-row products through AVX512-VNNI (on, where the CPU has it) or AVX2 (off); returns
    the setting before. use_vnni(True) twice says whether this CPU has VNNI."""
    return torch.ops.tinyllm_cpu.use_vnni(on)


def use_exact_x(on: bool) -> bool:
    """int8 products of a few rows take x as it is (on: fp32 sums of the widened weights) or
    rounded to int8 blocks of 32 (off, the default, as llama.cpp does); returns the setting
    before. TINYLLM_CPU_EXACT_X=1 turns it on from the start."""
    return torch.ops.tinyllm_cpu.use_exact_x(on)


def qmm_int8(x: Tensor, qweight: Tensor, scales: Tensor) -> Tensor:
    """x (M, K) fp32 @ (qweight (N, K) int8 * scales (N,)[:, None]).T -> (M, N) fp32."""
    return torch.ops.tinyllm_cpu.qmm_int8(x, qweight, scales)


def qmm_int4(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor) -> Tensor:
    """x (M, K) fp32 @ dequantize(int4 QTensor).T -> (M, N) fp32 (groups of 32 or 64)."""
    return torch.ops.tinyllm_cpu.qmm_int4(x, qweight, scales, zeros)
