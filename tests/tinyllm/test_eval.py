"""The eval (tinyllm.tools.eval): its prompts and checkers on right and wrong answers, scoring, held-out
loss, the command on the tiny model, and that no eval prompt is in any training data."""

import json
import lzma
import os
from pathlib import Path

import pytest

from tinyllm.text.textcheck import check_reply
from tinyllm.tools.datagen.dedup import LeakFilter
from tinyllm.tools.eval.__main__ import main as eval_main
from tinyllm.tools.eval.__main__ import score
from tinyllm.tools.eval.prompts import load_prompts, user_turns

REPO = Path(__file__).resolve().parents[2]
PROMPTS = load_prompts()


def turns(p):
    return [m["content"] for m in p["messages"] if m["role"] != "system"]


def test_prompts_are_many_mostly_checkable_and_unique():
    assert len(PROMPTS) >= 100
    checkable = [p for p in PROMPTS if p.get("check")]
    assert len(checkable) >= len(PROMPTS) / 2
    assert len({p["id"] for p in PROMPTS}) == len(PROMPTS)
    users = [turns(p)[-1].lower() for p in PROMPTS]
    assert len(set(users)) == len(users)
    assert {p["cat"] for p in PROMPTS} >= {"geography", "science", "history", "arithmetic", "word problem",
                                           "format", "system", "multi-turn", "code", "open"}


@pytest.mark.parametrize("p", [p for p in PROMPTS if p.get("check")], ids=lambda p: p["id"])
def test_checker_passes_the_right_answer_and_fails_wrong_ones(p):
    t = turns(p)
    assert check_reply(p["example"], p["check"], t), "the example answer must pass"
    assert not check_reply("I am not sure.", p["check"], t), "a non-answer must fail"
    assert not check_reply(t[-1], p["check"], t), "saying the question back must fail"


def test_number_checks_read_the_first_new_number():
    assert check_reply("12 + 7 = 19", {"number": 19}, "What is 12 plus 7?")
    assert not check_reply("12 + 7 = 96", {"number": 19}, "What is 12 plus 7?")
    assert not check_reply("12 + 7 = 7", {"number": 19}, "What is 12 plus 7?")
    assert check_reply("It is nineteen.", {"number": 19}, "What is 12 plus 7?")
    assert check_reply("A spider has eight legs.", {"number": 8}, "How many legs does a spider have?")
    assert not check_reply("A spider has six legs, not eight.", {"number": 8}, "How many legs?")


def test_format_checks():
    assert check_reply("- a\n- b\n- c", {"items": 3})
    assert not check_reply("- a\n- b", {"items": 3})
    assert check_reply("It rains because clouds get heavy.", {"sentences": 1})
    assert not check_reply("It rains. Clouds get heavy.", {"sentences": 1})
    assert check_reply("Yes, it is.", {"yes": True}) and not check_reply("No, it is not.", {"yes": True})
    assert check_reply("Sure! Here it is.", {"starts_with": "sure"})


def test_score_counts_correct_loops_and_unfinished():
    by_id = {p["id"]: p for p in PROMPTS}
    ps = [by_id[i] for i in ("math-add-1", "geo-capital-japan", "open-joke-penguin")]
    replies = [{"id": "math-add-1", "reply": "12 plus 7 is 19.", "reason": "eos", "tokens": 8},
               {"id": "geo-capital-japan", "reply": "It is Kyoto, " * 10, "reason": "max_tokens", "tokens": 256},
               {"id": "open-joke-penguin", "reply": "Why did the penguin buy a plane ticket? To finally fly!",
                "reason": "eos", "tokens": 14}]
    s = score(ps, replies)
    assert (s["checkable"], s["correct"], s["loops"], s["unfinished"], s["degenerate"]) == (2, 1, 1, 1, 1)
    assert s["correct_rate"] == 0.5 and s["degenerate_rate"] == pytest.approx(1 / 3)
    assert (s["repeating"], s["tokens"]) == (0, 278)
    replies[1] = {**replies[1], "reply": "It is Kyoto, It is", "reason": "repeating", "tokens": 40}  # the stop's end
    s = score(ps, replies)
    assert (s["loops"], s["unfinished"], s["degenerate"], s["repeating"], s["tokens"]) == (1, 0, 1, 1, 62)


def _tiny_data(folder: Path) -> Path:
    folder.mkdir(parents=True)
    convs = [{"messages": [{"role": "user", "content": f"Tell me about the number {i}."},
                           {"role": "assistant", "content": f"The number {i} comes after {i - 1}. Hello!"}]}
             for i in range(400)]
    with lzma.open(folder / "chat-000.jsonl.xz", "wt") as f:
        f.writelines(json.dumps(c) + "\n" for c in convs)
    return folder


def test_eval_command_on_the_tiny_model(tmp_path):
    from tinyllm.tools.testing import make_tiny_checkpoint

    model = make_tiny_checkpoint(tmp_path / "tiny", max_seq_len=256)
    data = _tiny_data(tmp_path / "data")
    out = tmp_path / "report.json"
    assert eval_main(["--model", str(model), "--device", "cpu", "--limit", "4", "--max-tokens", "8",
                      "--heldout", str(data), "--json", str(out), "--quiet"]) == 0
    rep = json.loads(out.read_text())
    assert rep["prompts"] == 4 and len(rep["replies"]) == 4 and rep["checkable"] == 4
    assert rep["unfinished"] == sum(r["reason"] not in ("eos", "repeating") for r in rep["replies"])
    held = rep["heldout"]
    assert held["rows"] >= 1 and held["tokens"] > 0 and 0 < held["nats_per_token"] < 20
    assert 0 < held["nats_per_byte"] < held["nats_per_token"]
    assert eval_main(["--model", str(tmp_path / "missing")]) == 2


# ---- the eval prompts never appear in training data ---------------------------------------

def training_dirs() -> list[Path]:
    """Every training data folder this checkout holds (data/*/ with *.jsonl.xz), plus
    $TINYLLM_TRAIN_DATA (folders separated by ':')."""
    dirs = [d for d in sorted((REPO / "data").glob("*")) if d.is_dir() and list(d.glob("*.jsonl.xz"))]
    dirs += [Path(d) for d in os.environ.get("TINYLLM_TRAIN_DATA", "").split(":") if d]
    return dirs


def test_leak_filter_flags_every_eval_prompt():
    f = LeakFilter(user_turns(PROMPTS))
    for p in PROMPTS:
        assert f.leaks(turns(p)[-1]) is not None


@pytest.mark.skipif(not training_dirs(), reason="no training data in data/ (set-up never needs it)")
@pytest.mark.parametrize("folder", training_dirs(), ids=lambda d: d.name)
def test_no_eval_prompt_in_training_data(folder):
    leak = LeakFilter(user_turns(PROMPTS))  # the filter the generator applies to every user turn
    found = []
    for path in sorted(folder.glob("*.jsonl.xz")):
        with lzma.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                for m in json.loads(line)["messages"]:
                    if m["role"] == "user" and (hit := leak.leaks(m["content"])):
                        found.append((path.name, m["content"][:80], hit))
    assert not found, f"{len(found)} eval prompts in {folder}: {found[:5]}"
