"""The default context cap: a model with more positions than DEFAULT_CONTEXT opens with that
many (the static cache is allocated whole), says so once, and --max-len lifts the cap."""

from __future__ import annotations

import pytest

from chat_app.__main__ import build_app, build_parser
from tests.chat_app.conftest import loaded, notices, wait_until
from tinyllm.session.chat import DEFAULT_CONTEXT, open_session
from tinyllm.tools.testing import make_tiny_checkpoint

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def long_ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("long") / "tiny", max_seq_len=2 * DEFAULT_CONTEXT)


def test_session_context_is_capped_unless_asked(long_ckpt):
    s = open_session(long_ckpt, "cpu", compile=None)
    assert (s.max_len, s.model_max_len) == (DEFAULT_CONTEXT, 2 * DEFAULT_CONTEXT)
    assert s.decoder.cache.max_len == DEFAULT_CONTEXT
    full = open_session(long_ckpt, "cpu", compile=None, max_len=2 * DEFAULT_CONTEXT)
    assert full.max_len == full.model_max_len


@pytest.mark.parametrize("argv, capped", [([], True), (["--max-len", str(2 * DEFAULT_CONTEXT)], False)])
async def test_app_says_the_context_is_capped_and_how_to_lift_it(long_ckpt, argv, capped):
    app = build_app(build_parser().parse_args(["--model", str(long_ckpt), "--device", "cpu", "--compile", "off",
                                               *argv]))
    async with app.run_test(size=(160, 30)) as pilot:
        await loaded(pilot)
        if capped:
            await wait_until(pilot, lambda: any("capped" in n for n in notices(app)), what="the notice")
        await pilot.pause()
        said = [n for n in notices(app) if "capped" in n]
        if capped:
            assert f"/{DEFAULT_CONTEXT} cap" in app.status.line and len(said) == 1
            assert f"--max-len {2 * DEFAULT_CONTEXT}" in said[0]
        else:
            assert f"/{2 * DEFAULT_CONTEXT} " in app.status.line and " cap" not in app.status.line and not said
