"""Issue 46, item 7: hostile inputs found that round, each with the test that failed before its fix.
The config file (/theme's edit, nesting), the command line (--threads, --max-len, no terminal),
the chat list at 100,000 chats, typed input's per-key work, SIGTSTP/SIGCONT, and lines that
confused (a prompt that fits, a 300-character /export name)."""

from __future__ import annotations

import time
import tomllib

import pytest

from chat_app import config
from chat_app.__main__ import main
from tests.chat_app.conftest import loaded, notes, notices, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (100, 30)

SYSTEM = 'system = """Be brief.\ntheme = "nord" is my favourite line\n[not a table]\n"""\n'


def test_theme_is_saved_as_a_key_never_inside_a_string():
    """Before: `^theme\\s*=.*$` over the raw text rewrote the line inside the system prompt
    (data loss), and no theme key was written."""
    file = config.path()
    file.parent.mkdir(parents=True)
    text = "# my settings\n" + SYSTEM + "temperature = 0.5  # warm\n\n[extra]\ntheme = 'x'\n"
    file.write_text(text)
    config.save("theme", "gruvbox")
    after = file.read_text()
    assert after == 'theme = "gruvbox"\n' + text  # every other byte kept
    assert tomllib.loads(after)["system"] == tomllib.loads(SYSTEM)["system"]
    config.save("theme", "nord")  # the key now there: its line rewritten, in place
    assert file.read_text() == 'theme = "nord"\n' + text
    file.write_bytes(b'temperature = 0.5\n"theme" = "nord"   # the one I like\r\nseed = 1\n')
    config.save("theme", "gruvbox")
    assert file.read_bytes() == b'temperature = 0.5\n"theme" = "gruvbox"   # the one I like\r\nseed = 1\n'
    file.write_text('theme = "a"\ntheme = "b"\n')  # not TOML: refused, nothing written
    with pytest.raises(ValueError, match="is not TOML"):
        config.save("theme", "nord")
    assert file.read_text() == 'theme = "a"\ntheme = "b"\n'


async def test_slash_theme_keeps_the_system_prompt(make_app):
    config.path().parent.mkdir(parents=True)
    config.path().write_text(SYSTEM)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "/theme gruvbox")
        assert app.theme == "gruvbox" and notes(app)[-1].startswith("Theme gruvbox (kept in ")
    assert config.path().read_text() == 'theme = "gruvbox"\n' + SYSTEM
    assert config.load()["theme"] == "gruvbox"


@pytest.mark.parametrize("nested", ["a = " + "[" * 500 + "]" * 500, "a = " + "{b = " * 500 + "1" + "}" * 500],
                         ids=["arrays", "inline-tables"])
@pytest.mark.parametrize("argv", [[], ["--help"]], ids=["run", "help"])
def test_a_config_nested_500_deep_is_one_line_and_exit_2(capsys, nested, argv):
    config.path().parent.mkdir(parents=True)
    config.path().write_text(nested + "\n")
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"tinyllm-chat: error: config file {config.path()}: nested too deep to " \
                                        "read; fix it or move it away\n"


