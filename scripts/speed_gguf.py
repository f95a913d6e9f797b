"""Speed-equivalent GGUF files that travel small, and the rows of scripts/gpu_side_by_side.sh.

A decoder's speed does not depend on the values of its weights, only on the file's header (shape,
tensor types, layout). So a real GGUF travels as its header plus each tensor's first bytes, and is
written back at full size with those bytes tiled over each tensor: both engines then read a file
that is byte for byte the real one's layout, at the real one's speed.

Contract (numpy, the standard library and tinyllm only: no `gguf` package; torch only for `bench`):
- `pack REAL.gguf OUT.tgguf`: OUT (xz) holds REAL's bytes before its tensor data (metadata and the
  tensor table, verbatim) and, per tensor, its first bytes: whole blocks, at most HEAD_BYTES, or the
  whole tensor up to WHOLE_BYTES (norms, RoPE factors: the values a loader may check).
- `unpack IN.tgguf OUT.gguf [--context N]`: the full-size file, each tensor's head tiled to its size,
  the padding between tensors zeros as in the real file; --context sets `<arch>.context_length`
  (the same integer type, so nothing moves). Refuses a file that is not a .tgguf.
- `synth-llama8b OUT.tgguf [--layers N]`: Llama-3.1-8B's shape and metadata (llama3 RoPE factors as
  `rope_freqs.weight`, context 131,072) with llama.cpp's Q4_K_M tensor types (llama-quant.cpp:
  attn_v and ffn_down Q6_K where use_more_bits, output Q6_K, other matrices Q4_K, norms F32),
  random blocks whose values are about N(0, 0.02), and a synthetic 'llama-bpe' vocabulary of
  128,256 tokens (256 byte tokens, 127,744 merged ones, Llama 3's 256 specials) that llama.cpp and
  tinyllm both load. --layers N: fewer layers (a CPU test).
- `bench ARGS...`: `tinyllm bench ARGS`, then a JSON line of the CUDA peak memory
  (torch.cuda.max_memory_allocated / reserved) and one of the K/V cache one decoder holds.
- `row ENGINE KEY FILE OUTPUT VRAM_MIB`: one results line from llama-bench's JSON lines or tinyllm
  bench's; `table RESULTS [--jsonl OUT]`: the Markdown tables (and their rows as JSON lines).
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinyllm.formats.gguf_header import ARRAY, SCALARS, STRING, Reader, open_header  # noqa: E402

MAGIC = b"TGGUF1\n"
HEAD_BYTES = 8192  # per tensor: whole blocks up to this many bytes travel
WHOLE_BYTES = 64 * 1024  # a tensor this small travels whole
# ggml type id -> (name, elements per block, bytes per block): the types these files hold
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
         6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84),
         11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210)}
F32, Q4_K, Q6_K = 0, 12, 14


# ---- the packed form ---------------------------------------------------------------------------

def read_table(path: str) -> tuple[bytes, list[tuple[str, int, int, int]], int]:
    """(the bytes before the tensor data, [(name, absolute offset, nbytes, ggml type)], file size)."""
    r, _, n_tensors, meta = open_header(path)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.scalar(10) for _ in range(r.scalar(4))]
        typ, off = r.scalar(4), r.scalar(10)
        if typ not in TYPES:
            raise ValueError(f"{path}: tensor {name} has ggml type {typ}, which speed_gguf does not know")
        _, block, size = TYPES[typ]
        infos.append((name, off, math.prod(dims) // block * size, typ))
    align = meta.get("general.alignment", 32)
    start = (r.pos + align - 1) // align * align
    header, total = bytes(r.buf[:start]), len(r.buf)
    r.buf.close()
    return header, [(n, start + off, nb, typ) for n, off, nb, typ in infos], total


def head_len(nbytes: int, block_bytes: int) -> int:
    return nbytes if nbytes <= WHOLE_BYTES else max(1, HEAD_BYTES // block_bytes) * block_bytes


def write_packed(out: str, header: bytes, tensors: list[tuple[str, int, int, bytes]], total: int) -> None:
    index = {"total": total, "header": len(header), "tensors": [[n, off, nb, len(h)] for n, off, nb, h in tensors]}
    blob = json.dumps(index).encode()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(out, "wb", preset=9) as f:
        f.write(MAGIC + struct.pack("<Q", len(blob)) + blob + header)
        for *_, h in tensors:
            f.write(h)
    print(f"{out}: {len(tensors)} tensors, {total:,} bytes unpacked, {Path(out).stat().st_size:,} packed",
          file=sys.stderr)


def pack(real: str, out: str) -> None:
    header, infos, total = read_table(real)
    with open(real, "rb") as f:
        tensors = []
        for name, off, nb, typ in infos:
            f.seek(off)
            tensors.append((name, off, nb, f.read(head_len(nb, TYPES[typ][2]))))
    write_packed(out, header, tensors, total)


def unpack(src: str, out: str, context: int | None = None) -> None:
    with lzma.open(src, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{src} is not a .tgguf file (scripts/speed_gguf.py pack writes them)")
        index = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        header = bytearray(f.read(index["header"]))
        heads = [f.read(n) for *_, n in index["tensors"]]
    if context is not None:
        set_context(header, context)
    chunk = 16 << 20
    with open(out + ".partial", "wb") as g:
        g.write(header)
        for (name, off, nb, _), h in sorted(zip(index["tensors"], heads, strict=True), key=lambda t: t[0][1]):
            assert off >= g.tell(), f"{src}: tensor {name} overlaps the one before it"
            g.write(bytes(off - g.tell()))
            tile = h * max(1, chunk // len(h))  # whole heads, about 16 MB
            for _ in range(nb // len(tile)):
                g.write(tile)
            g.write(tile[:nb % len(tile)])
        g.write(bytes(index["total"] - g.tell()))
    Path(out + ".partial").rename(out)
    print(f"{out}: {index['total']:,} bytes, {len(heads)} tensors tiled"
          + (f", context_length {context}" if context else ""), file=sys.stderr)


def set_context(header: bytearray, n: int) -> None:
    """Patch `<arch>.context_length` in a header in place (in its own integer type)."""
    r = Reader(bytes(header), Path("header"))
    r.pos = 16  # past the magic, the version and the tensor count
    where = {}  # key -> (position of its value, type, value)
    for _ in range(r.scalar(10)):
        key, t = r.string(), r.scalar(4)
        pos = r.pos
        where[key] = (pos, t, r.value(t))
    pos, t, _ = where[f"{where['general.architecture'][2]}.context_length"]
    struct.pack_into(SCALARS[t], header, pos, n)


# ---- a GGUF header, written ---------------------------------------------------------------------

def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _value(v) -> tuple[int, bytes]:
    """(GGUF type, bytes) of a metadata value: str, bool, int (u32, or i32 in arrays), float (f32), lists."""
    if isinstance(v, str):
        return STRING, _str(v)
    if isinstance(v, bool):
        return 7, struct.pack("<?", v)
    if isinstance(v, int):
        return 4, struct.pack("<I", v)
    if isinstance(v, float):
        return 6, struct.pack("<f", v)
    if isinstance(v, list) and isinstance(v[0], str):
        return ARRAY, struct.pack("<IQ", STRING, len(v)) + b"".join(_str(s) for s in v)
    if isinstance(v, list) and isinstance(v[0], int):
        return ARRAY, struct.pack("<IQ", 5, len(v)) + np.asarray(v, "<i4").tobytes()
    raise TypeError(f"no GGUF type for {type(v).__name__}")


def gguf_header(meta: dict, tensors: list[tuple[str, tuple[int, ...], int]], align: int = 32):
    """(header bytes up to the aligned data start, [absolute offset of each tensor], file size).
    tensors: (name, shape in PyTorch order, ggml type)."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(meta))]
    for k, v in meta.items():
        t, b = _value(v)
        out += [_str(k), struct.pack("<I", t), b]
    offsets, off = [], 0
    for name, shape, typ in tensors:
        out += [_str(name), struct.pack("<I", len(shape)), struct.pack(f"<{len(shape)}Q", *reversed(shape)),
                struct.pack("<IQ", typ, off)]
        offsets.append(off)
        _, block, size = TYPES[typ]
        off += (math.prod(shape) // block * size + align - 1) // align * align
    header = b"".join(out)
    header += bytes(-len(header) % align)
    return header, [len(header) + o for o in offsets], len(header) + off


# ---- the synthetic 8B --------------------------------------------------------------------------

LLAMA31_8B = dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab=128256,
                  rope_theta=500000.0, context=131072, rope_factor=8.0, low_freq=1.0, high_freq=4.0, old_context=8192)
