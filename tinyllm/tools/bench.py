"""tinyllm-bench: how fast tinyllm decodes, and how fast its peers do on the same shape.

Contract: `main(argv=None) -> int` (the `tinyllm-bench` script). Every measurement is one JSON
object per line on stdout, {"metric", "value", "unit"} plus its context ("model", "device",
"dtype" always; "impl", "prompt_len", "window", "concurrency", ... where they apply); a short
table goes to stderr. Timing: a warm-up run first, then the median of --repeats runs, each
between torch.cuda.synchronize() calls on CUDA. Speeds are measured, never asserted.

Metrics (batch 1, greedy, unless said):
  bandwidth_gb_s   a large device-to-device copy, read + write bytes counted; only where
                   bw_fraction needs it (not with --no-buckets), and its buffers are given back,
                   so that a run's peak memory (nvidia-smi's, torch's) is the model's, not the probe's
  ttft_ms          eager prefill of prompt_len tokens until the first token is on the host
  capture_s        capturing every bucket's graph (CUDA); graph_pool_mib: memory_allocated /
                   memory_reserved growth over that capture ("kind"); impl "compiled": the
                   torch.compile'd step (compile_capture_s: its first capture, compile included)
  decode_tok_s     impl "graph" (GraphDecoder replays), "static_eager" (the same step eagerly),
                   "graph_compiled" / "static_eager_compiled" (the step under torch.compile,
                   Inductor, captured in the same bucket graphs / run without them; --compile),
                   "static_eager_native" (a CPU: the step as one C++ call, tinyllm.decode.cpu_step, where
                   it runs the model; what a chat session on a CPU runs),
                   "generate" (the eager reference), peers where installed: "hf_dynamic" and
                   "hf_static" (transformers LlamaForCausalLM generate(), same shape, random
                   weights) and "compile_reduce_overhead" (our static step under
                   torch.compile(mode="reduce-overhead"), gpt-fast style)
  bucket_tok_s     decode positioned inside each bucket W ("window"), graphs where possible,
                   plain and compiled ("impl"); --no-buckets skips it
  bw_fraction      for each bucket: (weight bytes + K/V window bytes read per step) x tok/s
                   over bandwidth_gb_s
  engine_*         with --engine (instead of the above): the continuous engine at each
                   --concurrency, on --engine-workload uniform or teacher: engine_tok_s and
                   where a step's time goes (tinyllm.tools.bench_engine states the rows);
                   with --engine-guard, engine_tok_s at max_len 256 and 4096 on a small model
                   and engine_guard_ratio (the cost of a token must not grow with max_len)
  late_over_early  with --late-context EARLY,LATE (instead of the above, a CPU): the native step's
                   decode_tok_s from EARLY and from LATE, alternated in one run, for a bf16, an
                   fp32 and an int8 cache, and their ratio (tinyllm.tools.bench_late)
  replay_us        with --profile (instead of the above, CUDA): one step's graph replay, plain
                   and compiled, first and last bucket; kernels_per_step, and the top kernels
                   on stderr (tinyllm.tools.bench_profile)
  weights_mib      with --model (unless --quant none) or a preset under --quant int8 / int4:
                   bytes of the weights as held; rss_load_mib (CPU):
                   resident memory growth over the load
Models: --preset NAME (random weights) or --model PATH (any format open_any reads); --quant
auto (the default, as the app) | keep | none | int8 | int4 holds the matrices as
tinyllm.formats.quant_rule states (a preset's random weights are dense but for int8 / int4). bf16 on CUDA,
fp32 on a CPU (--dtype picks), where the defaults are small (few steps, no peers) so a run
takes seconds.
Refuses (one line on stderr, exit code 2): an unknown preset, a bad checkpoint folder,
--device cuda without CUDA, bad numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

from tinyllm.core.quant_linear import logical_params, quantized_bytes
from tinyllm.cuda_graph import GraphDecoder, StaticKVCache
from tinyllm.decode import cpu_step
from tinyllm.decode.generate import generate
from tinyllm.decode.sampling import SamplingParams
from tinyllm.formats.load_policy import resolve_device
from tinyllm.formats.quant_rule import DEFAULT, QUANTS, quant_help
from tinyllm.model import PRESETS, ModelConfig, Transformer
from tinyllm.tools.bench_engine import WORKLOADS, bench_engine, bench_guard

DECODE_START = 32  # prompt tokens before a decode run


class Report:
    """Prints each record as a JSON line at once and keeps it for the closing table."""

    def __init__(self, **context):
        self.context, self.rows = context, []

    def __call__(self, metric: str, value: float, unit: str, **extra) -> None:
        rec = {"metric": metric, "value": round(float(value), 4), "unit": unit, **self.context, **extra}
        print(json.dumps(rec), flush=True)
        self.rows.append(rec)

    def table(self) -> str:
        keys = ("impl", "kind", "prompt_len", "window", "concurrency", "turn", "where", "step")
        lines = [f"{'metric':<16} {'context':<38} {'value':>12}  unit"]
        for r in self.rows:
            ctx = " ".join(f"{k}={r[k]}" for k in keys if k in r)
            lines.append(f"{r['metric']:<16} {ctx:<38} {r['value']:>12.4g}  {r['unit']}")
        return "\n".join(lines)


# -- set-up -------------------------------------------------------------------------------

def random_model(preset: str, device: torch.device, dtype: torch.dtype) -> Transformer:
    """A preset's shape with small-normal random weights, built on the device (fast for 1B)."""
    cfg = ModelConfig.from_name(preset)
    with torch.device(device):
        model = Transformer(cfg)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model.to(dtype).eval()


