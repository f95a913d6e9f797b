"""One load rule for every format (tinyllm.formats.load_policy, its table tinyllm.formats.quant_rule), one
default, one skeleton (tinyllm.formats.model_format), and --help that states the rule the code runs."""

import inspect

import pytest
import torch

from tests.conftest import tiny_model
from tinyllm.core.linear import DenseLinear
from tinyllm.core.quant import QTensor
from tinyllm.core.quant_linear import QuantLinear
from tinyllm.formats import load_policy
from tinyllm.formats.build import quantize_model
from tinyllm.formats.checkpoint import load_checkpoint, save_checkpoint
from tinyllm.formats.model_format import load_model
from tinyllm.formats.open_model import format_of, open_any
from tinyllm.formats.quant_rule import AUTO, DEFAULT, MEANING, QUANTS, quant_help
from tinyllm.kernels import cpu_qgemv
from tinyllm.tools.testing import make_tiny_tokenizer

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object needs no GPU


def test_auto_is_the_tables_entry_on_each_device(monkeypatch):
    """On CUDA every matrix dense in bf16; on a CPU what the file stores, an int4 matrix as int8
    where only fbgemm's int8 kernel is fast (no AVX2 kernel); other quants as asked."""
    for device in (CPU, CUDA):
        assert load_policy.resolve_quant("auto", device) == AUTO[device.type]
        for quant in QUANTS[1:]:
            assert load_policy.resolve_quant(quant, device) == quant
    cuda = load_policy.holding(CUDA, "auto", {"int4", "int8"})
    assert (cuda.quant, cuda.dtype, cuda.int4_as) == ("none", torch.bfloat16, "int4")
    monkeypatch.setattr(load_policy, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(load_policy, "fbgemm_available", lambda: True)
    for kernel, int4_as in ((True, "int4"), (False, "int8")):
        monkeypatch.setattr(cpu_qgemv, "available", lambda kernel=kernel: kernel)
        cpu = load_policy.holding(CPU, "auto", {"int4"})
        assert (cpu.quant, cpu.dtype, cpu.int4_as) == ("keep", torch.float32, int4_as)
        assert load_policy.holding(CPU, "keep", {"int4"}).int4_as == "int4"  # only auto adapts


def test_every_loader_and_session_defaults_to_the_one_rule():
    """The default quant was "keep" for checkpoints and "none" for the rest: now DEFAULT
    ("auto", as the app) everywhere a model is opened."""
    from tinyllm.formats.gguf import load_gguf
    from tinyllm.formats.hf import load_hf
    from tinyllm.session.chat import open_session

    assert DEFAULT == "auto"
    for f in (open_any, load_checkpoint, load_hf, load_gguf, load_model, open_session):
        assert inspect.signature(f).parameters["quant"].default == DEFAULT, f.__qualname__


def test_every_format_follows_the_skeleton():
    for kind in ("tinyllm", "hf", "gguf"):
        fmt = format_of(kind)
        assert list(inspect.signature(fmt.inspect).parameters) == ["path", "template"], kind
        assert list(inspect.signature(fmt.tensors).parameters) == ["spec", "quant", "dtype", "progress"], kind


@torch.no_grad()
def test_a_quantized_checkpoint_opens_on_a_cpu_as_auto_says(tmp_path):
    model = quantize_model(tiny_model(tie_embeddings=True, ffn_dim=192), "int8")
    path = save_checkpoint(model, make_tiny_tokenizer(tmp_path / "tok"), tmp_path / "ckpt")
    default = open_any(path, "cpu").model
    kept = open_any(path, "cpu", quant=AUTO["cpu"]).model
    assert isinstance(default.blocks[0].attn.wqkv, QuantLinear)
    ids = torch.randint(0, 512, (1, 12))
    assert torch.equal(default(ids)[0], kept(ids)[0])
    dense = load_checkpoint(path, "cpu", quant="none").model
    assert type(dense.blocks[0].attn.wqkv) is DenseLinear


def test_a_gguf_is_read_dense_for_cuda_under_auto(tmp_path):
    """What "auto" reads for CUDA (no GPU needed: the tensors, before they move): every GGUF
    matrix dequantized, in bf16, read once (not as a QTensor first)."""
    from tests.tinyllm.test_gguf import MIXED, sp_kv, tiny, write_gguf
    from tinyllm.formats import gguf

    tok = make_tiny_tokenizer(tmp_path / "tok")
    path = tmp_path / "m.gguf"
    write_gguf(path, tiny(tok.vocab_size, tie=False), MIXED, sp_kv(tok))
    with gguf.inspect(path) as spec:
        assert spec.stored == {"int4", "int8"}
        hold = load_policy.holding(CUDA, "auto", spec.stored)
        state = gguf.tensors(spec, hold.quant, hold.dtype)
        kept = gguf.tensors(spec, load_policy.holding(CPU, "auto", spec.stored).quant, torch.float32)
    assert not any(isinstance(t, QTensor) for t in state.values())
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    assert {t.kind for t in kept.values() if isinstance(t, QTensor)} == spec.stored


def _help(main, *argv) -> str:
    """A CLI's --help, its lines joined (argparse wraps them)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(out.getvalue().split())


def test_every_quant_help_states_the_rule_the_loader_runs():
    """tinyllm-chat, tinyllm-bench and tinyllm.tools.eval say what --quant auto does on CUDA and on a
    CPU in the words of the table the loader reads, and default to that rule."""
    from chat_app.__main__ import QUANT_CHOICES, build_parser
    from chat_app.__main__ import main as chat_main
    from tinyllm.tools.bench import main as bench_main
    from tinyllm.tools.bench import parse_args
    from tinyllm.tools.eval.__main__ import main as eval_main

    for device in (CUDA, CPU):
        where = "on CUDA" if device.type == "cuda" else "on a CPU"
        assert f"{where} {MEANING[load_policy.resolve_quant('auto', device)]}" in quant_help()
    for main, choices in ((chat_main, QUANT_CHOICES), (bench_main, QUANTS), (eval_main, QUANTS)):
        assert quant_help(choices) in _help(main), main.__module__
    assert build_parser().parse_args([]).quant == parse_args([]).quant == DEFAULT
