"""Key latency in the prompt with a big paste in it (issue 52, defect 2): not a test, a measure.

A Textual app headless at 100x30 with the chat screen's widgets (the conversation, the prompt,
the status bar, the footer); one bracketed paste of SIZE bytes on one line (or LINES lines),
then KEYS printable keys and Backspaces, each timed as the process's CPU time from its press
until the frame after it is rendered (Pilot.press, then pause(): the app idle and the screen
updated; CPU time, because Pilot's wait for idle adds ~80 ms of sleeping to the wall clock, and
the app's work is all on one thread). Prints where the pasted text went (the input's length,
the attachment chips) and the per-key times. --no-chip puts the paste in the input whatever
its size, as the app did before a big paste became an attachment (PASTE_CHARS).

    .venv/bin/python scripts/big_input_keys.py --size 1000000 [--lines 1] [--keys 20] [--no-chip]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from textual import events
from textual.app import App

from chat_app.widgets import prompt_input
from chat_app.widgets.conversation import Conversation
from chat_app.widgets.prompt_input import PromptInput
from chat_app.widgets.status_bar import StatusBar


class Bench(App[None]):
    CSS_PATH = "../chat_app/chat.tcss"

    def compose(self):
        yield Conversation()
        yield PromptInput(id="prompt")
        yield StatusBar()


def pasted(size: int, lines: int) -> str:
    line = max(1, size // lines - 1)
    word = "lorem ipsum dolor sit amet, consectetur adipiscing elit; "
    body = (word * (line // len(word) + 1))[:line]
    return "\n".join([body] * lines)


async def measure(size: int, lines: int, keys: int) -> None:
    app = Bench()
    async with app.run_test(size=(100, 30)) as pilot:
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.pause()
        text = pasted(size, lines)
        start = time.perf_counter()
        prompt.post_message(events.Paste(text))
        await pilot.pause()
        paste_s = time.perf_counter() - start
        chips = getattr(prompt, "attachments", [])
        times = []
        for i in range(keys):
            key = "x" if i % 4 != 3 else "backspace"
            start = time.process_time()
            await pilot.press(key)
            await pilot.pause()
            times.append((time.process_time() - start) * 1000)
        held = len(prompt.text)
    flag = "--no-chip: " if prompt_input.PASTE_CHARS > 1 << 40 else ""
    print(f"{flag}paste of {len(text):,} characters ({lines} line{'s' * (lines > 1)}): "
          f"handled in {paste_s * 1000:.0f} ms; "
          f"the input holds {held:,} characters, {len(chips)} attachment chip(s)")
    print(f"  {keys} keys: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms, "
          f"all: {' '.join(f'{t:.0f}' for t in times)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="bytes pasted")
    parser.add_argument("--lines", type=int, default=1, help="over how many lines")
    parser.add_argument("--keys", type=int, default=20, help="keys timed")
    parser.add_argument("--no-chip", action="store_true", help="the paste goes into the input (as before)")
    args = parser.parse_args()
    if args.no_chip:
        prompt_input.PASTE_CHARS = 1 << 62
    asyncio.run(measure(args.size, args.lines, args.keys))


if __name__ == "__main__":
    main()
