"""Issue 31, section 4: a sampling value no reply can use is refused where it is made, in one line
that names the setting's range (tinyllm.decode.sampling_params.check); the ends of every range give
real replies, in the plain step and in the native CPU step."""

import pytest

from tinyllm.decode.sampling_params import LIMITS, SamplingParams
from tinyllm.session.chat import open_session
from tinyllm.tools.testing import make_tiny_checkpoint

# Each was accepted; the first four failed every reply ("value cannot be converted to type float
# without overflow", OverflowError), the next three made every reply NaN noise (" ⁇  ⁇  ⁇").
REFUSED = [("temperature", 1e308), ("top_k", 10**30), ("repeat_penalty", 1e308), ("temperature", float("inf")),
           ("temperature", 1e-40), ("top_p", 1e-300), ("repeat_penalty", 1e-40),
           ("temperature", -1.0), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5), ("repeat_penalty", 0.0),
           ("max_tokens", 0), ("max_tokens", 10**30), ("seed", 2**64), ("temperature", float("nan"))]
ENDS = [("temperature", "0.001"), ("temperature", "100"), ("top_k", "1"), ("top_k", "1000000"), ("top_p", "0.001"),
        ("repeat_penalty", "0.01"), ("repeat_penalty", "100"), ("max_tokens", "1000000")]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny", max_seq_len=64)


@pytest.mark.parametrize("name, value", REFUSED, ids=lambda x: str(x)[:12])
def test_values_no_reply_can_use_are_refused_with_the_range(name, value):
    says = f"{name} must be {LIMITS[name][2]}, got "
    with pytest.raises(ValueError) as made:
        SamplingParams(**{name: value})
    assert str(made.value) == says + repr(value)
    with pytest.raises(ValueError) as parsed:  # as /set, a stored chat and the child's set_param parse it
        SamplingParams().with_value(name, str(value))
    assert str(parsed.value).startswith(says) and "\n" not in str(parsed.value)


def test_text_that_is_no_number_is_refused_with_the_range():
    with pytest.raises(ValueError, match=r"^top_k must be from 0 \(off\) to 1,000,000, got '10\^30'$"):
        SamplingParams().with_value("top_k", "10^30")
    with pytest.raises(ValueError, match="unknown setting 'warmth'"):
        SamplingParams().with_value("warmth", "1")


@pytest.mark.parametrize("compile", [None, "auto"], ids=["plain", "native"])
def test_the_ends_of_every_range_give_real_replies(ckpt, compile):
    s = open_session(ckpt, "cpu", compile=compile)
    for name, value in ENDS:
        for k, v in [("temperature", "0.8"), ("top_k", "0"), ("top_p", "1"), ("repeat_penalty", "1.1"),
                     ("max_tokens", "6"), ("seed", "1"), (name, value)]:
            s.set_param(k, v)
        *_, done = s.send("Hello there")  # was: an error, or NaN noise (every id 0)
        drawn = s.messages[-1].ids[:done.stats.tokens]
        assert done.reason in ("max_tokens", "eos", "context_full") and set(drawn) != {0}, (name, value, drawn)
        s.new_chat()
