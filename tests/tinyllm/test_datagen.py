"""The data generator (tinyllm.tools.datagen): filters and dedup on constructed text, the batched
sampler against the engine and generate(), determinism, shards, and whole runs: a scripted
teacher through a round into shards, and the CLI on the tiny random model."""

import json
import lzma

import pytest
import torch

from tests.conftest import tiny_model
from tests.tinyllm.test_engine import assert_generates
from tinyllm.decode.engine import Engine
from tinyllm.decode.sampling import SamplingParams
from tinyllm.text.textcheck import has_loop, is_english, numbers
from tinyllm.tools import data
from tinyllm.tools.datagen.__main__ import main as datagen_main
from tinyllm.tools.datagen.dedup import LeakFilter, NearDup, shingles
from tinyllm.tools.datagen.plan import Meta, expand, load_tasks, plan_round
from tinyllm.tools.datagen.rounds import Filters, judge_answer, judge_user, run_round
from tinyllm.tools.datagen.shards import pack, read_rounds, write_round
from tinyllm.tools.datagen.teacher import Reply

# ---- text filters -------------------------------------------------------------------------


def test_loop_filter_catches_repeated_4grams_and_sentences_only():
    assert has_loop("The sea is a place where people come together. " * 2)
    assert has_loop("some are gentle creatures, some are gentle creatures, some are gentle creatures")
    assert not has_loop("Paris is the capital of France. It is known for the Eiffel Tower and its cafes.")
    assert not has_loop("- Use a timer.\n- Use a notebook.\n- Take breaks.")


def test_language_filter():
    assert is_english("The capital of France is Paris, and it is a lovely city to visit in spring.")
    assert not is_english("La capitale de la France est Paris, une ville magnifique au printemps.")
    assert not is_english("Die Hauptstadt von Deutschland ist Berlin, eine große Stadt mit viel Geschichte.")
    assert not is_english("東京は日本の首都です。")
    assert is_english("Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nThis adds the two numbers.")


def test_numbers_reads_numerals_and_words():
    assert numbers("12 + 7 = 19, nineteen, forty-two, three hundred and five, 1,200, 3.5") == \
        [12, 7, 19, 19, 42, 305, 1200, 3.5]


def test_judge_answer_names_each_reason():
    ok = "Paris is the capital of France."
    assert judge_answer(ok, True, "What is the capital of France?") is None
    assert judge_answer(ok, False, "q") == "truncated"
    assert judge_answer(" ", True, "q") == "empty"
    assert judge_answer("I like it. " + "I like the sea and the sky. " * 3, True, "q") == "loop"
    assert judge_answer("Je ne sais pas du tout quelle est la réponse à cette question.", True, "q") == "language"
    assert judge_answer("I am SmolLM, an assistant made by Hugging Face.", True, "q") == "identity"
    assert judge_answer("What is the capital of France?", True, "What is the capital of France?") == "echo"
    assert judge_answer("12 + 7 = 96.", True, "What is 12 plus 7?", expect=19) == "wrong_math"
    assert judge_answer("12 + 7 = 19.", True, "What is 12 plus 7?", expect=19) is None
    assert judge_answer("One. Two. Three.", True, "q", system_check={"max_sentences": 1}) == "system_ignored"


def test_judge_user_names_each_reason():
    f = Filters(LeakFilter(["What is the capital of Japan?"]))
    assert judge_user("How do bees make honey from the flowers they visit?", f) is None
    assert judge_user("How do bees make honey from the flowers they visit??", f) == "dup_question"
    assert judge_user("Comment les abeilles font-elles du miel avec les fleurs?", f) == "language"
    assert judge_user("why why why is the sky sky blue why why why is the sky sky blue why why why is the sky", f) == "loop"
    assert judge_user("What is the capital of Japan?", f) == "leak"


# ---- dedup and leaks ----------------------------------------------------------------------

