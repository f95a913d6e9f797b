"""GGUF files (llama.cpp's format): read the header and tensors, dequantize to fp32, and import a
file of the architectures tinyllm runs (tinyllm.families; their mapping onto the one Transformer
is gguf_arch.py's) as a Transformer, tokenizer and chat template.

Our own reader (about 100 lines over numpy): the `gguf` package is not needed at run time;
tests use it to write files and as the reference dequantizer.

Contract:
- `read_gguf(path) -> GGUFFile` parses the header only (metadata and tensor table; no tensor
  data is read) and checks it: magic, version 2 or 3, every tensor of a known type lies
  inside the file (sizes in Python ints), alignment a power of two, arrays nested at most
  8 deep, at most 4 dims. Metadata arrays come back as lists; `meta(g, key, kind)` reads a
  key checked for its type (a wrong type is a one-line ValueError).
- `GGUFFile.tensor(name) -> fp32 tensor` in PyTorch order (GGUF lists dims fastest first),
  dequantized by `gguf_quants.dequantize` (the types it lists; another is a ValueError).
- `GGUFFile.quantized(name)`: a matrix kept quantized (Q4_0/Q4_1/Q4_K -> int4 exactly, other
  block types -> int8 per row; tinyllm.core.quant), what every quant but "none" reads.
- The format's two functions (tinyllm.formats.model_format): `inspect(path, template=None) ->
  ModelSpec` reads the header and validates it (config, tensor names, shapes and types,
  tokenizer, chat template) without reading tensor data (but the few floats of the RoPE factor
  tensors), its `stored` forms the ones `quantized` gives (gguf_quants.held_form); leaving the
  spec closes the file. `tensors(spec, quant, dtype, progress)`: under quant "none" every tensor
  dequantized, in `dtype`; under any other each matrix in its quantized form (`quantized`),
  tinyllm.formats.build turning it into the form `quant` asks for. Phi-3's fused attn_qkv and
  ffn_up are split by rows (on either form). `load_gguf(path, device, dtype, template=None,
  quant="auto", group=32, progress=None) -> LoadedModel` runs both and builds
  (tinyllm.formats.model_format.load_model). llama.cpp's converter permutes the Q/K rows of
  each head from the Hugging Face "rotate half" layout into the interleaved one for the llama
  architecture only (gguf_arch.PERMUTED, from tinyllm.families; the others run NEOX RoPE,
  rotate-half as stored); `tensors` undoes it (on either form), so our rotate-half RoPE sees
  what the model was trained with. The tokenizer comes from the metadata: `llama` (SentencePiece, Gemma's too)
  vocabularies become a sentencepiece model proto (built here, no protobuf needed) for
  `Tokenizer`; `gpt2` BPE vocabularies a `BPETokenizer` with the pre-tokenizer
  `tokenizer.ggml.pre` names (needs the `tokenizers` extra). The chat template is the file's
  own Jinja template when it splits per message, else a built-in one named by `template` or
  guessed.
Refuses (ValueError, one line): other architectures, MoE, RoPE scaling other than linear,
llama3 factors and LongRoPE (gguf_arch), missing tokenizer metadata, unknown tensor types,
tensors that do not match the metadata.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tinyllm.core.quant import QTensor
from tinyllm.formats.gguf_arch import PERMUTED, Split, gguf_config, gguf_names, meta, short
from tinyllm.formats.gguf_header import GGUFTensor, open_header, read_tensors
from tinyllm.formats.gguf_quants import dequantize, held_form, supported_types, to_qtensor
from tinyllm.formats.load_policy import check_quant
from tinyllm.formats.model_format import LoadedModel, ModelSpec, Progress, Tensors, load_model, with_progress
from tinyllm.formats.quant_rule import DEFAULT
from tinyllm.formats.tensor_checks import check_tensors, check_vocab, expected_shapes
from tinyllm.text.jinja_template import pick_template
from tinyllm.text.sp_proto import sentencepiece_proto
from tinyllm.text.tokenizer import Tokenizer


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict = field(repr=False)
    tensors: dict[str, GGUFTensor] = field(repr=False)
    _mm: mmap.mmap | None = field(default=None, repr=False)

    def raw(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        if t.nbytes is None:
            raise ValueError(f"{self.path}: tensor {name}: quantization type {t.type_name} is not supported "
                             f"(supported: {', '.join(supported_types())})")
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor dequantized to fp32, in PyTorch shape order."""
        t = self.tensors[name]
        raw = torch.from_numpy(self.raw(name).copy())
        return dequantize(raw, t.type, t.shape)

    def quantized(self, name: str) -> torch.Tensor | QTensor:
        """A matrix in its quantized form (gguf_quants.to_qtensor); other tensors fp32."""
        t = self.tensors[name]
        return to_qtensor(torch.from_numpy(self.raw(name).copy()), t.type, t.shape)

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a numpy view of it is still alive; the GC closes it later
                pass
            self._mm = None


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF header (metadata and tensor table) without reading tensor data."""
    path = Path(path).expanduser()
    r, version, n_tensors, meta = open_header(path)
    try:
        tensors = read_tensors(r, n_tensors, meta)  # (gguf_header: torch-free, the app's precheck reads it too)
    except BaseException:
        r.buf.close()
        raise
    return GGUFFile(path, version, meta, tensors, r.buf)


# ---- importing a file ----------------------------------------------------------------


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation: per head, interleaved pairs (0,1),(2,3),... back
    to the rotate-half layout (i, i + head_dim/2). w (n_heads * head_dim, dim)."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def gguf_tokenizer(g: GGUFFile):
    """Tokenizer (sentencepiece `llama` vocab) or BPETokenizer (`gpt2` vocab) from metadata."""
    kind, tokens = meta(g, "tokenizer.ggml.model", str), meta(g, "tokenizer.ggml.tokens", list, item=str)
    if kind is None or not tokens:
        raise ValueError(f"{g.path} has no tokenizer in its metadata (tokenizer.ggml.model / tokens)")
    types = meta(g, "tokenizer.ggml.token_type", list, item=int) or [1] * len(tokens)
    ids = {k: meta(g, f"tokenizer.ggml.{k}_token_id", int) for k in ("bos", "eos", "unknown", "padding")}
    scores = meta(g, "tokenizer.ggml.scores", list, item=float) or [0.0] * len(tokens)
    if len(types) != len(tokens) or len(scores) != len(tokens):
        raise ValueError(f"{g.path}: GGUF tokenizer metadata disagrees: {len(tokens)} tokens, {len(types)} "
                         f"token types, {len(scores)} scores; the file is corrupt")
    bad = {k: i for k, i in ids.items() if i is not None and not 0 <= i < len(tokens)}
    if bad:
        raise ValueError(f"{g.path}: GGUF tokenizer {', '.join(f'{k} id {i}' for k, i in bad.items())} "
                         f"is outside its {len(tokens)} tokens; the file is corrupt")
    if kind == "llama":
        specials = {ids["bos"], ids["eos"], ids["unknown"], ids["padding"]}
        # Control pieces other than BOS/EOS/UNK/PAD (e.g. "<|im_start|>") become user-defined,
        # so text that names them encodes to their ids, as Hugging Face tokenizers do.
        kinds = [4 if t == 3 and i not in specials else t for i, t in enumerate(types)]
        if ids["unknown"] is not None:  # Gemma's file types "<unk>" as a control piece: sentencepiece then has
            kinds[ids["unknown"]] = 2  # no unknown id, and a piece not in the vocab looked up fails
        proto = sentencepiece_proto(tokens, scores, kinds, ids["unknown"], ids["bos"], ids["eos"],
                                    ids["padding"], bool(meta(g, "tokenizer.ggml.add_space_prefix", bool, True)))
        return Tokenizer.from_serialized(proto)
    if kind == "gpt2":
        from tinyllm.text.bpe_tokenizer import BPETokenizer

        return BPETokenizer.from_vocab(tokens, meta(g, "tokenizer.ggml.merges", list, [], str), types,
                                       meta(g, "tokenizer.ggml.pre", str), ids["bos"], ids["eos"], ids["padding"],
                                       ids["unknown"])
    raise ValueError(f"{g.path}: GGUF tokenizer model {short(kind)} is not supported (llama or gpt2)")


def inspect_gguf(g: GGUFFile, template: str | None = None) -> ModelSpec:
    """Validate a read GGUF header (no tensor data but the RoPE factors): config, tensor names,
    shapes and types, tokenizer, chat template. The spec's source: (g, gguf_names(g, cfg))."""
    cfg = gguf_config(g)
    want = expected_shapes(cfg)
    names = gguf_names(g, cfg)
    found: dict[str, tuple[int, ...]] = {}  # tinyllm name -> its shape in the file
    unknown, wrong = [], []
    for n, t in names.items():
        shape = g.tensors[n].shape
        parts = ((t, shape[0]),) if isinstance(t, str) else t or ()
        if isinstance(t, tuple) and sum(r for _, r in t) != shape[0]:
            wrong.append(f"{n} {shape} vs {sum(r for _, r in t)} rows")
        for part, rows in parts:
            found[part] = (rows, *shape[1:])
        unknown += [n] if t is None or any(p not in want for p, _ in parts) else []
    missing = sorted(set(want) - set(found))
    wrong += [f"{t} {s} vs {want[t]}" for t, s in found.items() if t in want and s != want[t]]
    check_tensors(f"{g.path}: the tensors do not match the metadata", missing, sorted(unknown), wrong)
    bad = sorted({g.tensors[n].type_name for n in names if g.tensors[n].nbytes is None})
    if bad:
        raise ValueError(f"{g.path}: quantization type {', '.join(bad)} is not supported "
                         f"(supported: {', '.join(supported_types())})")
    tokenizer = gguf_tokenizer(g)
    check_vocab(g.path, tokenizer.vocab_size, cfg.vocab_size)
    name = meta(g, "general.name", str) or g.path.stem
    add_bos = meta(g, "tokenizer.ggml.add_bos_token", bool, g.metadata["tokenizer.ggml.model"] == "llama")
    chat = pick_template(meta(g, "tokenizer.chat_template", str), tokenizer, bool(add_bos), template,
                         f"{name} ({cfg.family})")  # the family too: a guess without a template
    stored = frozenset(f for t in g.tensors.values() if (f := held_form(t.type, t.shape)))
    return ModelSpec(g.path, cfg, tokenizer, chat, name, stored, source=(g, names), close=g.close)


