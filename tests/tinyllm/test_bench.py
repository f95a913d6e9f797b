"""A quick run of tinyllm-bench on the CPU: the JSON lines parse and hold the expected metrics
(speeds are never asserted)."""

import json

import pytest
import torch

from tinyllm.core.model import ModelConfig, Transformer
from tinyllm.kernels import cpu_qgemv
from tinyllm.tools.bench import kv_bytes, main, weight_bytes


def run(capsys, *argv: str) -> tuple[int, list[dict], str]:
    rc = main(["--preset", "tiny", "--device", "cpu", "--steps", "3", "--repeats", "1", *argv])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines()], err


def test_decode_metrics(capsys):
    rc, recs, err = run(capsys, "--prompt-lens", "16,64,4096")
    assert rc == 0
    assert {r["metric"] for r in recs} == {"bandwidth_gb_s", "ttft_ms", "decode_tok_s", "bucket_tok_s",
                                           "bw_fraction"}
    for r in recs:
        assert r["value"] > 0 and r["unit"]
        assert (r["model"], r["device"], r["dtype"]) == ("tiny", "cpu", "float32")
    assert [r["prompt_len"] for r in recs if r["metric"] == "ttft_ms"] == [16, 64]  # 4096 > max_seq_len
    steps = ["static_eager", "static_eager_native"] if cpu_qgemv.available() else ["static_eager"]  # (cpu_step)
    assert sorted(r["impl"] for r in recs if r["metric"] == "decode_tok_s") == ["generate", *steps]
    for impl in steps:
        assert [r["window"] for r in recs if r["metric"] == "bucket_tok_s" and r["impl"] == impl] == [128, 256, 512, 1024]
        assert [r["window"] for r in recs if r["metric"] == "bw_fraction" and r["impl"] == impl] == [128, 256, 512, 1024]
    assert "decode_tok_s" in err and "bucket_tok_s" in err  # the table


def test_engine_metrics(capsys):
    rc, recs, _ = run(capsys, "--engine", "--concurrency", "1,3")
    assert rc == 0
    assert [(r["metric"], r["concurrency"]) for r in recs] == [("engine_tok_s", 1), ("engine_tok_s", 3)]
    assert all(r["value"] > 0 and r["unit"] == "tok/s" for r in recs)


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    for argv in (["--preset", "nope"], ["--preset", "tiny", "--steps", "0"],
                 ["--model", str(tmp_path / "missing")]):
        assert main([*argv, "--device", "cpu"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("tinyllm-bench: error: ") and err.count("\n") == 1, err


def test_bytes_per_step():
    cfg = ModelConfig.from_name("tiny")
    model = Transformer(cfg)
    matrices = sum(p.numel() for p in model.parameters()) - cfg.vocab_size * cfg.dim  # no embedding
    assert weight_bytes(model) == 4 * matrices
    assert kv_bytes(model, 128) == 2 * cfg.n_layers * cfg.n_kv_heads * 128 * cfg.head_dim * 4
    tied = Transformer(ModelConfig.from_name("tiny", tie_embeddings=True))
    assert weight_bytes(tied) == 4 * sum(p.numel() for p in tied.parameters())  # the head reads it all


def test_chat_ttft_metrics(capsys, tmp_path):
    from tinyllm.tools.testing import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path / "tiny")
    rc = main(["--model", str(path), "--device", "cpu", "--chat-turns", "4"])
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 0
    turns = [r for r in recs if r["metric"] == "chat_ttft_ms"]
    assert [r["turn"] for r in turns] == [1, 2, 3, 4]
    assert all(r["prefilled"] < turns[-1]["position"] for r in turns[1:])  # each turn prefills only its new ids
    assert [r["kind"] for r in recs if r["metric"] == "chat_ttft_ratio"] == ["turn4/turn2"]


def test_profile_needs_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this checks the refusal without CUDA")
    assert main(["--preset", "tiny", "--device", "cpu", "--profile"]) == 2
    assert "--profile needs CUDA" in capsys.readouterr().err
