"""Shared fixtures: a tiny random model on the CPU; `@pytest.mark.cuda` tests skip without CUDA."""

import pytest
import torch

from tinyllm.model import ModelConfig, Transformer


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (run on the H200)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.from_name("tiny", **overrides)).init_weights(seed).eval()


@pytest.fixture(scope="module")
def model() -> Transformer:
    return tiny_model()