def inspect(path: str | Path, template: str | None = None) -> ModelSpec:
    """Read the header and validate it (inspect_gguf); the spec holds the file open until it is left."""
    g = read_gguf(path)
    try:
        return inspect_gguf(g, template)
    except BaseException:
        g.close()
        raise


def tensors(spec: ModelSpec, quant: str, dtype: torch.dtype, progress: Progress | None = None) -> Tensors:
    """Every tensor under tinyllm's names (fused Phi-3 tensors split by rows; llama's Q/K rows
    un-permuted): dequantized in `dtype` under quant "none", else each matrix in its quantized form."""
    g, names = spec.source
    cfg = spec.config
    heads = {"attn.wq.weight": cfg.n_heads, "attn.wk.weight": cfg.n_kv_heads} if cfg.family in PERMUTED else {}
    state: Tensors = {}
    for n, t in with_progress(list(names.items()), progress):
        w = g.tensor(n) if quant == "none" else g.quantized(n)
        for part, rows, start in _parts(t):
            x = w if part == t else _rows(w, start, rows)
            h = next((v for k, v in heads.items() if part.endswith(k)), None)
            if h is not None and isinstance(x, QTensor):
                x = x.map(lambda y, h=h: unpermute_qk(y.reshape(y.shape[0], -1), h).reshape(y.shape))
            elif h is not None:
                x = unpermute_qk(x, h)
            state[part] = x.to(dtype) if quant == "none" else x
    return state


def _parts(t: str | Split) -> list[tuple[str, int, int]]:
    """(tinyllm name, rows, first row) of each part of a GGUF tensor (one part: the whole)."""
    if isinstance(t, str):
        return [(t, 0, 0)]
    out, start = [], 0
    for name, rows in t:
        out.append((name, rows, start))
        start += rows
    return out


def _rows(w: torch.Tensor | QTensor, start: int, rows: int) -> torch.Tensor | QTensor:
    if isinstance(w, QTensor):
        return w.map(lambda y: y[start:start + rows].contiguous())
    return w[start:start + rows].contiguous()


def load_gguf(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
              template: str | None = None, quant: str = DEFAULT, group: int = 32,
              progress: Progress | None = None) -> LoadedModel:
    """Inspect, then load (tinyllm.formats.model_format.load_model); the name is the file's general.name."""
    check_quant(quant, group)  # before the path: a bad option is named first
    with inspect(path, template) as spec:
        model = load_model(spec, tensors, device, dtype, quant, group, progress)
    return LoadedModel(model, spec.tokenizer, spec.template, spec.name)