def test_near_dup_rejects_exact_and_near_copies_keeps_new():
    d = NearDup(0.7)
    q = "Why do leaves change color in the autumn when the days get shorter and colder in the north?"
    assert d.add(q)
    assert not d.add(q.upper().replace("?", "!"))  # exact after normalization
    assert not d.add(q.replace("north", "northern hemisphere"))  # one word changed: near
    assert d.add("How do volcanoes form and why do some of them erupt while others stay quiet?")
    assert d.add("Why do leaves fall?")
    assert len(d) == 3


def test_shingles_are_deterministic_and_normalized():
    assert shingles("Hello, World! how are you") == shingles("hello world how are you")
    assert len(shingles("one two")) == 1


def test_leak_filter_exact_contained_and_near_not_different():
    f = LeakFilter(["What is the capital of Japan?", "Tell me a joke."])
    assert f.leaks("what is the capital of japan") == "What is the capital of Japan?"
    assert f.leaks("Quick question. What is the capital of Japan? Thanks!") == "What is the capital of Japan?"
    assert f.leaks("Tell me a joke.") == "Tell me a joke."
    assert f.leaks("Tell me a joke about cats.") is None  # short generic prompts leak only exactly
    assert f.leaks("What is the capital of Peru?") is None


# ---- planning -----------------------------------------------------------------------------

def test_plan_is_a_function_of_seed_and_round():
    t = load_tasks()
    a, b = plan_round(t, 0, 3, 200), plan_round(t, 0, 3, 200)
    assert a == b
    assert plan_round(t, 0, 4, 200) != a and plan_round(t, 1, 3, 200) != a
    items, metas = a
    assert sum(1 for _ in items) + sum(m.n for m in metas) >= 200
    assert {i.src.split(".")[0] for i in items} >= {"math", "wp", "chat"}
    assert all(i.expect is not None for i in items if i.src.startswith(("math", "wp")))


def test_expand_cleans_numbered_lines_and_keeps_questions_that_name_the_topic():
    m = Meta("q.science", "...", 5, question=True, topic="rainbows and the sky")
    got = expand(m, '1. Why is the sky blue?\n2) "How do rainbows form"\n- This is not a question about rainbows.\n'
                    "Q4: Why?\n5. What makes a rainbow appear after rain? 6. How does it work?")
    assert [i.user for i in got] == ["Why is the sky blue?", "How do rainbows form?",
                                     "What makes a rainbow appear after rain?"]
    cut = expand(m, "1. Why is the sky blue? 2. How do rainbows form? 3. What makes a rainbow", complete=False)
    assert [i.user for i in cut] == ["Why is the sky blue?", "How do rainbows form?"]
    talk = expand(m, '1. "What is a rainbow made of?" - A child may wonder how light\n2. **Why is the sky so', False)
    assert [i.user for i in talk] == ["What is a rainbow made of?"]  # the question, not what follows


# ---- the batched sampler ------------------------------------------------------------------

def _prompts(n, vocab=512):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(4, vocab, (3 + 5 * i,), generator=g).tolist() for i in range(n)]


def test_admissions_held_back_change_no_greedy_token():
    """min_admit (the teacher's n_slots // 8) holds waiting requests until that many slots are
    free: greedy replies still equal generate(), and the step accounting adds up."""
    model = tiny_model()
    prompts = _prompts(5)
    lens = [12, 5, 9, 3, 7]  # requests end at different steps: slots free one at a time
    for min_admit in (1, 2):
        eng = Engine(model, 3, max_len=64, min_admit=min_admit)
        ids = [eng.add_request(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts, lens, strict=True)]
        eng.run_until_done()
        for p, n, rid in zip(prompts, lens, ids, strict=True):
            assert_generates(model, p, eng.result(rid), SamplingParams(max_tokens=n), max_len=64, what=rid)
        # one step per token after each request's first (that one comes from its admission's
        # prefill), at most 3 live rows a step
        st = eng.stats
        assert st.rows == sum(n - 1 for n in lens) and st.steps >= max(lens) - 1
        assert st.rows <= 3 * st.steps and st.admitted == 5 and st.admit_s > 0