def one_line(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("tinyllm-chat: error: "), err
    return err


@pytest.mark.parametrize("threads", ["100000", "0", "-3"])
def test_threads_beyond_the_cores_are_one_line_naming_the_range(capsys, ckpt, monkeypatch, threads):
    """Before: 100000 was accepted; the model process exhausted the process limit and crashed."""
    import chat_app.__main__ as cli
    from chat_app.app import ChatApp

    monkeypatch.setattr(ChatApp, "run", lambda self: pytest.fail("the app opened"))
    err = one_line(capsys, "--model", str(ckpt), "--threads", threads)
    assert f"--threads must be from 1 to {cli.cores()} (the cores this process may use), got {threads}" in err


def test_no_terminal_is_one_line_and_exit_2(ckpt, tmp_path):
    """Before: `tinyllm-chat </dev/null >out` never ended and wrote escape codes into `out`.
    --help needs no terminal."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TINYLLM_CHAT_DATA_DIR": str(tmp_path / "data"),
           "TINYLLM_CHAT_CONFIG_DIR": str(tmp_path / "config")}
    argv = [sys.executable, "-m", "chat_app", "--model", str(ckpt), "--compile", "off"]
    with open(tmp_path / "out", "wb") as out:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, env=env,
                              timeout=120)
    assert done.returncode == 2 and (tmp_path / "out").read_bytes() == b""
    assert done.stderr.decode() == ("tinyllm-chat: error: stdin, stdout and stderr are not a terminal: tinyllm-chat is "
                                    "a full-screen app; run it in a terminal, without redirections\n")
    helped = subprocess.run([*argv, "--help"], stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=120)
    assert helped.returncode == 0 and b"--threads" in helped.stdout
    version = subprocess.run([*argv, "--version"], stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith(b"tinyllm-chat ")


def many_chats(data_dir, n: int) -> None:
    """n saved chats of two messages each, written straight into chat.db (a second or so)."""
    import sqlite3

    from chat_app.store import Store

    Store.open(data_dir).close()  # the schema
    with sqlite3.connect(data_dir / "chat.db") as db:
        db.executemany("INSERT INTO conversations (id, created, updated, model) VALUES (?, ?, ?, 'm')",
                       [(i, 1e9 + i, 1e9 + i) for i in range(1, n + 1)])
        db.executemany("INSERT INTO messages (conversation, role, content) VALUES (?, ?, ?)",
                       [(i, role, f"{role} {i}") for i in range(1, n + 1) for role in ("user", "assistant")])


class SqlWork:
    """What the store's connection runs: its statements, and its SQLite VM work in thousands of
    instructions (a progress handler): work counted, not time."""

    def __init__(self, db) -> None:
        self.statements: list[str] = []
        self.steps = 0
        db.set_trace_callback(lambda statement: self.statements.append(statement))
        db.set_progress_handler(self._step, 1000)

    def _step(self) -> int:
        self.steps += 1
        return 0

    def take(self) -> tuple[list[str], int]:
        done, self.statements, steps, self.steps = self.statements, [], self.steps, 0
        return [s for s in done if "FROM conversations c" in s], steps


async def test_the_chat_list_at_100k_chats_is_a_page_of_one_bounded_query(make_app, data_dir):
    """Before: 100,000 chats took about 5 minutes to list (every chat a row, every row a scan of
    all messages), filtering hung, and Ctrl+Q and SIGTERM waited for it."""
    from chat_app.widgets.chat_list import PAGE, ChatList

    many_chats(data_dir, 100_000)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        work = SqlWork(app.store.db)
        began = time.perf_counter()
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ChatList))
        opened = time.perf_counter() - began
        table = app.screen.query_one("DataTable")
        queries, steps = work.take()
        assert table.row_count == PAGE and str(table.get_row_at(0)[1]) == "user 100000"
        assert len(queries) == 1 and queries[0].endswith(f"LIMIT {PAGE + 1} OFFSET 0"), queries
        print(f"open: {steps} thousand SQLite instructions, {opened:.2f} s (printed, not asserted)")
        assert steps < 1000, steps  # a page's work: a scan of 100,000 chats is tens of millions
        await pilot.press("end")  # the last row fetched: the next page comes
        await wait_until(pilot, lambda: table.row_count == 2 * PAGE, what="the next page")
        queries, steps = work.take()
        assert [q.rsplit(" LIMIT ", 1)[1] for q in queries] == [f"{PAGE + 1} OFFSET {PAGE}"] and steps < 1000
        await pilot.press(*"r 9999")  # a filter few chats match: it reads every chat's text, once
        began = time.perf_counter()
        await wait_until(pilot, lambda: not app.screen.filtering, what="the filter to run")
        filtered = time.perf_counter() - began
        queries, steps = work.take()
        assert table.row_count == 11 and str(table.get_row_at(0)[1]) == "user 99999", table.row_count
        assert 1 <= len(queries) <= 6 and all(q.endswith(f"LIMIT {PAGE + 1} OFFSET 0") for q in queries)
        print(f"filter: {len(queries)} queries for 6 keys, {steps} thousand SQLite instructions, "
              f"{filtered:.2f} s after the last key (printed, not asserted)")
        await pilot.press("ctrl+q")
    assert app.return_code == 0


async def test_typed_keys_cost_one_edit_a_burst_not_one_a_key(make_app):
    """Before: every typed key was an edit, and Textual's TextArea rewraps the edited line whole
    on each (and renders it whole each frame): 5 KB typed (no bracketed paste) took 5.8 s, 20 KB
    62 s. Now a burst of keys is one edit: the rewraps are counted, not timed."""
    from textual import events

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.prompt
        prompt.load_text("word " * 4000)  # 20 KB on one line
        prompt.move_cursor(prompt.document.end)
        wraps = []
        real_wrap = prompt.wrapped_document.wrap_range
        prompt.wrapped_document.wrap_range = lambda *a, **k: (wraps.append(a), real_wrap(*a, **k))[1]
        for key in "abcd " * 1000:  # as a terminal's reads come: all queued before the first is handled
            app.post_message(events.Key("space" if key == " " else key, key))
        want = "word " * 4000 + "abcd " * 1000
        await wait_until(pilot, lambda: len(prompt.document.text) == len(want), what="the keys typed")
        assert prompt.text == want
        assert len(wraps) <= 3, len(wraps)  # was 5,000: one whole-line rewrap a key
        await pilot.press("left", "X")  # keys one at a time: each where the cursor is
        assert prompt.text == want[:-1] + "X "


def test_sigtstp_then_sigcont_redraws_every_row(ckpt, tmp_path):
    """Before: after Ctrl+Z (SIGTSTP) and `fg` (SIGCONT), 27 of the 30 rows stayed blank until a
    key was pressed: Textual enters the alternate screen again (blank) and draws only what
    changed. The screen reader (pyte) keeps no alternate screen, so it is wiped while the app is
    stopped, as the terminal's is."""
    import os
    import signal
    import sys

    if sys.platform == "win32":
        pytest.skip("no pseudo-terminals")
    from tests.chat_app.test_pty import start

    term = start(ckpt, tmp_path)
    try:
        def drawn() -> list[str]:  # the rows that show something (the hint may sit a row lower after)
            return sorted(line for line in term.lines() if line.strip())

        before = drawn()  # the hint, the input box, the status bar, the footer
        assert len(before) >= 5, term.text()

        def state() -> str:
            with open(f"/proc/{term.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]

        os.kill(term.pid, signal.SIGTSTP)
        term.wait(lambda: state() == "T", "the app to stop")
        term.wipe()  # what the terminal shows: the shell's screen, then a new, blank alternate one
        os.kill(term.pid, signal.SIGCONT)
        term.wait(lambda: drawn() == before, "every row drawn again")
        term.send("still here")
        term.wait("still here")
    finally:
        term.close()


def test_a_prompt_and_its_reply_that_fit_are_not_too_long(ckpt):
    """Before: --max-len 64 --max-tokens 8 refused a prompt of 57 ids (56 and BOS), which fits:
    a reply of 8 ids takes 7 positions (its last id is drawn, never fed)."""
    from tinyllm.decode.sampling_params import SamplingParams
    from tinyllm.session.chat import open_session

    session = open_session(ckpt, device="cpu", max_len=64, params=SamplingParams(max_tokens=8), compile=None)
    conversation = session.conversation
    head = len(conversation.head_ids())
    words = next(n for n in range(1, 64) if head + len(conversation.user_ids("a " * n, True)) + len(
        conversation.prompt_ids()) >= 57)
    text = "a " * words
    prompt = head + len(conversation.user_ids(text, True)) + len(conversation.prompt_ids())
    assert prompt == 57, prompt  # the tiny tokenizer has a word for every prompt length here
    finished = list(session.send(text))[-1]  # was: ValueError("message too long: 56 tokens ...")
    assert finished.reason in ("max_tokens", "eos") and finished.stats.position <= 64  # the cache held it
    session.new_chat()
    with pytest.raises(ValueError, match="message too long"):  # one id more does not fit
        list(session.send(text + "b"))


async def test_no_advice_to_raise_max_len_at_the_models_own_context(make_app):
    """Before: a message too long for the model's whole context advised "raise --max-len"."""
    app = make_app("--max-tokens", "8")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        assert app.session.max_len == app.session.model_max_len == 2048
        await send(pilot, "many words " * 2000, wait=False)  # refused: it stays in the input
        await wait_until(pilot, lambda: any("too long" in n for n in notices(app)), what="the refusal")
        said = [n for n in notices(app) if "too long" in n]
        assert "--max-len" not in said[-1], said
        assert said[-1].endswith("; the context is the model's whole 2,048 positions already"), said


async def test_export_to_a_300_character_name_is_a_one_line_note(make_app, tmp_path):
    """Before: the note named the path twice, whole (the OSError's text too): 16 lines."""
    from chat_app.widgets.system_note import SystemNote

    app = make_app("--max-tokens", "2")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "hi")
        await send(pilot, f"/export {tmp_path}/{'n' * 300}.md")
        await wait_until(pilot, lambda: any("could not export" in n for n in notes(app)), what="the refusal")
        note = app.query(SystemNote).last()
        assert note.text.startswith("could not export to ") and note.text.endswith(": File name too long")
        assert len(note.text) <= 80 and note.size.height == 1, (note.text, note.size)