def load_model(args, device: torch.device, dtype: torch.dtype | None) -> tuple[Transformer, str, tuple | None]:
    """(model, name, (tokenizer, chat template) of --model or None for a preset)."""
    if args.model:
        from tinyllm.formats.open_model import open_any  # lazily: only for --model
        model, tok, template, _ = open_any(args.model, device, dtype, quant=args.quant)
        return model, str(args.model), (tok, template)
    model = random_model(args.preset, device, dtype)
    if args.quant in ("int8", "int4"):
        from tinyllm.formats.build import quantize_model

        model = quantize_model(model, args.quant)
    return model, args.preset, None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_s(run: Callable[[], float], repeats: int) -> float:
    """run() times itself (seconds); one warm-up, then the median of `repeats`."""
    run()
    return statistics.median(run() for _ in range(repeats))


def timed(fn: Callable[[], object], device: torch.device) -> Callable[[], float]:
    def run() -> float:
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        return time.perf_counter() - t0
    return run


def random_ids(model: Transformer, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.vocab_size, (1, n), generator=g).to(model.device)  # (1, n)


# -- bytes ----------------------------------------------------------------------------------

def measure_bandwidth(device: torch.device, repeats: int) -> float:
    """Bytes/s of a large copy, read + write counted (1 GiB on CUDA, 64 MiB on a CPU)."""
    n = (1 << 30) if device.type == "cuda" else (64 << 20)
    s = _copy_s(n, device, repeats)
    if device.type == "cuda":  # the 2 GiB the caching allocator would keep: a run's peak is the model's
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return 2 * n / s


def _copy_s(n: int, device: torch.device, repeats: int) -> float:
    """Median seconds of copying n bytes on device (its buffers freed on return)."""
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return median_s(timed(lambda: dst.copy_(src), device), max(repeats, 5))


def weight_bytes(model: Transformer) -> int:
    """Weight bytes one decode step reads: every matrix (quantized ones as held), except an
    untied embedding table (a lookup reads one row)."""
    total = quantized_bytes(model)
    if not model.cfg.tie_embeddings:
        total -= quantized_bytes(model.tok_emb)
    return total


