"""The context a model opens with: its own, unless the memory budget cuts it (then the status bar
says "cap", one notice, F1 and /show say why and how to raise it) or --max-len asks for less;
more than the model's own is refused in one line (tinyllm.session.context)."""

from __future__ import annotations

import pytest

from chat_app import config
from chat_app.__main__ import build_app, build_parser
from tests.chat_app.conftest import loaded, notices, wait_until
from tinyllm.model import ModelConfig
from tinyllm.session.chat import open_session
from tinyllm.session.context import FLOOR, choose_context, kv_bytes_per_position
from tinyllm.tools.testing import make_tiny_checkpoint

pytestmark = pytest.mark.anyio
LONG = 4 * FLOOR  # the tiny model's own context


@pytest.fixture(scope="module")
def long_ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("long") / "tiny", max_seq_len=LONG)


def test_a_session_opens_with_the_models_own_context(long_ckpt):
    s = open_session(long_ckpt, "cpu", compile=None)
    assert (s.max_len, s.model_max_len, s.decoder.cache.max_len) == (LONG, LONG, LONG)
    assert s.context_note == ""


def test_the_budget_cuts_the_context_and_says_why(long_ckpt):
    s = open_session(long_ckpt, "cpu", compile=None, context_budget=1e-12)
    assert s.max_len == FLOOR < s.model_max_len and s.decoder.cache.max_len == FLOOR
    assert "memory budget" in s.context_note and f"--max-len {LONG}" in s.context_note


def test_max_len_asks_for_less_and_never_for_more(long_ckpt):
    assert open_session(long_ckpt, "cpu", compile=None, max_len=1000).max_len == 1000
    with pytest.raises(ValueError, match=f"more than the model's context of {LONG} positions"):
        open_session(long_ckpt, "cpu", compile=None, max_len=LONG + 1)


def test_the_budget_is_a_share_of_what_is_free():
    cfg = ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=131072)
    per = kv_bytes_per_position(cfg, 2)
    assert per == 2 * 2 * 2 * 16 * 2
    whole = choose_context(cfg, __import__("torch").device("cpu"), budget=1.0)
    assert whole.free > 0 and whole.max_len == min(131072, max(FLOOR, whole.free // per // 256 * 256))
    with pytest.raises(ValueError, match="0 < budget <= 1"):
        choose_context(cfg, __import__("torch").device("cpu"), budget=1.5)


@pytest.mark.parametrize("budget", [None, 1e-12])
async def test_the_app_says_when_the_budget_cuts_the_context(long_ckpt, budget, tmp_path, monkeypatch):
    if budget is not None:
        (tmp_path / "config.toml").write_text(f"context_budget = {budget}\n")
    monkeypatch.setenv("TINYLLM_CHAT_CONFIG_DIR", str(tmp_path))
    argv = ["--model", str(long_ckpt), "--device", "cpu", "--compile", "off"]
    app = build_app(build_parser(config.load()).parse_args(argv))
    async with app.run_test(size=(160, 30)) as pilot:
        await loaded(pilot)
        if budget:
            await wait_until(pilot, lambda: any("memory budget" in n for n in notices(app)), what="the notice")
        await pilot.pause()
        said = [n for n in notices(app) if "memory budget" in n]
        if budget:
            assert f"/{FLOOR} cap" in app.status.line and len(said) == 1 and f"--max-len {LONG}" in said[0]
            await app.run_action("help")
            await pilot.pause()
            assert "memory budget" in str(app.screen.about)
        else:
            assert f"/{LONG} " in app.status.line and " cap" not in app.status.line and not said