LLAMA3_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                   "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
                   "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
                   "{{ content }}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def use_more_bits(i: int, n: int) -> bool:  # llama.cpp's llama-quant.cpp
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def llama3_rope_factors(c: dict) -> list[float]:
    """convert_hf_to_gguf.py's LlamaModel rope_freqs for rope_scaling type llama3."""
    head = c["dim"] // c["n_heads"]
    out = []
    for i in range(0, head, 2):
        wavelen = 2 * math.pi * c["rope_theta"] ** (i / head)
        if wavelen < c["old_context"] / c["high_freq"]:
            out.append(1.0)
        elif wavelen > c["old_context"] / c["low_freq"]:
            out.append(c["rope_factor"])
        else:
            smooth = (c["old_context"] / wavelen - c["low_freq"]) / (c["high_freq"] - c["low_freq"])
            out.append(1 / ((1 - smooth) / c["rope_factor"] + smooth))
    return out


def bpe_vocab(n_vocab: int) -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types): GPT-2's 256 byte characters, every pair of them, then pairs
    extended by one character, to n_vocab - 256; then Llama 3's 256 special tokens (control)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):  # GPT-2's bytes_to_unicode
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    chars = [chr(c) for _, c in sorted(zip(bs, cs, strict=True))]  # byte value order
    n_normal = n_vocab - 256
    tokens, merges = list(chars), []
    pairs = [(a, b) for a in chars for b in chars]
    for a, b in pairs[:n_normal - len(tokens)]:
        tokens.append(a + b)
        merges.append(f"{a} {b}")
    for (a, b), c in ((p, c) for p in pairs for c in chars):
        if len(tokens) >= n_normal:
            break
        tokens.append(a + b + c)
        merges.append(f"{a + b} {c}")
    named = {0: "begin_of_text", 1: "end_of_text", 4: "finetune_right_pad_id", 6: "start_header_id",
             7: "end_header_id", 8: "eom_id", 9: "eot_id", 10: "python_tag"}
    reserved = iter(range(256))
    for i in range(256):
        tokens.append(f"<|{named[i]}|>" if i in named else f"<|reserved_special_token_{next(reserved)}|>")
    return tokens, merges, [1] * n_normal + [3] * 256