def rss_mib() -> float:
    """Resident memory of this process (VmRSS), MiB; 0 where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return 0.0


def kv_bytes(model: Transformer, window: int, batch: int = 1) -> int:
    """K and V bytes one static decode step reads over a window of W keys."""
    cfg = model.cfg
    elem = torch.empty((), dtype=model.dtype).element_size()
    return 2 * cfg.n_layers * batch * cfg.n_kv_heads * window * cfg.head_dim * elem


# -- tinyllm's own paths ---------------------------------------------------------------------

def decode_run(dec: GraphDecoder, start: int, steps: int, device) -> Callable[[], float]:
    """Rewind to `start` and decode `steps` greedy tokens: each step leaves its argmax in
    dec.tok, the next step's input, so greedy decode is one replay per token."""

    def fn() -> None:
        dec.truncate(start)
        dec.tok.fill_(1)
        for _ in range(steps):
            dec.step(dec.tok)
    return timed(fn, device)


@torch.no_grad()
def bench_ttft(model: Transformer, dec: GraphDecoder, lens: list[int], repeats: int, report: Report) -> None:
    for n in lens:
        ids = random_ids(model, n, seed=n)
        s = median_s(timed(lambda ids=ids: dec.prefill(ids)[0, -1].argmax().item(), model.device), repeats)
        report("ttft_ms", s * 1e3, "ms", prompt_len=n)


@torch.no_grad()
def bench_capture(dec: GraphDecoder, report: Report, impl: str) -> None:
    sync(dec.model.device)
    if dec.compile:  # the first capture compiles each bucket's step; time the capture again
        report("compile_capture_s", dec.capture(), "s", impl=impl, n_graphs=len(dec.graphs))
        dec.graphs.clear()
        sync(dec.model.device)
    alloc, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    seconds = dec.capture()
    report("capture_s", seconds, "s", impl=impl, n_graphs=len(dec.graphs), buckets=list(dec.buckets))
    report("graph_pool_mib", (torch.cuda.memory_allocated() - alloc) / 2**20, "MiB", kind="allocated",
           impl=impl)
    report("graph_pool_mib", (torch.cuda.memory_reserved() - reserved) / 2**20, "MiB", kind="reserved",
           impl=impl)


@torch.no_grad()
def bench_decode(model: Transformer, decs: dict[str, GraphDecoder], steps: int, repeats: int,
                 report: Report, eager: bool = True) -> None:
    device = model.device
    for suffix, dec in decs.items():
        start = min(DECODE_START, dec.max_len - steps)
        dec.prefill(random_ids(model, start))
        impls = ["graph", "static_eager"] if device.type == "cuda" else ["static_eager"]
        for impl in impls if eager or device.type != "cuda" else ["graph"]:
            dec.use_graph = impl == "graph"
            s = median_s(decode_run(dec, start, steps, device), repeats)
            report("decode_tok_s", steps / s, "tok/s", impl=impl + suffix, start=start, steps=steps)
    if not eager and device.type == "cuda":
        return
    start = min(DECODE_START, model.cfg.max_seq_len - steps)
    report("decode_tok_s", generate_tok_s(model, start, steps, repeats), "tok/s", impl="generate",
           start=start, steps=steps)


def generate_tok_s(model: Transformer, start: int, steps: int, repeats: int) -> float:
    """The eager reference: tokens after the first (prefill excluded)."""
    ids = random_ids(model, start)

    def run() -> float:
        it = generate(model, ids, steps + 1)
        next(it)
        sync(model.device)
        t0 = time.perf_counter()
        for _ in it:
            pass
        sync(model.device)
        return time.perf_counter() - t0
    return steps / median_s(run, repeats)


