"""tinyllm-bench --late-context (tinyllm.tools.bench_late): the native step from an early and a
late start, per K/V dtype, and their ratio, as JSON lines (speeds never asserted)."""

import json

import pytest

from tinyllm.kernels import cpu_qgemv
from tinyllm.tools.bench import main

pytestmark = pytest.mark.skipif(not cpu_qgemv.available(), reason="the CPU kernels cannot be built here")


def test_late_context_rows(capsys):
    rc = main(["--preset", "tiny", "--device", "cpu", "--steps", "3", "--repeats", "1", "--late-context", "10,300"])
    out, _ = capsys.readouterr()
    recs = [json.loads(line) for line in out.splitlines()]
    assert rc == 0
    rows = [(r["metric"], r["kv_dtype"], r.get("start")) for r in recs]
    assert rows == [row for d in ("bf16", "fp32", "int8")
                    for row in [("decode_tok_s", d, 10), ("decode_tok_s", d, 300), ("late_over_early", d, None)]]
    assert all(r["value"] > 0 for r in recs)


def test_late_context_refuses_a_late_start_past_the_context(capsys):
    assert main(["--preset", "tiny", "--device", "cpu", "--late-context", "10,5000"]) == 2
    assert "--late-context needs" in capsys.readouterr().err