def random_blocks(typ: int, n_blocks: int, rng: np.random.Generator) -> bytes:
    """K-quant blocks whose values are about N(0, 0.02): all 6-bit scales (and mins) 32 (Q4_K) or
    int8 scales 8 (Q6_K), random quants, fp16 super-block scales jittered by +-20%."""
    jitter = rng.uniform(0.8, 1.2, n_blocks)
    if typ == Q4_K:  # d, dmin (fp16), scales[12] (6-bit scale and min per 32), qs[128]: d*sc*q - dmin*m
        b = np.zeros(n_blocks, np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)]))
        d = 0.02 / (32 * 4.61) * jitter  # q uniform on 0..15: std 4.61, mean 7.5
        b["d"], b["dmin"] = d, d * 7.5
        b["scales"][:, :8] = 0xA0  # sc = m = 32 for all eight sub-blocks (ggml's get_scale_min_k4)
    elif typ == Q6_K:  # ql[128], qh[64], scales[16] (int8), d (fp16): d*sc*(q - 32)
        b = np.zeros(n_blocks, np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]))
        b["scales"], b["d"] = 8, 0.02 / (8 * 18.5) * jitter  # q uniform on 0..63: std 18.5
        b["qh"] = rng.integers(0, 256, b["qh"].shape)
    else:
        raise ValueError(f"no random blocks for ggml type {typ}")
    b["ql" if typ == Q6_K else "qs"] = rng.integers(0, 256, b["ql" if typ == Q6_K else "qs"].shape)
    return b.tobytes()