@torch.no_grad()
def bench_buckets(model: Transformer, dec: GraphDecoder, steps: int, repeats: int, bandwidth: float,
                  report: Report, impl: str) -> None:
    """Decode inside each bucket: from just past the previous bucket, at most to its end."""
    dec.use_graph = model.device.type == "cuda"
    w_bytes = weight_bytes(model)
    prev = 0
    for w in dec.buckets:
        start = max(1, prev)
        n = min(steps, w - start)
        dec.prefill(random_ids(model, start, seed=w))
        tok_s = n / median_s(decode_run(dec, start, n, model.device), repeats)
        report("bucket_tok_s", tok_s, "tok/s", window=w, steps=n, impl=impl)
        step_bytes = w_bytes + kv_bytes(model, w)
        report("bw_fraction", step_bytes * tok_s / bandwidth, "fraction", window=w, impl=impl,
               bytes_per_step=step_bytes, achieved_gb_s=round(step_bytes * tok_s / 1e9, 2))
        prev = w


# -- peers ------------------------------------------------------------------------------------

def hf_model(model: Transformer):
    from transformers import LlamaConfig, LlamaForCausalLM  # only where installed

    cfg = model.cfg
    hf_cfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.max_seq_len,
                         rope_theta=cfg.rope_theta, rms_norm_eps=cfg.norm_eps,
                         tie_word_embeddings=cfg.tie_embeddings, pad_token_id=0)
    with torch.device(model.device):
        return LlamaForCausalLM(hf_cfg).to(model.dtype).eval()


@torch.no_grad()
def bench_hf(model: Transformer, steps: int, repeats: int, report: Report) -> None:
    hf = hf_model(model)
    ids = random_ids(model, DECODE_START)
    mask = torch.ones_like(ids)
    for impl, cache in (("hf_dynamic", None), ("hf_static", "static")):
        def gen(n: int, cache=cache) -> None:
            hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                        cache_implementation=cache)
        full = median_s(timed(lambda: gen(steps + 1), model.device), repeats)
        first = median_s(timed(lambda: gen(1), model.device), repeats)
        report("decode_tok_s", steps / max(full - first, 1e-9), "tok/s", impl=impl, start=DECODE_START,
               steps=steps)


@torch.no_grad()
def bench_compiled(model: Transformer, steps: int, repeats: int, report: Report) -> None:
    """gpt-fast style: torch.compile(mode="reduce-overhead") of our static step at one fixed
    window (the bucket that holds the whole run), with the cache marked static."""
    dec = GraphDecoder(model, 1, max_len=min(model.cfg.max_seq_len, DECODE_START + steps + 1),
                       use_graph=False)
    dec.prefill(random_ids(model, DECODE_START))
    c: StaticKVCache = dec.cache
    for t in (*c.k, *c.v, c.pos, c.first_valid, dec.tok, *dec.sampler.state()):
        torch._dynamo.mark_static_address(t)
    window = dec.bucket(DECODE_START + steps)

    def greedy_step() -> torch.Tensor:
        return dec.plain_step(window)[:, -1].argmax(-1, keepdim=True)  # (1, 1)
    step = torch.compile(greedy_step, mode="reduce-overhead", fullgraph=True)

    def fn() -> None:
        c.pos.fill_(DECODE_START)
        for _ in range(steps):
            torch.compiler.cudagraph_mark_step_begin()
            dec.tok.copy_(step())
    fn()  # compile (and record) outside the timing
    s = median_s(timed(fn, model.device), repeats)
    report("decode_tok_s", steps / s, "tok/s", impl="compile_reduce_overhead", start=DECODE_START,
           steps=steps, window=window)


def run_peers(model: Transformer, steps: int, repeats: int, report: Report) -> None:
    for name, bench in (("hf", bench_hf), ("compile", bench_compiled)):
        try:
            bench(model, steps, repeats, report)
        except ImportError as e:
            print(f"tinyllm-bench: skipped peer {name}: {e}", file=sys.stderr)
        except Exception as e:  # a peer failing must not lose the other numbers
            print(f"tinyllm-bench: peer {name} failed: {type(e).__name__}: {e}", file=sys.stderr)


