"""`tinyllm eval --model PATH`: judge a model's answers with the app's defaults.

    tinyllm eval --model models/tinychat --device cpu
    tinyllm eval --model data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --stride 6 --heldout-rows 4

Contract:
- Every prompt of `tinyllm.tools.eval.prompts` (or every --stride-th, the first --limit) is answered by a
  `ChatSession` (`open_session`: the model's chat template, its default system prompt when
  the prompt has none, greedy, --repeat-penalty 1.1 over the last 64 ids, --dry-multiplier and
  --repeat-stop as the app's (tinyllm.decode.sampling_params DRY_MULTIPLIER, REPEAT_STOP),
  --max-tokens 256, --quant auto: the app's defaults), each in a new chat; a multi-turn prompt's fixed turns are loaded
  first (`load_messages`) and its last turn answered (`regenerate`).
- Scores: `correct` = checkable prompts whose reply passes its check / checkable prompts;
  `degenerate` = replies that loop (`textcheck.has_loop`: a word 4-gram said 3 times or a
  sentence twice; or ended by the repetition stop, "repeating") or are unfinished (no stop
  token within max-tokens) / all prompts; `loops`, `unfinished` and `repeating` (the stop's
  ends) apart, and `tokens`, every reply's tokens together; per category. Held-out loss (`eval.heldout`) on
  --heldout's held-out split unless --heldout-rows 0.
- Prints a table and one JSON line (`{"event": "eval", ...}`); --json PATH writes the JSON
  with every reply. Greedy, so the same model and device give the same report.
Refuses (one line on stderr, exit 2): a model path open_any refuses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

from tinyllm.decode.sampling_params import DRY_MULTIPLIER, DRY_WINDOW, REPEAT_STOP, parse_repeat_stop
from tinyllm.formats.quant_rule import DEFAULT, quant_help
from tinyllm.text.textcheck import check_reply, has_loop
from tinyllm.tools.eval.prompts import load_prompts


def answer_all(session, prompts: list[dict], log=None) -> list[dict]:
    """Each prompt answered in a new chat; [{"id", "reply", "reason", "tokens"}]."""
    from tinyllm.session.chat_events import Finished

    default_system = session.system
    out = []
    for p in prompts:
        msgs = p["messages"]
        session.new_chat()
        system = next((m["content"] for m in msgs if m["role"] == "system"), None)
        session.set_system(system or default_system)
        turns = [m for m in msgs if m["role"] != "system"]
        if len(turns) == 1:
            events = session.send(turns[0]["content"])
        else:
            session.load_messages([(m["role"], m["content"]) for m in turns])
            events = session.regenerate()
        fin = [e for e in events if isinstance(e, Finished)][-1]  # drains the reply
        out.append({"id": p["id"], "reply": fin.text, "reason": fin.reason, "tokens": fin.stats.tokens})
        if log:
            log(out[-1])
    session.set_system(default_system)
    return out


def score(prompts: list[dict], replies: list[dict]) -> dict:
    cats: dict[str, dict] = defaultdict(lambda: {"n": 0, "checkable": 0, "correct": 0, "degenerate": 0})
    tot = {"prompts": 0, "checkable": 0, "correct": 0, "loops": 0, "unfinished": 0, "degenerate": 0,
           "repeating": 0, "tokens": 0}
    for p, r in zip(prompts, replies, strict=True):
        c = cats[p["cat"]]
        turns = [m["content"] for m in p["messages"] if m["role"] != "system"]
        loop = has_loop(r["reply"]) or r["reason"] == "repeating"
        unfinished = r["reason"] not in ("eos", "repeating")
        r["loop"], r["unfinished"] = loop, unfinished
        tot["prompts"] += 1
        c["n"] += 1
        tot["loops"] += loop
        tot["unfinished"] += unfinished
        tot["repeating"] += r["reason"] == "repeating"
        tot["tokens"] += r["tokens"]
        tot["degenerate"] += loop or unfinished
        c["degenerate"] += loop or unfinished
        if p.get("check"):
            r["correct"] = check_reply(r["reply"], p["check"], turns)
            tot["checkable"] += 1
            tot["correct"] += r["correct"]
            c["checkable"] += 1
            c["correct"] += r["correct"]
    n, k = tot["prompts"], tot["checkable"]
    return {**tot, "correct_rate": tot["correct"] / k if k else None,
            "degenerate_rate": tot["degenerate"] / n if n else None,
            "loop_rate": tot["loops"] / n if n else None, "unfinished_rate": tot["unfinished"] / n if n else None,
            "by_category": dict(sorted(cats.items()))}


def table(name: str, s: dict, held: dict | None) -> str:
    lines = [f"eval of {name}: {s['prompts']} prompts, {s['checkable']} checkable",
             f"  correct (checkable)  {s['correct']:4d} / {s['checkable']:<4d} {100 * (s['correct_rate'] or 0):5.1f}%",
             f"  degenerate           {s['degenerate']:4d} / {s['prompts']:<4d} {100 * (s['degenerate_rate'] or 0):5.1f}%"
             f"   (loops {s['loops']}, unfinished {s['unfinished']}; repeating {s['repeating']})",
             f"  tokens               {s['tokens']:4d}"]
    if held:
        lines.append(f"  held-out loss        {held['nats_per_token']:.4f} nats/token, {held['nats_per_byte']:.4f} nats/byte"
                     f"   ({held['rows']} rows, {held['conversations']} conversations, {held['tokens']} tokens)")
    lines.append("  by category          correct/checkable  degenerate/n")
    for cat, c in s["by_category"].items():
        lines.append(f"    {cat:18s} {c['correct']:3d}/{c['checkable']:<3d}   {c['degenerate']:3d}/{c['n']:<3d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tinyllm eval", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/tinychat", help="tinyllm folder, Hugging Face folder or .gguf")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: the app's)")
    ap.add_argument("--quant", default=DEFAULT, help=quant_help())
    ap.add_argument("--repeat-penalty", type=float, default=1.1, help="the app's default: 1.1")
    ap.add_argument("--dry-multiplier", type=float, default=DRY_MULTIPLIER, help=f"the app's default: {DRY_MULTIPLIER}")
    ap.add_argument("--dry-last-n", type=int, default=DRY_WINDOW, help=f"the app's default: {DRY_WINDOW}")
    ap.add_argument("--repeat-stop", type=parse_repeat_stop, default=REPEAT_STOP,
                    help=f"the app's default: {REPEAT_STOP} (off: 0)")
    ap.add_argument("--max-tokens", type=int, default=256, help="the app's default: 256")
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts (0: all)")
    ap.add_argument("--stride", type=int, default=1, help="every K-th prompt (a subset across categories)")
    ap.add_argument("--prompts", default=None, help="another prompts.jsonl")
    ap.add_argument("--heldout", default="data/tinychat-distill", help="folder whose held-out split is scored")
    ap.add_argument("--heldout-rows", type=int, default=-1, help="rows of 1,025 tokens to score (-1: all, 0: skip)")
    ap.add_argument("--json", default=None, help="write the report with every reply here")
    ap.add_argument("--quiet", action="store_true", help="no line per reply")
    args = ap.parse_args(argv)
    try:
        from tinyllm.decode.sampling import SamplingParams
        from tinyllm.session.chat import open_session

        prompts = load_prompts(args.prompts)[:: max(1, args.stride)][: args.limit or None]
        params = SamplingParams(repeat_penalty=args.repeat_penalty, max_tokens=args.max_tokens,
                                dry_multiplier=args.dry_multiplier, dry_last_n=args.dry_last_n,
                                repeat_stop=args.repeat_stop)
        t0 = time.perf_counter()
        session = open_session(args.model, args.device, params=params, compile=None, threads=args.threads,
                               quant=args.quant)
        log = None if args.quiet else (lambda r: print(json.dumps({k: r[k] for k in ("id", "reason", "tokens", "reply")}),
                                                       flush=True))
        replies = answer_all(session, prompts, log)
        t_answers = time.perf_counter() - t0
        s = score(prompts, replies)
        held = None
        if args.heldout_rows != 0:
            if Path(args.heldout).is_dir():
                from tinyllm.tools.eval.heldout import heldout_loss

                held = heldout_loss(session.model, session.tokenizer, session.template, args.heldout,
                                    rows=None if args.heldout_rows < 0 else args.heldout_rows)
            else:
                print(f"note: no {args.heldout}; held-out loss skipped", file=sys.stderr)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = {"event": "eval", "model": args.model, "device": session.device, "prompts": len(prompts),
              "repeat_penalty": args.repeat_penalty, "max_tokens": args.max_tokens,
              "dry_multiplier": args.dry_multiplier, "dry_last_n": args.dry_last_n, "repeat_stop": args.repeat_stop,
              **{k: v for k, v in s.items() if k != "by_category"}, "heldout": held,
              "answer_s": round(t_answers, 1), "seconds": round(time.perf_counter() - t0, 1)}
    print(table(session.name, s, held))
    print(json.dumps(report), flush=True)
    if args.json:
        full = {**report, "by_category": s["by_category"], "replies": replies}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(full, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
