"""tinyllm.tools.bench_long on a CPU, tiny shapes: the rows it reports (speeds are the
device's, never asserted), and its one-line refusals."""

import torch

from tinyllm.tools import bench_long
from tinyllm.tools.bench import Report


def test_starts_and_max_lens_report_each_and_their_ratio():
    model = bench_long.long_model("tiny", 600, torch.device("cpu"))
    assert model.cfg.max_seq_len == 600 and model.dtype == torch.bfloat16
    report = Report()
    bench_long.bench_starts(model.float(), report, [8, 300], steps=4, rounds=1, compile=False)
    rows = {(r["metric"], r["start"]): r["value"] for r in report.rows}
    assert set(rows) == {(m, s) for m in ("decode_tok_s", "over_first") for s in (8, 300)}
    assert rows["over_first", 8] == 1.0 and rows["decode_tok_s", 300] > 0
    report = Report()
    bench_long.bench_max_lens(model.float(), report, rows=2, max_lens=[128, 512], steps=3, rounds=1, compile=False)
    got = {(r["metric"], r["max_len"]) for r in report.rows}
    assert {("engine_capture_s", 128), ("engine_capture_s", 512)} <= got
    assert got == {(m, n) for m in ("engine_capture_s", "engine_tok_s", "over_first", "engine_syncs_per_step")
                   for n in (128, 512)}
    assert "over_first" in bench_long.table(report)


def test_refusals_are_one_line(capsys):
    assert bench_long.main(["--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench_long: error:" in err
