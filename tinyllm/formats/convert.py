"""tinyllm convert SRC DST: write a tinyllm checkpoint folder from a Hugging Face
folder or a GGUF file (or re-save a tinyllm folder); with --to hf, a Hugging Face folder
from any of them (tinyllm.formats.hf_export: for transformers, vLLM, SGLang).

Contract: DST gets config.json (ModelConfig, name, chat template: a built-in's name, or for
one taken from the model's Jinja template its full spec in chat.spec), the weights
(model.safetensors or shards) and the tokenizer (tokenizer.model; tokenizer.json +
tokenizer_config.json for a BPE tokenizer). Weights are saved in --dtype: "auto" keeps a
Hugging Face folder's own dtype and writes GGUF weights (dequantized) as fp32. --quant int8 /
int4 stores every matrix quantized (tinyllm.core.quant's canonical form: values plus scales, int4 in
groups of --group; --form PREFIX=KIND gives the matrices under a name prefix their own form,
--half-scales rounds int4 scales to fp16), "keep" keeps a GGUF's or tinyllm folder's quantized matrices as they are,
"none" (the default) writes dense weights. The folder then opens with `open_any` and
`tinyllm-chat --model DST` exactly as SRC does.
--to hf takes --dtype (auto: the source's dense dtype, bf16 for a quantized one), --template,
--shard-mb (default 2048 there) and --force; quantized matrices are dequantized (one line on
stderr says how many), so --quant, --group, --form, --half-scales and --name do not apply.
Errors (unsupported architecture, missing tokenizer, unknown quantization type, an existing
non-empty DST without --force, an option --to hf does not take) print one line on stderr and
exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from tinyllm.text.jinja_template import JinjaChatTemplate

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_HF_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def convert(src: str | Path, dst: str | Path, dtype: str = "auto", name: str | None = None,
            template: str | None = None, shard_mb: float = 15, force: bool = False, quant: str = "none",
            group: int = 32, forms: dict[str, str] | None = None, half_scales: bool = False) -> Path:
    from tinyllm.formats.checkpoint import save_checkpoint
    from tinyllm.formats.open_model import open_any
    from tinyllm.text.tokenizer import Tokenizer

    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if dtype != "auto" and dtype not in _DTYPES:
        raise ValueError(f"--dtype must be auto, {', '.join(_DTYPES)}; got {dtype!r}")
    if dst.resolve() == src.resolve():
        raise ValueError("SRC and DST are the same path")
    if dst.exists() and any(dst.iterdir()) and not force:
        raise ValueError(f"{dst} exists and is not empty; pick another DST or pass --force")
    from tinyllm.formats.load_policy import check_quant

    check_quant(quant, group)
    if quant == "auto":
        raise ValueError("--quant auto picks a form for a device; convert takes none, keep, int8 or int4")
    if (forms or half_scales) and quant not in ("int8", "int4"):
        raise ValueError("--form and --half-scales go with --quant int8 or int4")
    mixed = bool(forms) or half_scales
    model, tokenizer, chat_template, model_name = open_any(src, "cpu", torch.float32, template,
                                                           "none" if mixed else quant, group)
    if mixed:
        from tinyllm.formats.build import quantize_model

        model = quantize_model(model, quant, group, forms, half_scales)
    if not isinstance(tokenizer, Tokenizer):
        import tinyllm.formats.checkpoint as ckpt

        if not hasattr(ckpt, "TOKENIZER_JSON"):
            raise ValueError("saving a BPE (tokenizer.json) tokenizer needs checkpoint folders that hold "
                             "tokenizer.json; this tinyllm cannot write them yet")
    chat = {"template": chat_template.name}
    if isinstance(chat_template, JinjaChatTemplate):
        chat["spec"] = {**asdict(chat_template), "stop": list(chat_template.stop)}
    return save_checkpoint(model, tokenizer, dst, name=name or model_name, chat=chat, shard_mb=shard_mb,
                           dtype=_save_dtype(src, dtype))


def _form(arg: str) -> tuple[str, str]:
    prefix, sep, kind = arg.partition("=")
    if not sep or not prefix or kind not in ("none", "int8", "int4"):
        raise ValueError(f"--form {arg!r}: give PREFIX=KIND, KIND one of none, int8, int4")
    return prefix, kind


def _save_dtype(src: Path, dtype: str) -> torch.dtype:
    if dtype != "auto":
        return _DTYPES[dtype]
    config = src / "config.json"
    if src.is_dir() and config.is_file():
        raw = json.loads(config.read_text())
        return _HF_DTYPES.get(raw.get("dtype") or raw.get("torch_dtype"), torch.float32)
    return torch.float32


def _export_hf(args: argparse.Namespace) -> Path:
    """--to hf (tinyllm.formats.hf_export), after refusing the options it does not take."""
    from tinyllm.formats.hf_export import export_hf

    given = [flag for flag, on in (("--quant", args.quant != "none"), ("--group", args.group != 32),
                                   ("--form", bool(args.form)), ("--half-scales", args.half_scales),
                                   ("--name", args.name is not None)) if on]
    if given:
        raise ValueError(f"--to hf writes dense weights under the source's name; drop {', '.join(given)}")
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    return export_hf(args.src, args.dst, args.dtype, args.template, 2048 if args.shard_mb is None else args.shard_mb,
                     args.force, say)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tinyllm convert",
                                description="Write a tinyllm checkpoint folder from a Hugging Face folder or a "
                                            "GGUF file (Llama, Mistral, Qwen 2/3, Gemma 2/3, Phi-3), or re-save a "
                                            "tinyllm folder; --to hf writes a Hugging Face folder from any of them "
                                            "(transformers, vLLM, SGLang load it).")
    p.add_argument("src", type=Path, help="Hugging Face folder, .gguf file, or tinyllm folder")
    p.add_argument("dst", type=Path, help="the folder to write (a tinyllm checkpoint, or with --to hf a "
                                          "Hugging Face folder)")
    p.add_argument("--to", default="tinyllm", choices=("tinyllm", "hf"),
                   help="tinyllm: a tinyllm checkpoint folder (default); hf: a Hugging Face folder (config.json, "
                        "dense safetensors, tokenizer.json, tokenizer_config.json with the chat template, "
                        "generation_config.json); quantized matrices are dequantized")
    p.add_argument("--dtype", default="auto", choices=["auto", *_DTYPES],
                   help="weights dtype (auto: the HF folder's own; fp32 for GGUF; with --to hf the source's "
                        "dense dtype, bf16 for quantized matrices)")
    p.add_argument("--name", default=None, help="model name (default: the source's)")
    p.add_argument("--template", default=None, help="built-in chat template instead of the model's own")
    p.add_argument("--shard-mb", type=float, default=None,
                   help="shard size in MiB (default: 15; 2048 with --to hf)")
    p.add_argument("--force", action="store_true", help="write into a non-empty DST")
    p.add_argument("--quant", default="none", choices=("none", "keep", "int8", "int4"),
                   help="none: dense weights; keep: the source's quantized matrices as they are; int8: per "
                        "output channel; int4: in groups of --group")
    p.add_argument("--group", type=int, default=32, choices=(32, 64), help="int4 group size (default 32)")
    p.add_argument("--form", action="append", default=[], metavar="PREFIX=KIND",
                   help="matrices whose name starts with PREFIX held as KIND (none, int8, int4) instead of "
                        "--quant's, e.g. --form tok_emb=int8 --form blocks.29.=int8 (repeatable)")
    p.add_argument("--half-scales", action="store_true",
                   help="int4 scales and offsets in fp16 (GGUF Q4_1's layout: 0.625 bytes a weight at group 32)")
    args = p.parse_args(argv)
    try:
        if args.to == "hf":
            out = _export_hf(args)
        else:
            forms = dict(_form(f) for f in args.form)
            out = convert(args.src, args.dst, args.dtype, args.name, args.template,
                          15 if args.shard_mb is None else args.shard_mb, args.force, args.quant, args.group,
                          forms, args.half_scales)
    except (ValueError, FileNotFoundError) as e:
        print(f"tinyllm.formats.convert: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