def test_teacher_replies_are_deterministic_and_do_not_depend_on_the_other_jobs(tiny_teacher):
    from tinyllm.tools.datagen.teacher import Teacher

    teacher = Teacher(str(tiny_teacher), "cpu", n_slots=3, max_len=128)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repeat_penalty=1.1, max_tokens=10)
    jobs = [[{"role": "user", "content": f"Tell me about the number {i}."}] for i in range(5)]
    a = teacher.chat(jobs, params, seed=5)
    assert a == teacher.chat(jobs, params, seed=5)
    assert a != teacher.chat(jobs, params, seed=6)
    # job 0 among others, then beside other jobs: the same reply (its seed is the call's and its index)
    assert teacher.chat(jobs[:1] + [[{"role": "user", "content": "Something else."}]], params, seed=5)[0] == a[0]
    assert all(r.n_tokens == 10 or r.finished for r in a)
    assert teacher.stats.requests == 17 and teacher.stats.steps > 0 and 0 < teacher.stats.occupancy <= 1


# ---- a round with a scripted teacher, shards ----------------------------------------------

class ScriptedTeacher:
    """The Teacher interface (chat, count) with replies written by rules: questions for
    question-writing prompts, right sums, a looping answer for one topic, and a question
    that leaks an eval prompt."""

    def __init__(self):
        self.calls = 0

    def count(self, text):
        return len(text.split())

    def reply(self, msgs):
        last = msgs[-1]["content"]
        if last.startswith("List ") and "questions" in last:
            topic = last.split(" about ")[-1].rstrip(".")
            return (f"1. What is special about {topic}? 2. Why do people study {topic} so much?\n"
                    "3. How did it start?")  # the last one does not name its topic: dropped
        if last.startswith("List "):  # small-talk openers; the second is an eval prompt: a leak
            return "1. Hi there, I just got back from a long walk!\n2. What is the capital of Japan?"
        if last.startswith("Write "):
            return "Friendly robots help people every day."
        if last.startswith("Here is a question"):
            return "Can you tell me one more thing about that?"
        nums = numbers(last)
        if "plus" in last or "+" in last:
            return f"The answer is {nums[0] + nums[1]:g}."
        if "music" in last:
            return "Music is nice. " + "Music is a nice thing to have. " * 3  # a loop
        return f"Here is a short, clear answer about this: {last[:40]} is worth learning about."

    def chat(self, jobs, params, seed, prefills=None):
        self.calls += 1
        return [Reply(self.reply(j), 10, True) for j in jobs]


def test_a_round_filters_and_packs_into_shards(tmp_path):
    tasks = load_tasks()
    filters = Filters(LeakFilter(["What is the capital of Japan?"]))
    convs, stats = run_round(ScriptedTeacher(), tasks, filters, seed=0, r=0, n=300)
    assert stats["drop.leak"] >= 1 and stats["drop.dup_question"] >= 1
    users = [m["content"] for c in convs for m in c["messages"] if m["role"] == "user"]
    assert "What is the capital of Japan?" not in users
    assert not any(has_loop(m["content"]) for c in convs for m in c["messages"])
    assert any(c["messages"][0]["role"] == "system" for c in convs)
    assert any(sum(m["role"] == "user" for m in c["messages"]) >= 2 for c in convs)
    again, _ = run_round(ScriptedTeacher(), tasks, Filters(LeakFilter(["What is the capital of Japan?"])), 0, 0, 300)
    assert again == convs
    for r in range(3):
        write_round(tmp_path, r, convs)
    shards = pack(tmp_path, max_bytes=4096, raw_per_shard=20_000)
    assert len(shards) > 1 and all(p.stat().st_size <= 4096 for p in shards)
    back = [json.loads(line) for p in shards for line in lzma.open(p, "rt")]
    assert back == [c for _, cs in read_rounds(tmp_path) for c in cs] and len(back) == 3 * len(convs)
    train, held = data.read_split(tmp_path)  # what training reads
    assert len(train) + len(held) == len(back)


