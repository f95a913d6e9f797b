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
from tinyllm.formats.quant_rule import AUTO, DEFAULT, MEANING, NO_TRITON, QUANTS, auto_quant, quant_help
from tinyllm.kernels import cpu_qgemv, qgemv
from tinyllm.tools.testing import make_tiny_tokenizer

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object needs no GPU


def test_auto_is_a_pure_function_of_the_device_and_triton():
    """CUDA: what the file stores where Triton's kernels are there, every matrix dense where they
    are not; a CPU (and any other device type) what the file stores."""
    rule = {(d, t): auto_quant(d, t) for d in ("cuda", "cpu", "mps") for t in (True, False)}
    assert rule == {("cuda", True): "keep", ("cuda", False): "none", ("cpu", True): "keep", ("cpu", False): "keep",
                    ("mps", True): "keep", ("mps", False): "keep"}
    assert AUTO == {"cuda": "keep", "cpu": "keep"} and NO_TRITON == "none"


def test_auto_is_the_tables_entry_on_each_device(monkeypatch):
    """resolve_quant asks tinyllm.kernels.qgemv whether Triton is there; on CUDA bf16 either way;
    on a CPU an int4 matrix as int8 where only fbgemm's int8 kernel is fast (no AVX2 kernel);
    other quants as asked."""
    for triton in (True, False):
        monkeypatch.setattr(qgemv, "available", lambda triton=triton: triton)
        for device in (CPU, CUDA):
            assert load_policy.resolve_quant("auto", device) == auto_quant(device.type, triton)
            for quant in QUANTS[1:]:
                assert load_policy.resolve_quant(quant, device) == quant
        cuda = load_policy.holding(CUDA, "auto", {"int4", "int8"})
        assert (cuda.quant, cuda.dtype, cuda.int4_as) == ("keep" if triton else "none", torch.bfloat16, "int4")
    for stored in (torch.float16, torch.bfloat16, torch.float32):  # a kept file's dense matrices on CUDA
        assert load_policy.matrix_dtype(stored, CUDA, torch.bfloat16, "keep") == torch.bfloat16
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


def test_a_gguf_is_read_for_cuda_as_auto_says(tmp_path, monkeypatch):
    """What "auto" reads for CUDA (no GPU needed: the tensors, before they move): with Triton every
    quantized matrix in the form the file stores and the F16 / BF16 ones as stored (the build
    holds them in bf16); without it every matrix dequantized, in bf16, read once (not as a
    QTensor first)."""
    from tests.tinyllm.test_gguf import MIXED, sp_kv, tiny, write_gguf
    from tinyllm.formats import gguf

    tok = make_tiny_tokenizer(tmp_path / "tok")
    path = tmp_path / "m.gguf"
    write_gguf(path, tiny(tok.vocab_size, tie=False), MIXED, sp_kv(tok))
    with gguf.inspect(path) as spec:
        assert spec.stored == {"int4", "int8"}
        monkeypatch.setattr(qgemv, "available", lambda: True)  # the host's Triton, or CI's lack of it, aside
        hold = load_policy.holding(CUDA, "auto", spec.stored)
        kept = gguf.tensors(spec, hold.quant, hold.dtype)
        monkeypatch.setattr(qgemv, "available", lambda: False)
        hold = load_policy.holding(CUDA, "auto", spec.stored)
        dense = gguf.tensors(spec, hold.quant, hold.dtype)
    assert {t.kind for t in kept.values() if isinstance(t, QTensor)} == spec.stored
    assert {t.dtype for t in kept.values() if not isinstance(t, QTensor) and t.dim() == 2} == {
        torch.float16, torch.bfloat16}  # MIXED's F16 and BF16 matrices
    assert not any(isinstance(t, QTensor) for t in dense.values())
    assert {t.dtype for t in dense.values()} == {torch.bfloat16}


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

    for device, triton, where in ((CUDA, True, "on CUDA"), (CUDA, False, "without Triton"), (CPU, True, "on a CPU")):
        assert f"{where} {MEANING[auto_quant(device.type, triton)]}" in quant_help()
    for main, choices in ((chat_main, QUANT_CHOICES), (bench_main, QUANTS), (eval_main, QUANTS)):
        assert quant_help(choices) in _help(main), main.__module__
    assert build_parser().parse_args([]).quant == parse_args([]).quant == DEFAULT
