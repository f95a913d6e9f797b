"""A quick run of tinyllm-bench on the CPU: the JSON lines parse and hold the expected metrics
(speeds are never asserted)."""

import json

import pytest
import torch

from tinyllm.kernels import cpu_qgemv
from tinyllm.model import ModelConfig, Transformer
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


def test_no_buckets_runs_no_bandwidth_probe(capsys, monkeypatch):
    """--no-buckets (the side-by-side table's runs, which read the peak VRAM) skips the 2 GiB probe."""
    import tinyllm.tools.bench as tb

    probes = []
    monkeypatch.setattr(tb, "measure_bandwidth", lambda *a: probes.append(a) or 1e9)
    rc, recs, _ = run(capsys, "--prompt-lens", "16", "--no-buckets")
    assert rc == 0 and probes == []
    assert {r["metric"] for r in recs} == {"ttft_ms", "decode_tok_s"}
    rc, recs, _ = run(capsys, "--prompt-lens", "16")
    assert rc == 0 and len(probes) == 1 and "bw_fraction" in {r["metric"] for r in recs}


@pytest.mark.cuda
def test_the_bandwidth_probe_gives_its_memory_back():
    """Its 2 GiB are neither kept by the caching allocator nor left in the peak a run reports."""
    import tinyllm.tools.bench as tb

    before = torch.cuda.memory_reserved()
    assert tb.measure_bandwidth(torch.device("cuda"), 1) > 0
    assert torch.cuda.memory_reserved() <= before + (64 << 20)
    assert torch.cuda.max_memory_reserved() <= before + (64 << 20)


ENGINE_ROWS = ["engine_tok_s", "engine_step_ms", "engine_live_rows", "engine_host_us", "engine_syncs_per_step",
               "engine_kv_mib", "engine_kv_gb_s", "engine_admit_ms"]


def test_engine_metrics(capsys):
    rc, recs, _ = run(capsys, "--engine", "--concurrency", "1,3")
    assert rc == 0
    assert [(r["metric"], r["concurrency"]) for r in recs] == [(m, c) for c in (1, 3) for m in ENGINE_ROWS]
    assert all(r["value"] > 0 and r["workload"] == "uniform" for r in recs)
    by = {(r["metric"], r["concurrency"]): r for r in recs}
    # 3 requests of 3 greedy tokens: the first from each prefill, two decode steps, every row live
    assert by["engine_live_rows", 3]["value"] == 3 and by["engine_step_ms", 3]["unit"] == "ms"
    assert by["engine_syncs_per_step", 3]["value"] == 1 and by["engine_syncs_per_step", 3]["flagged"] == 0
    # K/V the live rows attend a step: 3 rows over 65 and 66 keys (2 layers, 2 KV heads of 16, fp32)
    assert by["engine_kv_mib", 3]["value"] * 2**20 == pytest.approx(3 * 65.5 * 2 * 2 * 2 * 16 * 4, rel=1e-3)


def test_engine_teacher_workload_and_guard(capsys):
    rc, recs, _ = run(capsys, "--engine", "--concurrency", "2", "--engine-workload", "teacher")
    assert rc == 0 and [r["metric"] for r in recs] == ENGINE_ROWS
    assert all(r["workload"] == "teacher" for r in recs)
    rc, recs, _ = run(capsys, "--engine-guard", "--compile", "off")
    assert rc == 0
    assert [(r["metric"], r.get("max_len")) for r in recs] == [
        ("engine_tok_s", 256), ("engine_tok_s", 4096), ("engine_guard_ratio", None)]
    assert recs[2]["value"] == pytest.approx(recs[1]["value"] / recs[0]["value"], rel=1e-3)


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
