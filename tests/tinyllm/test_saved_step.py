"""The compiled step saved and loaded (tinyllm.decode.saved_step): a loaded step runs as the step it was
saved from, against the plain step at every bucket; guards that refuse a decoder fall back to
tracing the step, never to an error; a damaged file is compiled anew."""

import pytest
import torch

from tests.tinyllm.forced import assert_same_draws
from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import saved_step
from tinyllm.decode.compile_step import compile_step
from tinyllm.decode.saved_step import SavedStep

MAX_LEN = 128


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
    """The tiny model's greedy step, compiled ahead of time, saved, and loaded back."""
    path = tmp_path_factory.mktemp("saved") / "step.step"
    compile_step(model, 1, MAX_LEN, "inductor", None, True, path)
    assert path.exists()
    return saved_step.load(path)


def decode(model, fn, steps: int, batch: int = 1, backend: str | None = "inductor", feed=None):
    """(token ids, logits of each step) of `steps` steps from the same prompt: the plain step
    where fn is None, else the given saved step. Each step is fed the draw of the step before,
    or with feed (B, steps) the ids another decode drew (teacher-forced: the compiled and the
    plain step's arithmetic differ, and run free they would part at the first near-tie)."""
    torch.manual_seed(0)
    dec = GraphDecoder(model, batch, max_len=MAX_LEN, buckets=(16, 32, 64, 128), use_graph=False)
    if fn is not None:
        dec.set_compile(backend, fn)
    dec.prefill(torch.arange(1, 6).repeat(batch, 1))
    dec.tok.zero_()  # the first token fed: any, the same for every step compared
    ids, logits = [], []
    with torch.no_grad():
        for i in range(steps):
            if feed is not None and i > 0:
                dec.tok.copy_(feed[:, i - 1:i])
            logits.append(dec.run(1).clone())
            ids.append(dec.tok.clone())
    return dec, torch.cat(ids, 1), torch.cat(logits, 1)


def test_a_loaded_step_decodes_as_the_plain_step_across_buckets(model, saved):
    steps = 70  # from position 5 past the 16-, 32- and 64-key buckets
    _, want_ids, want_logits = decode(model, None, steps)
    dec, ids, logits = decode(model, saved, steps, feed=want_ids)
    assert isinstance(dec._step_fn, SavedStep) and dec._step_fn._step is None  # ran loaded throughout
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    assert_same_draws(want_logits[0], want_ids[0].tolist(), (ids[0].tolist(), logits[0]))
    assert len({dec.bucket(n) for n in range(6, 6 + steps)}) >= 3


def test_a_decoder_the_guards_refuse_traces_the_step_instead(model, saved):
    dec, ids, logits = decode(model, saved, 4, batch=2, backend="eager")  # saved for one row
    _, want_ids, want_logits = decode(model, None, 4, batch=2)
    assert dec._step_fn._step is not None  # refused once, traced from then on
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logits, want_logits)


def test_a_damaged_file_is_removed_and_loads_as_nothing(tmp_path):
    path = tmp_path / "step.step"
    path.write_bytes(b"not a compiled step")
    assert saved_step.load(path) is None and not path.exists()
    assert saved_step.load(tmp_path / "missing.step") is None


def test_a_step_that_cannot_be_built_ahead_is_compiled_the_usual_way(model, tmp_path, monkeypatch):
    def refuse(*args):
        raise RuntimeError("not serializable")

    monkeypatch.setattr(saved_step, "build", refuse)
    path = tmp_path / "step.step"
    assert compile_step(model, 1, MAX_LEN, "eager", None, True, path) is None  # ran, traced
    assert not path.exists()