# -- command line -----------------------------------------------------------------------------

def bench_chat(model: Transformer, tok_template: tuple | None, turns: int, report: Report) -> None:
    """Time to first token per chat turn: only a turn's new tokens are prefilled, so turn N
    should cost about what turn 2 does (the ratio is the number to watch)."""
    import tempfile

    from tinyllm.session.chat import ChatSession
    from tinyllm.text.chat_template import get_template

    if tok_template is None:  # a preset: random weights, a small real tokenizer
        from tinyllm.tools.testing import make_tiny_tokenizer

        with tempfile.TemporaryDirectory() as tmp:
            tok_template = (make_tiny_tokenizer(tmp), get_template("chatml"))
    tok, template = tok_template
    session = ChatSession(model, tok, template, params=SamplingParams(max_tokens=12), compile=None)
    ttft = []
    for i in range(turns):
        events = list(session.send(f"A fact about {i + 1}?"))
        ttft.append(events[0].ms)
        report("chat_ttft_ms", events[0].ms, "ms", turn=i + 1, position=events[-1].stats.position,
               prefilled=events[0].n_tokens, dropped=events[0].dropped)
    if turns >= 2:
        report("chat_ttft_ratio", ttft[-1] / ttft[1], "x", kind=f"turn{turns}/turn2")


