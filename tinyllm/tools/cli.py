"""`tinyllm`: the library's one command, a subcommand per tool (like git or cargo).

    tinyllm convert SRC DST        tinyllm.formats.convert: a tinyllm checkpoint folder from any model
                                   (--to hf: a Hugging Face folder, for transformers, vLLM, SGLang)
    tinyllm train ...              tinyllm.tools.train: a tokenizer or a model from chat JSONL
    tinyllm eval ...               tinyllm.tools.eval: judge a model's answers
    tinyllm bench ...              tinyllm.tools.bench (also installed as `tinyllm-bench`)
    tinyllm vocab-transfer ...     tinyllm.tools.vocab_transfer: a BPE model onto a new vocabulary
    tinyllm datagen ...            tinyllm.tools.datagen: distillation data from a teacher

Contract: `main(argv)` runs the subcommand's own `main(rest)` and returns its exit code; each
tool's module is imported only when its subcommand runs, so `tinyllm --help` is instant. An
unknown subcommand is one line on stderr and exit code 2, as argparse does.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module whose main(argv) runs it, one line for --help)
COMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("tinyllm.formats.convert", "write a tinyllm (or, --to hf, a Hugging Face) folder from any model"),
    "train": ("tinyllm.tools.train", "train a tokenizer or a model from chat JSONL"),
    "eval": ("tinyllm.tools.eval.__main__", "judge a model's answers to held-out prompts"),
    "bench": ("tinyllm.tools.bench", "measure decode speed (JSON lines and a table)"),
    "bench-long": ("tinyllm.tools.bench_long", "decode speed late in a long context against early (CUDA)"),
    "vocab-transfer": ("tinyllm.tools.vocab_transfer", "move a byte-level BPE model onto a new vocabulary"),
    "datagen": ("tinyllm.tools.datagen.__main__", "generate distillation data with a teacher model"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="tinyllm", description="tinyllm's tools; `tinyllm COMMAND --help` for each.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="commands:\n" + "\n".join(f"  {n:<16}{h}" for n, (_, h) in COMMANDS.items()))
    p.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="one of: " + ", ".join(COMMANDS))
    p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = p.parse_args(argv[:1])  # the subcommand's own flags, --help included, are its own
    module = importlib.import_module(COMMANDS[ns.command][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
