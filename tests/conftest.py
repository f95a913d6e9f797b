"""Shared fixtures: a tiny random model on the CPU; `@pytest.mark.cuda` tests skip without CUDA,
and none ends while a background compile it started still runs. A test that hangs (setup, call
or teardown past HANG_S) ends the run with every thread's stack on stderr, instead of holding
CI until its limit with nothing to read."""

import faulthandler
import os
import threading

import pytest
import torch

from tinyllm.model import ModelConfig, Transformer

HANG_S = 900  # the slowest test takes about 60 s on the 2-core CPU
_stderr = -1  # the terminal's stderr, which pytest's capturing of a test's output leaves alone


def pytest_configure(config):
    global _stderr
    config.addinivalue_line("markers", "cuda: needs a CUDA device (run on the H200)")
    _stderr = os.dup(2)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item):
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=_stderr)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_sessionfinish(session):
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=_stderr)  # the end too (event loops shut down)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_compile_outlives_a_cuda_test(request):
    """A session's background compile runs on a daemon thread; left running past its test, its
    CUDA work lands beside the next test's graph capture and invalidates it (seen on the H200:
    one test's two sessions, still compiling, broke the captures of the 13 tests after it).
    CUDA tests therefore end only once every compile thread has."""
    yield
    if request.node.get_closest_marker("cuda") is None:
        return
    for t in threading.enumerate():
        if t.name == "tinyllm-compile":
            t.join(timeout=600)


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.from_name("tiny", **overrides)).init_weights(seed).eval()


@pytest.fixture(scope="module")
def model() -> Transformer:
    return tiny_model()