def int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tinyllm-bench", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="a tinyllm checkpoint folder")
    src.add_argument("--preset", default="tinychat",
                     help=f"random weights of a preset shape: {', '.join(PRESETS)}")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--steps", type=int, help="decode steps per run (default 256 on CUDA, 16 on a CPU)")
    p.add_argument("--repeats", type=int, help="timed runs per number, median taken (default 5 / 3)")
    p.add_argument("--prompt-lens", type=int_list, default=[128, 512, 2048],
                   help="TTFT prompt lengths, those within max_seq_len (default 128,512,2048)")
    p.add_argument("--engine", action="store_true", help="measure the continuous engine instead")
    p.add_argument("--concurrency", type=int_list, help="engine requests at once (default 1,8,32,64 / 1,4)")
    p.add_argument("--engine-workload", default="uniform", choices=WORKLOADS,
                   help="uniform: 64-token prompts, greedy; teacher: 50-600-token prompts, the teacher's answer "
                        "sampling, max_len 1024")
    p.add_argument("--engine-guard", action="store_true",
                   help="the compiled engine at max_len 256 and 4096 on a small model, and their ratio")
    p.add_argument("--chat-turns", type=int, help="measure time to first token over N chat turns instead")
    p.add_argument("--profile", action="store_true",
                   help="CUDA: replay time and kernels of one step, plain and compiled, first and last bucket")
    p.add_argument("--late-context", type=int_list, metavar="EARLY,LATE",
                   help="measure the native CPU step from EARLY and from LATE keys instead (e.g. 100,1900)")
    p.add_argument("--no-buckets", action="store_true",
                   help="skip decode inside each bucket (bucket_tok_s, bw_fraction): minutes on a CPU")
    p.add_argument("--no-eager", action="store_true",
                   help="CUDA: decode with graphs only (no eager twin, no generate(): seconds each on a small model)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quant", default=DEFAULT, choices=QUANTS, help=quant_help())
    p.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"),
                   help="activations (auto: bf16 on CUDA; on a CPU fp32, or bf16 for a model holding int4 "
                        "matrices where the CPU has AVX512-BF16/AMX and the AVX2 kernel cannot be built)")
    p.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                   help="also measure the torch.compile'd step (auto: on CUDA only; the engine "
                        "uses it instead of the plain step)")
    p.add_argument("--peers", default="auto", choices=("auto", "on", "off"),
                   help="transformers and torch.compile peers (auto: on CUDA only)")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> Report:
    if not args.model and args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    steps = args.steps if args.steps is not None else (256 if cuda else 16)
    repeats = args.repeats if args.repeats is not None else (5 if cuda else 3)
    if steps < 1 or repeats < 1:
        raise ValueError(f"--steps and --repeats must be >= 1, got {steps} and {repeats}")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.engine_guard:  # its own small model; compiled unless --compile off: what it guards is the compiled step
        report = Report(model="guard-2x192", device="cpu", dtype="float32", quant="none")  # a CPU guard
        bench_guard(report, None if args.compile == "off" else "inductor", repeats)
        return report
    from tinyllm.formats.load_policy import holding

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(args.dtype)
    if dtype is None and not args.model:  # a file's loader picks its own (what it holds decides)
        dtype = holding(device, args.quant, frozenset()).dtype  # random weights store no quantized form
    rss0 = rss_mib()
    model, name, tok_template = load_model(args, device, dtype)
    dtype = model.dtype
    # A preset's random weights are dense: auto and keep hold them as none does.
    quant = args.quant if args.model or args.quant in ("int8", "int4") else "none"
    report = Report(model=name, device=device.type, dtype=str(dtype).removeprefix("torch."), quant=quant)
    if quant != "none":
        report("weights_mib", quantized_bytes(model) / 2**20, "MiB", params=logical_params(model))
        if not cuda:
            report("rss_load_mib", rss_mib() - rss0, "MiB", kind="VmRSS growth over the load")
    print(f"tinyllm-bench: {name}, {logical_params(model) / 1e6:.1f}M params, {device.type} {dtype}, "
          f"quant {quant}", file=sys.stderr)
    if args.chat_turns:
        bench_chat(model, tok_template, args.chat_turns, report)
        return report
    if args.profile:
        from tinyllm.tools.bench_profile import bench_profile

        bench_profile(model, report, random_ids(model, DECODE_START), compiled=args.compile != "off")
        return report
    if args.late_context:
        from tinyllm.tools.bench_late import bench_late

        if len(args.late_context) != 2 or cuda:
            raise ValueError("--late-context takes EARLY,LATE (two positions) and runs on a CPU")
        bench_late(model, report, *args.late_context, steps=steps if args.steps else 64, rounds=repeats)
        return report
    compile = args.compile == "on" or (args.compile == "auto" and cuda)
    if args.engine:
        bench_engine(model, args.concurrency or ([1, 8, 32, 64] if cuda else [1, 4]), steps, repeats, report,
                     "inductor" if compile else None, args.engine_workload)
        return report
    if not args.no_buckets:  # bw_fraction's denominator; measured first, while nothing else is held
        bandwidth = measure_bandwidth(device, repeats)
        report("bandwidth_gb_s", bandwidth / 1e9, "GB/s")
    steps = min(steps, model.cfg.max_seq_len - 1)
    dec = GraphDecoder(model, 1, use_graph=cuda)  # graphs share one pool only if on from the start
    decs = {"": dec}
    if compile:
        decs["_compiled"] = GraphDecoder(model, 1, use_graph=cuda, compile="inductor")
    if not cuda and cpu_step.problem(model, 1) is None:
        decs["_native"] = GraphDecoder(model, 1, use_graph=False)
        cpu_step.use_native(decs["_native"])
    bench_ttft(model, dec, [n for n in args.prompt_lens if n <= model.cfg.max_seq_len], repeats, report)
    for suffix, d in decs.items():
        if cuda:
            d.prefill(random_ids(model, DECODE_START))
            bench_capture(d, report, suffix.strip("_") or "plain")
    bench_decode(model, decs, steps, repeats, report, eager=not args.no_eager)
    for suffix, d in decs.items() if not args.no_buckets else ():
        bench_buckets(model, d, steps, repeats, bandwidth, report, "graph" + suffix if cuda else "static_eager" + suffix)
    if args.peers == "on" or (args.peers == "auto" and cuda):
        run_peers(model, steps, repeats, report)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"tinyllm-bench: error: {e}", file=sys.stderr)
        return 2
    print(report.table(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
