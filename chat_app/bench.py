"""The app's own speed: the real Textual app (Pilot, headless) beside the same ChatSession
without a UI, in one run. `python -m chat_app.bench --model PATH [tinyllm-chat options]`.

Contract: prints one JSON object per line on stdout, {"metric", "value", "unit"} plus
"model", "device", "where" ("app" or "session"), and a table on stderr. Replies are fixed
length by construction (stop ids are ignored, like llama-bench's tg runs: `--tokens N`,
greedy unless the options say otherwise), so the two sides decode the same number of tokens.
Metrics:
  launch_to_loaded_s     from build_app() to the session being ready in the app
  first_ttft_ms          time to first token of the first reply (the compile runs meanwhile)
  first_step             which step the first reply ran ("compiling" while the compile runs)
  launch_to_compiled_s   from build_app() until the compiled step is ready (a warm relaunch
                         finds Inductor's cache); open_to_compiled_s: the same for the
                         session side, which opens after the app (so on a warm cache)
  decode_tok_s           per reply, as the status bar shows it (tokens after the first, over
                         the time since the first), "where": app / session; and their medians
  app_over_session       median app tok/s over median session tok/s (the UI's cost)
  (and on stderr, after each of the app's replies, its status bar's line: "status bar: ...")
  launch_to_<step>_s     the child's start-up, step by step (ChatSession.timeline):
                         child_started, torch_imported, open_started, model_loaded,
                         graphs_captured, compiled
Options are tinyllm-chat's (--model, --device, --compile, --threads, ...) plus --tokens,
--replies. The app's data folder is a temporary one. A server as the model (--model
http://HOST:PORT/v1): the session side is a ServerSession, and the replies are fixed length only
if the server ignores its end of text (llama-server --ignore-eos; scripts/server_side_by_side.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

from chat_app.__main__ import COMPILE, DEFAULT_MODEL, build_app, build_parser, sampling_params
from chat_app.server_api import endpoint, is_server
from chat_app.server_session import ServerSession
from tinyllm.tools.bench import Report


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m chat_app.bench", add_help=True)
    p.add_argument("--tokens", type=int, default=512, help="tokens per reply (default 512)")
    p.add_argument("--replies", type=int, default=3, help="timed replies on each side (default 3)")
    p.add_argument("--wait-compile", type=float, default=900, help="seconds to wait for the compile")
    ours, rest = p.parse_known_args(argv)
    app_args = build_parser().parse_args(rest + ["--max-tokens", str(ours.tokens), "--ignore-eos"])
    return ours, app_args


async def wait_for(pilot, condition, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not condition():
        errors = [n.message for n in pilot.app._notifications if n.severity == "error"]
        if errors:
            raise RuntimeError(f"the app said, waiting for {what}: {errors}")
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def app_side(args, ours, report: Report) -> object:
    """Run the app headless; returns its session (the model stays loaded for the other side)."""
    from chat_app.widgets.prompt_input import PromptInput

    t0, wall0 = time.perf_counter(), time.time()
    app = build_app(args)
    async with app.run_test(headless=True, size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.session is not None, 900, "the model to load")
        report("launch_to_loaded_s", time.perf_counter() - t0, "s", where="app")
        session = app.session  # a RemoteSession: the model runs in the app's child process

        async def one_reply(text: str):
            n = len(session.messages)
            app.prompt.load_text(text)
            app.prompt.post_message(PromptInput.Submitted(text))
            await wait_for(pilot, lambda: len(session.messages) == n + 2 and not app.busy, 900,
                           "the reply")
            print(f"status bar: {app.status.line}", file=sys.stderr)  # what the user saw at its end
            return session.last_stats

        first = await one_reply("Tell me a story about a lighthouse keeper.")
        report("first_ttft_ms", first.ttft_ms, "ms", where="app", step=first.step)
        report("decode_tok_s", first.tok_per_s, "tok/s", where="app", step=first.step, reply=0)
        ready = await asyncio.to_thread(session.wait_compiled, ours.wait_compile)
        if session.step_kind in ("compiled", "native") and ready:
            report("launch_to_compiled_s", time.perf_counter() - t0, "s", where="app")
        elif session.compile_error:
            print(f"app: compile failed: {session.compile_error}", file=sys.stderr)
        for step, at in sorted(session.timeline.items(), key=lambda kv: kv[1]):  # where start-up goes
            report(f"launch_to_{step}_s", at - wall0, "s", where="child")

        speeds = []
        for i in range(ours.replies):
            stats = await one_reply(f"And then what happened, part {i + 1}?")
            speeds.append(stats.tok_per_s)
            report("decode_tok_s", stats.tok_per_s, "tok/s", where="app", step=stats.step, reply=i + 1,
                   ttft_ms=round(stats.ttft_ms, 1), position=stats.position)
        report("decode_tok_s_median", statistics.median(speeds), "tok/s", where="app", step=stats.step)
    return speeds


def session_side(args, ours, report: Report) -> list[float]:
    """The same model and settings in a ChatSession in this process, no UI (after the app has
    closed; its compile is in the cache by now). The same sampling settings too: until
    2026-12-07 this side ran without the app's DRY and repetition stop, so app_over_session
    charged the UI with their cost (0.2x on the 2-core CPU with the tiny test model)."""
    from tinyllm.session.chat import open_session

    params = sampling_params(args)  # the app's: DRY and the repetition stop as the app has them
    if is_server(args.model, {}):  # the server's own session, no UI (fixed length: llama-server --ignore-eos)
        return session_speeds(ServerSession(endpoint(args.model, {}), params, args.system), ours, report)
    t0 = time.perf_counter()
    session = open_session(args.model or DEFAULT_MODEL, args.device, max_len=args.max_len, params=params,
                           system=args.system, use_graph=False if args.no_graphs else None, template=args.template,
                           compile=COMPILE[args.compile], threads=args.threads,
                           quant=args.quant)
    session.stop_ids = set()  # fixed-length replies, as --ignore-eos does in the app
    session.wait_compiled()
    report("open_to_compiled_s", time.perf_counter() - t0, "s", where="session", step=session.step_kind)
    return session_speeds(session, ours, report)


def session_speeds(session, ours, report: Report) -> list[float]:
    list(session.send("Tell me a story about a lighthouse keeper."))  # the first reply: as in the app
    speeds = []
    for i in range(ours.replies):
        *_, fin = session.send(f"Another question, number {i + 1}?")
        speeds.append(fin.stats.tok_per_s)
        report("decode_tok_s", fin.stats.tok_per_s, "tok/s", where="session", step=fin.stats.step, reply=i + 1,
               ttft_ms=round(fin.stats.ttft_ms, 1), position=fin.stats.position)
    report("decode_tok_s_median", statistics.median(speeds), "tok/s", where="session", step=fin.stats.step)
    report.context["device"] = session.device
    return speeds


def main(argv: list[str] | None = None) -> int:
    ours, args = parse(argv)
    os.environ.setdefault("TINYLLM_CHAT_DATA_DIR", tempfile.mkdtemp(prefix="tinyllm-bench-"))
    report = Report(model=str(args.model or "default"), device=args.device)
    app_speeds = asyncio.run(app_side(args, ours, report))
    session_speeds = session_side(args, ours, report)
    report("app_over_session", statistics.median(app_speeds) / statistics.median(session_speeds), "x")
    print(report.table(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