# ---- the command on the tiny random model -------------------------------------------------

@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory):
    from tinyllm.tools.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("teacher") / "tiny", max_seq_len=256)


def _run(teacher, out, *extra):
    return datagen_main(["--teacher", str(teacher), "--out", str(out), "--device", "cpu", "--slots", "8",
                         "--max-len", "256", "--round-size", "8", "--rounds", "1", "--heldout", "none",
                         "--max-tokens", "12", "--workers", "1", *extra])


def test_cli_on_the_tiny_model_is_deterministic_and_resumes(tiny_teacher, tmp_path, capsys):
    assert _run(tiny_teacher, tmp_path / "a") == 0
    line = next(json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"round"'))
    # each time is rounded to 0.1 s (teacher.py), so the parts' sum may pass the rounded whole by 0.15
    assert line["steps"] > 0 and 0 < line["occupancy"] <= 1
    assert line["decode_s"] + line["admit_s"] <= line["engine_s"] + 0.15 + 1e-9
    assert _run(tiny_teacher, tmp_path / "b") == 0
    ra, rb = (tmp_path / d / "rounds" / "round-00000.jsonl.xz" for d in "ab")
    assert ra.read_bytes() == rb.read_bytes()
    state = json.loads((tmp_path / "a" / "state.json").read_text())
    assert state["next_round"] == 1 and state["stats"]["planned"] == 8
    stats = json.loads((tmp_path / "a" / "stats.json").read_text())
    assert stats["rounds"] == 1
    assert _run(tiny_teacher, tmp_path / "a") == 0  # resumes with round 1
    assert json.loads((tmp_path / "a" / "state.json").read_text())["next_round"] == 2
    assert _run(tiny_teacher, tmp_path / "a", "--seed", "1") == 2  # another seed into the same folder
    users = tmp_path / "a" / "users.txt.xz"
    assert users.is_file()
    assert _run(tiny_teacher, tmp_path / "c", "--seed", "1", "--dedup-with", str(users)) == 0
    capsys.readouterr()
    assert _run(tiny_teacher, tmp_path / "d", "--in-flight", "0") == 2
    assert capsys.readouterr().err == "error: --in-flight must be at least 1, got 0\n"


def test_rounds_side_by_side_write_what_rounds_in_turn_write(tiny_teacher):
    """Three rounds through one engine, two at a time (tinyllm.tools.datagen.stream), against
    the same rounds one teacher call at a time: the same conversations and stats, in round
    order, with the engine fuller (occupancy counts live rows per step: no clock involved),
    and prompts encoded only as slots need them."""
    from tinyllm.tools.datagen.rounds import round_steps
    from tinyllm.tools.datagen.stream import stream_rounds
    from tinyllm.tools.datagen.teacher import Teacher

    tasks = load_tasks()

    def teacher_and_filters():
        return Teacher(str(tiny_teacher), "cpu", n_slots=8, max_len=256), Filters(LeakFilter([]))

    seq, filters = teacher_and_filters()
    want = [run_round(seq, tasks, filters, 3, r, 32, max_tokens=10) for r in range(3)]
    side, filters = teacher_and_filters()
    engine, waiting = side.engine(), []
    step = engine.step
    engine.step = lambda: (waiting.append(engine.waiting), step())[1]
    started = []

    def more():
        started.append(len(started))
        return len(started) <= 3
    got = list(stream_rounds(side, lambda r: round_steps(tasks, filters, 3, r, 32, side.count, 10), 0, 2, more))
    assert [r for r, _ in got] == [0, 1, 2]
    assert [res for _, res in got] == want
    assert sum(st.get("drop.truncated", 0) + st.get("conversations", 0) for _, st in want) > 5  # answers were written
    assert side.stats.tokens == seq.stats.tokens and side.stats.requests == seq.stats.requests
    assert side.stats.occupancy > seq.stats.occupancy
    assert max(waiting) == 8  # the jobs of a call (32 and more) are fed as slots free, 8 waiting at most