def synth_llama8b(out: str, layers: int | None = None) -> None:
    c = dict(LLAMA31_8B, n_layers=layers or LLAMA31_8B["n_layers"])
    dim, n, kv = c["dim"], c["n_layers"], c["dim"] // c["n_heads"] * c["n_kv_heads"]
    tokens, merges, types = bpe_vocab(c["vocab"])
    meta = {"general.architecture": "llama", "general.type": "model",
            "general.name": f"Llama 3.1 8B shape ({n} layers), random weights (scripts/speed_gguf.py)",
            "llama.block_count": n, "llama.context_length": c["context"], "llama.embedding_length": dim,
            "llama.feed_forward_length": c["ffn_dim"], "llama.attention.head_count": c["n_heads"],
            "llama.attention.head_count_kv": c["n_kv_heads"], "llama.rope.freq_base": c["rope_theta"],
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.dimension_count": dim // c["n_heads"],
            "llama.vocab_size": c["vocab"], "general.file_type": 15,  # LLAMA_FTYPE_MOSTLY_Q4_K_M
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": 128000, "tokenizer.ggml.eos_token_id": 128009,
            "tokenizer.chat_template": LLAMA3_TEMPLATE, "general.quantization_version": 2}
    tensors = [("rope_freqs.weight", (dim // c["n_heads"] // 2,), F32), ("token_embd.weight", (c["vocab"], dim), Q4_K)]
    for i in range(n):
        more = Q6_K if use_more_bits(i, n) else Q4_K
        tensors += [(f"blk.{i}.attn_norm.weight", (dim,), F32), (f"blk.{i}.attn_q.weight", (dim, dim), Q4_K),
                    (f"blk.{i}.attn_k.weight", (kv, dim), Q4_K), (f"blk.{i}.attn_v.weight", (kv, dim), more),
                    (f"blk.{i}.attn_output.weight", (dim, dim), Q4_K), (f"blk.{i}.ffn_norm.weight", (dim,), F32),
                    (f"blk.{i}.ffn_gate.weight", (c["ffn_dim"], dim), Q4_K),
                    (f"blk.{i}.ffn_up.weight", (c["ffn_dim"], dim), Q4_K),
                    (f"blk.{i}.ffn_down.weight", (dim, c["ffn_dim"]), more)]
    tensors += [("output_norm.weight", (dim,), F32), ("output.weight", (c["vocab"], dim), Q6_K)]
    header, offsets, total = gguf_header(meta, tensors)
    rng = np.random.default_rng(0)
    packed = []
    for (name, shape, typ), off in zip(tensors, offsets, strict=True):
        _, block, size = TYPES[typ]
        nbytes = math.prod(shape) // block * size
        if name == "rope_freqs.weight":
            head = np.asarray(llama3_rope_factors(c), "<f4").tobytes()
        elif typ == F32:
            head = np.ones(shape, "<f4").tobytes()  # norms
        else:
            head = random_blocks(typ, head_len(nbytes, size) // size, rng)
        packed.append((name, off, nbytes, head))
    write_packed(out, header, packed, total)


# ---- the rows and the table of gpu_side_by_side.sh -----------------------------------------------

def bench(argv: list[str]) -> int:
    """tinyllm bench, then its CUDA peak memory and one decoder's K/V cache (bf16 on CUDA)."""
    import torch

    from tinyllm.tools import bench as tb

    rc = tb.main(argv)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for kind, f in (("allocated", torch.cuda.max_memory_allocated), ("reserved", torch.cuda.max_memory_reserved)):
            print(json.dumps({"metric": "cuda_max_mib", "value": round(f() / 2**20, 1), "unit": "MiB", "kind": kind}))
    args = argparse.ArgumentParser(add_help=False)
    args.add_argument("--model")
    model = args.parse_known_args(argv)[0].model
    if model and model.endswith(".gguf"):
        _, _, _, m = open_header(model)
        a = m["general.architecture"]
        heads = m[f"{a}.attention.head_count"]
        hd = m.get(f"{a}.attention.key_length", m[f"{a}.embedding_length"] // heads)
        ctx = m[f"{a}.context_length"]
        kv = 2 * m[f"{a}.block_count"] * m.get(f"{a}.attention.head_count_kv", heads) * hd * (ctx + 1) * 2
        print(json.dumps({"metric": "kv_cache_mib", "value": round(kv / 2**20, 1), "unit": "MiB",
                          "context": ctx, "kind": "one decoder's StaticKVCache at bf16"}))
    return rc


def row(engine: str, key: str, file: str, output: str, vram: str) -> None:
    """One results line; key is 'engine|file|mode|variant' (gpu_side_by_side.sh's)."""
    _, _, mode, variant = (key.split("|", 3) + [""])[:4]
    rec = {"key": key, "engine": engine, "model": Path(file).stem, "mode": mode, "variant": variant,
           "vram_mib": None if vram in ("", "null") else float(vram)}
    lines = [json.loads(line) for line in Path(output).read_text().splitlines() if line.startswith("{")]
    if engine == "llama.cpp":
        r = next(x for x in lines if x.get("n_gen", 0) > 0)
        rec.update(tok_s=r["avg_ts"], stddev=r["stddev_ts"], n_gen=r["n_gen"], weights_mib=r["model_size"] / 2**20,
                   backends=r.get("backends"), gpu=r.get("gpu_info"), cpu=r.get("cpu_info"),
                   threads=r.get("n_threads"), build=r.get("build_commit"))
    else:
        rec["decode"] = {x["impl"]: x["value"] for x in lines if x["metric"] == "decode_tok_s"}
        for x in lines:
            if x["metric"] == "cuda_max_mib":
                rec[f"cuda_max_{x['kind']}_mib"] = x["value"]
            elif x["metric"] in ("weights_mib", "kv_cache_mib", "compile_capture_s") or (
                    x["metric"] == "ttft_ms" and x.get("prompt_len") == 16):
                rec[x["metric"]] = x["value"]
    print(json.dumps(rec))


def _fmt(v, digits: int = 1) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _times(a, b) -> str:
    return f" ({a / b:.2f}x)" if a and b else ""


def table(results: str, jsonl: str | None = None) -> None:
    """Markdown: model x {llama.cpp tg, tinyllm first reply and fastest, ratios, VRAM}; then the CPU."""
    rows = [json.loads(line) for line in Path(results).read_text().splitlines()] if Path(results).exists() else []
    by = {(r["model"], r["engine"], r["mode"], r["variant"]): r for r in rows}  # the latest of each wins
    out = []
    gpu = sorted({(m, mode.split("/")[0], v if e == "tinyllm" else "") for m, e, mode, v in by
                  if mode.split("/")[0] in ("cuda", "cpu")})
    if gpu:
        print("| model | llama.cpp tg256 tok/s | tinyllm first reply (plain) | tinyllm fastest | VRAM MiB llama.cpp | "
              "VRAM MiB tinyllm plain / compiled (torch peak reserved) | weights MiB llama.cpp / tinyllm | "
              "tinyllm K/V MiB |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for m, dev, tv in gpu:
        for lv in sorted({v for mm, e, mode, v in by if (mm, e, mode) == (m, "llama.cpp", dev)}) or [""]:
            L, off, on = by.get((m, "llama.cpp", dev, lv)), by.get((m, "tinyllm", f"{dev}/off", tv)), \
                by.get((m, "tinyllm", f"{dev}/on", tv))
            lt = L and L["tok_s"]
            first = off and off["decode"].get("graph" if dev == "cuda" else "static_eager")
            impl, fast = max(((i, v) for r in (off, on) if r for i, v in r["decode"].items() if i != "generate"),
                             key=lambda t: t[1], default=(None, None))
            t = off or on or {}
            rec = {"model": m, "device": dev, "llama_args": lv, "tinyllm_variant": tv, "llama_tg_tok_s": lt,
                   "tinyllm_first_reply_tok_s": first, "tinyllm_fastest_tok_s": fast, "tinyllm_fastest_impl": impl,
                   "first_over_llama": first / lt if first and lt else None,
                   "fastest_over_llama": fast / lt if fast and lt else None, "llama_vram_mib": L and L["vram_mib"],
                   "tinyllm_vram_mib": [r and r["vram_mib"] for r in (off, on)],
                   "tinyllm_torch_reserved_mib": [r and r.get("cuda_max_reserved_mib") for r in (off, on)],
                   "llama_weights_mib": L and L["weights_mib"], "tinyllm_weights_mib": t.get("weights_mib"),
                   "tinyllm_kv_cache_mib": t.get("kv_cache_mib"), "gpu": L and L.get("gpu")}
            out.append(rec)
            vram, res = rec["tinyllm_vram_mib"], rec["tinyllm_torch_reserved_mib"]
            label = m + (f" [llama-bench {lv}]" if lv else "") + (f" [tinyllm {tv}]" if tv else "")
            print(f"| {label} | {_fmt(lt)} | {_fmt(first)}{_times(first, lt)} | {_fmt(fast)}{_times(fast, lt)} "
                  f"{impl or ''} | {_fmt(rec['llama_vram_mib'], 0)} | {_fmt(vram[0], 0)} / {_fmt(vram[1], 0)} "
                  f"({_fmt(res[0], 0)} / {_fmt(res[1], 0)}) | {_fmt(rec['llama_weights_mib'], 0)} / "
                  f"{_fmt(rec['tinyllm_weights_mib'], 0)} | {_fmt(rec['tinyllm_kv_cache_mib'], 0)} |")
    if gpu:
        print("\nVRAM: nvidia-smi's peak over the run less the idle card. llama-bench's context is its n_gen "
              "positions; tinyllm's bench holds a K/V cache of the file's whole context per decoder (one plain, two "
              "with --compile on; the K/V column is one), so compare VRAM at one context (CONTEXT=N unpack).")
    cpu = sorted({(m, mode, v if e == "tinyllm" else "") for m, e, mode, v in by if mode.startswith("cpu-t")},
                 key=lambda k: (k[0], int(k[1][5:]), k[2]))
    if cpu:
        print("\n| model (CPU) | threads | llama.cpp tg tok/s | tinyllm native step tok/s |\n|---|---:|---:|---:|")
    for m, mode, tv in cpu:
        L, t = by.get((m, "llama.cpp", mode, "")), by.get((m, "tinyllm", mode, tv))
        lt = L and L["tok_s"]
        nt = t and t["decode"].get("static_eager_native", t["decode"].get("static_eager"))
        out.append({"model": m, "device": "cpu", "threads": int(mode[5:]), "tinyllm_variant": tv, "llama_tg_tok_s": lt,
                    "tinyllm_native_tok_s": nt, "tinyllm_over_llama": nt / lt if nt and lt else None,
                    "cpu": L and L.get("cpu")})
        print(f"| {m}{f' [tinyllm {tv}]' if tv else ''} | {mode[5:]} | {_fmt(lt)} | {_fmt(nt)}{_times(nt, lt)} |")
    if jsonl:
        Path(jsonl).write_text("".join(json.dumps(r) + "\n" for r in out))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return bench(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack")
    a.add_argument("real")
    a.add_argument("out")
    a = sub.add_parser("unpack")
    a.add_argument("src")
    a.add_argument("out")
    a.add_argument("--context", type=int)
    a = sub.add_parser("synth-llama8b")
    a.add_argument("out")
    a.add_argument("--layers", type=int)
    a = sub.add_parser("row")
    for k in ("engine", "key", "file", "output", "vram"):
        a.add_argument(k)
    a = sub.add_parser("table")
    a.add_argument("results")
    a.add_argument("--jsonl")
    args = p.parse_args(argv)
    try:
        if args.cmd == "pack":
            pack(args.real, args.out)
        elif args.cmd == "unpack":
            unpack(args.src, args.out, args.context)
        elif args.cmd == "synth-llama8b":
            synth_llama8b(args.out, args.layers)
        elif args.cmd == "row":
            row(args.engine, args.key, args.file, args.output, args.vram)
        else:
            table(args.results, args.jsonl)
    except (ValueError, FileNotFoundError) as e:
        print(f"speed_gguf: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
