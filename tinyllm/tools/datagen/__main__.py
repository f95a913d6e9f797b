"""`tinyllm datagen`: teacher-written chat conversations for training (issue 14).

    tinyllm datagen --teacher data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --device cuda --compile --tokens 60000000 --out data/teacher
    tinyllm datagen --pack-only --out data/teacher      # rounds -> shards again

Contract:
- Runs rounds (`rounds.round_steps`, `--round-size` first turns each; `--in-flight` of them
  side by side through the teacher's one engine, tinyllm.tools.datagen.stream) until the kept
  conversations hold `--tokens` teacher tokens (all turns, system prompts included), or
  `--minutes` would be passed by one more round, or after `--rounds` rounds; then packs
  OUT/teacher-NNN.jsonl.xz shards (<= 15 MiB each, `shards.pack`; named apart from
  tinychat-distill's chat-NNN so both can sit in one training folder) and writes
  OUT/stats.json (totals, by source, drops).
- Resumable: OUT/state.json holds the seed, the next round and the totals; a second call
  with the same OUT continues (round r is a function of the seed, r and the rounds kept
  before it; the dedup and answer sets are rebuilt from OUT/rounds/; an unfinished round is
  redone). Another --seed into the same OUT is refused.
  A run into another folder (a fresh machine) skips the first turns of earlier runs given
  with --dedup-with (each run writes OUT/users.txt.xz when it packs).
- Held-out prompts kept out of the data (`dedup.LeakFilter`): every eval prompt's user turns
  (`tinyllm.tools.eval`) and `--heldout`'s: by default heldout_users.jsonl beside this file, the
  1,631 user turns of tinychat-distill's held-out split (its 1% by line hash,
  `tinyllm.tools.data.read_split`), or a data folder's held-out split.
- One JSON line per round on stdout: round, conversations, kept tokens so far, tokens the
  teacher generated in this call (kept or not) and its tok/s, where the engine's time went
  (`TeacherStats.timing`: steps, occupancy, ms a step, admissions), drops by reason.
Refuses (ValueError -> one line on stderr, exit 2): a missing teacher, a seed mismatch,
--in-flight below 1.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
import time
from collections import Counter
from pathlib import Path

from tinyllm.tools.datagen.dedup import LeakFilter
from tinyllm.tools.datagen.plan import load_tasks
from tinyllm.tools.datagen.rounds import Filters, round_steps
from tinyllm.tools.datagen.shards import pack, read_rounds, write_round

STATE = "state.json"
HELDOUT = Path(__file__).with_name("heldout_users.jsonl")  # tinychat-distill's held-out user turns


def heldout_prompts(heldout: str | None) -> list[str]:
    """User turns the data must not hold: the eval's prompts, and the held-out split's: a
    data folder's (its 1% by line hash, as training splits it) or a JSON-lines file of
    strings (HELDOUT: tinychat-distill's, so the device needs no copy of that data)."""
    from tinyllm.tools.eval.prompts import user_turns

    out = user_turns()
    path = Path(heldout) if heldout else None
    if path is not None and path.is_dir() and list(path.glob("*.jsonl.xz")):
        from tinyllm.tools.data import read_split

        _, held = read_split(path)
        out += [m["content"] for conv in held for m in conv if m["role"] == "user"]
    elif path is not None and path.is_file():
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    elif heldout and heldout != "none":
        raise FileNotFoundError(f"--heldout {heldout}: no such data folder or prompts file")
    return out


def load_state(out: Path, seed: int, filters: Filters) -> dict:
    path = out / STATE
    state = {"seed": seed, "next_round": 0, "conversations": 0, "tokens": 0, "stats": {}}
    if path.is_file():
        state = json.loads(path.read_text())
        if state["seed"] != seed:
            raise ValueError(f"{out} was generated with --seed {state['seed']}; pass it, or another --out")
    for r, convs in read_rounds(out):
        if r < state["next_round"]:  # a round file written after the last state save is redone
            for c in convs:
                filters.remember(c)
    return state


def save_state(out: Path, state: dict) -> None:
    tmp = out / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(out / STATE)


def summarize(out: Path, state: dict) -> dict:
    by_src: Counter = Counter()
    turns: Counter = Counter()
    system = 0
    for _, convs in read_rounds(out):
        for c in convs:
            by_src[c["src"].split(".")[0]] += 1
            turns[sum(m["role"] == "user" for m in c["messages"])] += 1
            system += c["messages"][0]["role"] == "system"
    shards = sorted(out.glob("teacher-*.jsonl.xz"))
    return {"conversations": state["conversations"], "teacher_tokens": state["tokens"],
            "rounds": state["next_round"], "seed": state["seed"], "by_source": dict(sorted(by_src.items())),
            "by_user_turns": {str(k): v for k, v in sorted(turns.items())}, "with_system_prompt": system,
            "shards": [{"file": p.name, "bytes": p.stat().st_size} for p in shards],
            "drops_and_counts": state["stats"]}


def write_users(out: Path) -> None:
    """OUT/users.txt.xz: every kept conversation's first user turn, for --dedup-with of a
    later run in another folder (a few MB where the shards are tens)."""
    lines = [json.dumps(next(m["content"] for m in c["messages"] if m["role"] == "user"), ensure_ascii=False)
             for _, convs in read_rounds(out) for c in convs]
    (out / "users.txt.xz").write_bytes(lzma.compress("".join(x + "\n" for x in lines).encode(), preset=6))


def generate(args) -> dict:
    from tinyllm.tools.datagen.stream import stream_rounds
    from tinyllm.tools.datagen.teacher import Teacher

    if args.in_flight < 1:
        raise ValueError(f"--in-flight must be at least 1, got {args.in_flight}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tasks = load_tasks(args.tasks)
    filters = Filters(LeakFilter(heldout_prompts(args.heldout)))
    for path in args.dedup_with:  # first turns of an earlier run (its users.txt.xz)
        with lzma.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    filters.questions.add(json.loads(line))
    state = load_state(out, args.seed, filters)
    if not Path(args.teacher).exists():
        raise FileNotFoundError(f"teacher {args.teacher} not found: copy the SmolLM2 GGUF there (docs/DATA.md)")
    teacher = Teacher(args.teacher, args.device, n_slots=args.slots, max_len=args.max_len,
                      compile="inductor" if args.compile else None)
    print(json.dumps({"event": "start", "leak_prompts": len(filters.leak), "resumed_round": state["next_round"],
                      "setup_s": round(time.perf_counter() - t0, 1)}), flush=True)
    first, rounds = state["next_round"], [0]  # the first round of this call, and how many started
    round_s: list[float] = []  # how long each finished round took, start to end

    def more() -> bool:
        """Start another round? Not past --tokens or --rounds, nor past --minutes by one more round."""
        if state["tokens"] >= args.tokens or (args.rounds and rounds[0] >= args.rounds):
            return False
        last = round_s[-1] if round_s else 0.0
        if args.minutes and time.perf_counter() - t0 + 1.2 * last / args.in_flight > args.minutes * 60:
            return False
        rounds[0] += 1
        started[first + rounds[0] - 1] = time.perf_counter()
        return True

    started: dict[int, float] = {}
    steps = lambda r: round_steps(tasks, filters, args.seed, r, args.round_size, teacher.count,  # noqa: E731
                                  args.max_tokens)
    for r, (convs, stats) in stream_rounds(teacher, steps, first, args.in_flight, more):
        write_round(out, r, convs)
        state["next_round"] = r + 1
        state["conversations"] += len(convs)
        state["tokens"] += stats.get("tokens", 0)
        state["stats"] = dict(Counter(state["stats"]) + Counter(stats))
        save_state(out, state)
        round_s.append(time.perf_counter() - started.pop(r))
        print(json.dumps({"round": r, "conversations": len(convs), "total_conversations": state["conversations"],
                          "total_tokens": state["tokens"], "round_s": round(round_s[-1], 1),
                          "teacher_tok_s": round(teacher.stats.tok_per_s),
                          "generated": teacher.stats.tokens, "elapsed": round(time.perf_counter() - t0, 1),
                          **teacher.stats.timing(),
                          **{k: v for k, v in stats.items() if k.startswith("drop")}}), flush=True)
    return state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tinyllm datagen", description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", default="data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", help="model that writes")
    ap.add_argument("--out", default="data/teacher", help="output folder (shards, rounds/, state.json)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=60_000_000, help="stop once the kept data holds this many teacher tokens")
    ap.add_argument("--minutes", type=float, default=0.0, help="stop before a round would pass this (0: no limit)")
    ap.add_argument("--rounds", type=int, default=0, help="at most this many rounds in this call (0: no limit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--round-size", type=int, default=4000, help="first turns planned per round")
    ap.add_argument("--slots", type=int, default=64, help="concurrent requests in the engine")
    ap.add_argument("--in-flight", type=int, default=2,
                    help="rounds run side by side through the engine (1: one after another)")
    ap.add_argument("--max-len", type=int, default=1024, help="prompt + reply tokens per request")
    ap.add_argument("--max-tokens", type=int, default=0,
                    help="cap on every reply (smoke runs; 0: 120 for written prompts, 384 for answers)")
    ap.add_argument("--compile", action="store_true", help="compile the engine's step (CUDA)")
    ap.add_argument("--heldout", default=str(HELDOUT),
                    help="held-out user turns that must not leak: a data folder or a JSON-lines file ('none')")
    ap.add_argument("--dedup-with", action="append", default=[], metavar="USERS",
                    help="an earlier run's users.txt.xz: its first turns count as seen (repeatable)")
    ap.add_argument("--tasks", default=None, help="task lists (default: tinyllm/tools/datagen/tasks.json)")
    ap.add_argument("--pack-only", action="store_true", help="only pack OUT/rounds into shards")
    ap.add_argument("--no-pack", action="store_true", help="leave packing to a later --pack-only")
    ap.add_argument("--workers", type=int, default=8, help="processes compressing shards")
    args = ap.parse_args(argv)
    try:
        out = Path(args.out)
        if not args.pack_only:
            generate(args)
        if not args.no_pack:
            state = json.loads((out / STATE).read_text()) if (out / STATE).is_file() else None
            if state is None:
                raise FileNotFoundError(f"{out} holds no {STATE}: nothing generated there yet")
            pack(out, workers=args.workers)
            write_users(out)
            summary = summarize(out, state)
            (out / "stats.json").write_text(json.dumps(summary, indent=1) + "\n")
            print(json.dumps({"event": "packed", **{k: summary[k] for k in ("conversations", "teacher_tokens",
                                                                              "shards")}}), flush=True)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
