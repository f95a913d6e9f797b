"""`tinyllm-chat -p` and pipes (issue 52, part 1; -f from part 2; the -p half of part 5's controls):
real runs of the installed command in a subprocess, with pipes for stdin and stdout and no
terminal, checked by exit code, the bytes written and the rows of the real chat.db.

The default model (models/tinychat) answers where a reply's content matters; the tiny random
checkpoint (conftest's `ckpt`, with the plain step) where a reply is only to run: it never
ends on its own (--ignore-eos). No test waits on time: a reply interrupted mid-way is held by
its session after its first text until the stop arrives (`HELD`), so it cannot end first.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from chat_app.attachments import MAX_BYTES
from chat_app.labels import printable
from tests.chat_app.conftest import rows

CLI = str(Path(sys.executable).with_name("tinyllm-chat"))
TIMEOUT = 300  # only a hung run hits it
TINY = ["--device", "cpu", "--compile", "off", "--repeat-stop", "off", "--dry-multiplier", "0"]

# The CLI with its session held after the first text until stop() (Ctrl+C's, SIGTERM's) arrives.
HELD = """
import sys, threading
import chat_app.oneshot as oneshot
real = oneshot.open_local

def held(local):
    session = real(local)
    stopped, stop, send = threading.Event(), session.stop, session.send
    def stop_now():
        stopped.set()
        stop()
    def held_send(text):
        for event in send(text):
            yield event
            if type(event).__name__ == "Token" and event.text:
                stopped.wait()
    session.stop, session.send = stop_now, held_send
    return session

oneshot.open_local = held
from chat_app.__main__ import main
main(sys.argv[1:])
"""


def run(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *argv], input=stdin if stdin is not None else b"",
                          capture_output=True, timeout=TIMEOUT)


def one_line(done: subprocess.CompletedProcess, code: int) -> str:
    err = done.stderr.decode()
    assert done.returncode == code and err.count("\n") == 1 and err.startswith("tinyllm-chat: error: "), \
        (done.returncode, err, done.stdout[:200])
    return err


def typed(data_dir: Path) -> list[str]:
    """The input's history (the prompts table), oldest first."""
    with sqlite3.connect(data_dir / "chat.db") as db:
        return [t for (t,) in db.execute("SELECT text FROM prompts ORDER BY id")]


def chats(data_dir: Path) -> list[tuple]:
    if not (data_dir / "chat.db").exists():
        return []
    with sqlite3.connect(data_dir / "chat.db") as db:
        return db.execute("SELECT id, system, model FROM conversations ORDER BY id").fetchall()


def shown(reply: str) -> str:
    """What -p writes for a reply: its controls made visible, and a newline at its end."""
    return printable(reply) + ("" if reply.endswith("\n") else "\n")


def no_controls(data: bytes) -> None:
    """No byte a terminal acts on: C0 but tab and newline, DEL, and C1 as UTF-8 (C2 80..C2 9F)."""
    assert not [b for b in data if b < 0x20 and b not in b"\t\n" or b == 0x7F], data
    assert not any(data[i] == 0xC2 and 0x80 <= data[i + 1] <= 0x9F for i in range(len(data) - 1)), data


# ---- the default model ------------------------------------------------------------------------

def test_p_prints_the_reply_and_saves_the_turn(data_dir):
    done = run("-p", "Name three colours.", "--max-tokens", "24")
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert out.strip() and out.endswith("\n") and b"\x1b" not in done.stdout
    (user, reply) = rows(data_dir)
    assert user[2:] == ("user", "Name three colours.", 0, 0) and reply[2] == "assistant" and reply[4:] == (0, 0)
    assert out == shown(reply[3])
    assert done.stderr.decode() in ("", "tinyllm-chat: note: the reply reached max_tokens (24) and ends there; "
                                        "--max-tokens N allows more\n")


def test_stdin_is_the_message_or_goes_before_p_as_a_file(data_dir, tmp_path):
    alone = run("--max-tokens", "4", "--no-save", "--json", stdin=b"What is 2+2?\n")
    assert alone.returncode == 0, alone.stderr
    diff = "diff --git a/x b/x\n+```\n+added\n"
    (tmp_path / "notes.txt").write_text("a note\n")
    done = run("-p", "Write a commit message", "-f", str(tmp_path / "notes.txt"), "--max-tokens", "4",
               "--system", "Be brief.", "--temperature", "0.5", "--seed", "7", stdin=diff.encode())
    assert done.returncode == 0, done.stderr
    user = [r[3] for r in rows(data_dir) if r[2] == "user"]
    assert user == [f"stdin\n````\n{diff}````\n\nnotes.txt\n```\na note\n```\n\nWrite a commit message"]
    assert [c[1:] for c in chats(data_dir)] == [("Be brief.", "tinychat")]
    assert typed(data_dir) == ["Write a commit message"]  # the input's Up history: what was typed, not what was piped


def test_json_lines_and_continuing_a_chat(data_dir):
    done = run("-p", "Hello!", "--json", "--max-tokens", "8")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    first, *tokens, last = lines
    assert first["event"] == "prefilled" and first["prompt_tokens"] > 0 and first["dropped"] == 0
    assert tokens and all(t["event"] == "token" for t in tokens)
    assert last["event"] == "finished" and last["text"] == "".join(t["text"] for t in tokens)
    assert last["reason"] in ("eos", "max_tokens") and last["model"] == "tinychat"
    assert last["reply_tokens"] >= len(tokens) and last["tok_s"] >= 0 and last["ttft_ms"] > 0
    assert last["prompt_tokens"] == first["prompt_tokens"] and last["context"] == 2048
    (chat,) = [c[0] for c in chats(data_dir)]
    assert last["chat"] == chat

    again = run("-p", "And again?", "--resume", "--json", "--max-tokens", "4")
    assert again.returncode == 0, again.stderr
    end = json.loads(again.stdout.decode().splitlines()[-1])
    assert end["chat"] == chat and end["position"] > last["position"]  # the first turn is in the context
    by_id = run("-p", "Once more.", "--chat", str(chat), "--max-tokens", "4", "--no-save")
    assert by_id.returncode == 0, by_id.stderr
    assert [(r[1], r[2]) for r in rows(data_dir)] == [(chat, "user"), (chat, "assistant")] * 2  # --no-save: not kept
    gone = run("-p", "Hi", "--chat", "999")
    assert "chat 999 is not in the history any more" in one_line(gone, 2)


def test_no_save_leaves_the_history_alone(data_dir):
    done = run("-p", "Hi", "--max-tokens", "2", "--no-save")
    assert done.returncode == 0, done.stderr
    assert not (data_dir / "chat.db").exists() or rows(data_dir) == []


# ---- the tiny model: overflow, signals ---------------------------------------------------------

def test_a_message_longer_than_the_context_is_one_line_and_exit_2(ckpt, data_dir, tmp_path):
    done = run("--model", str(ckpt), *TINY, "--max-len", "64", "-p", "word " * 200)
    err = one_line(done, 2)
    assert " over what the context holds (64, with 16 kept for the reply)" in err, err
    assert done.stdout == b"" and rows(data_dir) == []
    (tmp_path / "big.txt").write_text("many words " * 100)
    attached = run("--model", str(ckpt), *TINY, "--max-len", "64", "-p", "Summarize", "-f", str(tmp_path / "big.txt"))
    assert " over what the context holds (64, with 16 kept for the reply)" in one_line(attached, 2)


def test_a_reply_that_fills_the_context_is_kept_and_exit_2(ckpt, data_dir):
    done = run("--model", str(ckpt), *TINY, "--max-len", "64", "--ignore-eos", "--max-tokens", "1000", "-p", "Hi")
    err = one_line(done, 2)
    assert "the reply filled the context (64 positions)" in err, err
    reply = [r for r in rows(data_dir) if r[2] == "assistant"]
    assert len(reply) == 1 and reply[0][3] and done.stdout.decode() == shown(reply[0][3])


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_mid_reply_keeps_what_came(ckpt, data_dir, signum, code):
    proc = subprocess.Popen([sys.executable, "-c", HELD, "--model", str(ckpt), *TINY, "--ignore-eos",
                             "--max-tokens", "1000", "-p", "Hi"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    first = os.read(proc.stdout.fileno(), 65536)  # the reply's first text: the session holds after it
    assert first
    proc.send_signal(signum)
    rest, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == code and err == b"", (proc.returncode, err)
    out = (first + rest).decode()
    (user, reply) = rows(data_dir)
    assert user[2:] == ("user", "Hi", 0, 0)
    assert reply[2] == "assistant" and reply[4:] == (1, 0) and reply[3] and out == shown(reply[3])


# The CLI with its local model failing after its third piece of text (as CUDA's "out of memory" would).
FAILING = """
import sys
import chat_app.oneshot as oneshot
real = oneshot.open_local

def failing(local):
    session = real(local)
    send = session.send
    def failing_send(text):
        n = 0
        for event in send(text):
            yield event
            n += type(event).__name__ == "Token" and bool(event.text)
            if n == 3:
                raise RuntimeError("CUDA error: out of memory")
    session.send = failing_send
    return session

oneshot.open_local = failing
from chat_app.__main__ import main
main(sys.argv[1:])
"""


def test_a_local_model_failing_mid_reply_is_one_line_exit_1_and_keeps_what_came(ckpt, data_dir):
    done = subprocess.run([sys.executable, "-c", FAILING, "--model", str(ckpt), *TINY, "--ignore-eos",
                           "--max-tokens", "50", "-p", "Hi"], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=TIMEOUT)
    err = one_line(done, 1)
    assert "the model failed mid-reply: RuntimeError: CUDA error: out of memory (traceback in" in err, err
    assert "Traceback" in (data_dir / "tinyllm-chat.log").read_text()  # was: a fatal line, the reply not saved
    (user, reply) = rows(data_dir)
    assert user[2:] == ("user", "Hi", 0, 0)
    assert reply[2] == "assistant" and reply[3] and done.stdout.decode() == shown(reply[3])  # kept as it came


def test_stdout_closed_stops_the_reply_and_keeps_it(ckpt, data_dir):
    """`| head`: the reader is gone before the reply's first write (closed here before it can begin)."""
    proc = subprocess.Popen([CLI, "--model", str(ckpt), *TINY, "--ignore-eos", "--max-tokens", "1000", "-p", "Hi"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 141 and err == b"", (proc.returncode, err)
    (user, reply) = rows(data_dir)
    assert user[3] == "Hi" and reply[2] == "assistant" and reply[4:] == (1, 0) and reply[3]


def test_a_resumed_chat_keeps_its_settings_under_the_command_lines(ckpt, data_dir):
    from chat_app.store import Store

    first = run("--model", str(ckpt), *TINY, "--ignore-eos", "--max-tokens", "4", "-p", "Hi", "--json")
    chat = json.loads(first.stdout.decode().splitlines()[-1])["chat"]
    store = Store.open(data_dir)
    store.open_chat(chat)
    store.set_setting("max_tokens", "3")  # /set max_tokens 3, in the app
    store.close()

    def tokens(*argv: str) -> int:
        done = run(*TINY, "--ignore-eos", "--resume", "-p", "More", "--json", *argv)
        assert done.returncode == 0, done.stderr
        end = json.loads(done.stdout.decode().splitlines()[-1])
        assert end["chat"] == chat and end["reason"] == "max_tokens"
        return end["reply_tokens"]

    assert tokens() == 3  # the chat's own value (and its own model: no --model here)
    assert tokens("--max-tokens", "5") == 5  # the command line's wins


def test_a_chat_open_in_another_instance_is_not_continued(ckpt, data_dir):
    from chat_app.store import Store

    first = run("--model", str(ckpt), *TINY, "--ignore-eos", "--max-tokens", "2", "-p", "Hi", "--json")
    chat = json.loads(first.stdout.decode().splitlines()[-1])["chat"]
    other = Store.open(data_dir)  # another tinyllm-chat with the chat open
    other.open_chat(chat)
    try:
        assert "the last chat is open in another tinyllm-chat" in one_line(run("--resume", "-p", "More"), 2)
        assert "that chat is open in another tinyllm-chat" in one_line(run("--chat", str(chat), "-p", "More"), 2)
    finally:
        other.close()
    assert len(rows(data_dir)) == 2


def test_a_resumed_chat_past_the_context_says_what_was_dropped(ckpt, data_dir):
    argv = ["--model", str(ckpt), *TINY, "--max-len", "64", "--ignore-eos", "--max-tokens", "8", "--json"]
    for turn in range(8):
        done = run(*argv, *(["--resume"] if turn else []), "-p", f"turn {turn} of the chat")
        assert done.returncode == 0, done.stderr
        dropped = json.loads(done.stdout.decode().splitlines()[0])["dropped"]
        if dropped:
            assert done.stderr.decode() == (f"tinyllm-chat: note: the oldest {dropped} messages of this chat no longer "
                                            "fit the context: the model did not see them\n"
                                            "tinyllm-chat: note: the reply reached max_tokens (8) and ends there; "
                                            "--max-tokens N allows more\n")
            return
    raise AssertionError("eight turns of about 14 tokens fit a context of 64")


# ---- a server: --json, control characters, faults ---------------------------------------------

CONTROLS = "".join(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)])
SEQUENCES = ("\x1b]52;c;aGVsbG8=\x07", "\x1b]0;owned\x1b\\", "\x1b[2J\x1b[31m", "\x1bP1$r0m\x1b\\",
             "\x9b2J", "\x9d0;title\x9c", "\x90q\x9c")


def test_a_servers_reply_with_controls_is_written_visible(stub, data_dir):
    stub.reply = ["plain ", CONTROLS, *SEQUENCES, " end"]
    raw = "".join(stub.reply)
    done = run("--model", stub.url, "-p", "Hi")
    assert done.returncode == 0, done.stderr
    no_controls(done.stdout.replace(b"\n", b""))
    assert done.stdout.decode() == printable(raw) + "\n"
    assert rows(data_dir)[-1][3] == raw  # the chat keeps what came (the export and the screen show it visible)

    lines = run("--model", stub.url, "-p", "Hi", "--json", "--no-save")
    assert lines.returncode == 0, lines.stderr
    no_controls(lines.stdout.replace(b"\n", b""))
    events = [json.loads(line) for line in lines.stdout.decode().splitlines()]
    assert "".join(e["text"] for e in events if e["event"] == "token") == raw == events[-1]["text"]  # exact
    assert events[-1]["reason"] == "eos" and events[-1]["model"].startswith("tiny-remote") and events[-1]["chat"] is None
    assert stub.bodies[-1]["messages"][-1] == {"role": "user", "content": "Hi"}


def test_a_server_that_cuts_the_reply_is_exit_1_and_keeps_it(stub, data_dir):
    stub.script = ["cut"]
    done = run("--model", stub.url, "-p", "Hi", "--system", "Be kind.", "--temperature", "0.3")
    assert done.returncode == 1 and done.stderr.decode().startswith("tinyllm-chat: error: "), done.stderr
    assert done.stderr.decode().count("\n") == 1 and done.stdout.decode() == "Hello from\n"
    assert [r[2:] for r in rows(data_dir)] == [("user", "Hi", 0, 0), ("assistant", "Hello from", 1, 0)]
    body = stub.bodies[-1]
    assert body["temperature"] == 0.3 and body["messages"][0] == {"role": "system", "content": "Be kind."}


def test_ctrl_c_while_a_server_streams(stub, data_dir):
    stub.script = ["hold"]
    proc = subprocess.Popen([CLI, "--model", stub.url, "-p", "Hi"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    first = os.read(proc.stdout.fileno(), 65536)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130 and err == b"" and (first + rest).decode() == "Hello\n"
    assert [r[2:] for r in rows(data_dir)] == [("user", "Hi", 0, 0), ("assistant", "Hello", 1, 0)]


# ---- files and stdin refused, options that need a message ----------------------------------------

def test_files_and_stdin_that_cannot_be_sent_are_one_line_and_exit_2(tmp_path, data_dir):
    (tmp_path / "bin").write_bytes(b"ab\0cd")
    (tmp_path / "latin1").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "big").write_bytes(b"a" * (MAX_BYTES + 1))
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "b.bin").write_bytes(b"\0")
    (tmp_path / "dev").symlink_to("/dev/zero")
    cases = {"bin": "is binary", "latin1": "is not UTF-8 text", "big": "over the limit of 1,048,576 bytes",
             "fifo": "a special file (a FIFO)", "folder": "holds no text file to attach (skipped: folder/b.bin (binary))",
             "dev": "a special file (/dev/zero)", "missing": "cannot read", "/dev/null": "a special file (/dev/null)"}
    for name, says in cases.items():
        path = name if name.startswith("/") else str(tmp_path / name)
        assert says in one_line(run("-p", "Hi", "-f", path), 2), name
    assert "stdin is binary" in one_line(run("-p", "Hi", stdin=b"\x89PNG\0\0"), 2)
    assert "stdin is over the limit" in one_line(run(stdin=b"a" * (MAX_BYTES + 1)), 2)
    for argv in (["-f", str(tmp_path / "latin1")], ["--json"], ["--no-save"], ["--chat", "1"]):
        assert "with a message: -p PROMPT, or text on stdin" in one_line(run(*argv), 2)
    assert "give one" in one_line(run("-p", "Hi", "--resume", "--chat", "1"), 2)
    assert not (data_dir / "chat.db").exists()


def test_f_takes_a_folder_or_a_glob_as_read_does(tmp_path, data_dir):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("A = 1\n")
    (tmp_path / "src" / "b.py").write_text("B = 2\n")
    (tmp_path / "src" / "c.bin").write_bytes(b"\0")
    from chat_app.__main__ import build_parser, oneshot_message

    args = build_parser().parse_args(["-p", "Say", "-f", str(tmp_path / "src"), "-f", str(tmp_path / "src" / "*.py")])
    sys_stdin, sys.stdin = sys.stdin, None  # no stdin
    try:
        message = oneshot_message(args)
    finally:
        sys.stdin = sys_stdin
    assert message == "src/a.py\n```\nA = 1\n```\n\nsrc/b.py\n```\nB = 2\n```\n\nSay"  # each file once
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.py").write_text("A = 3\n")
    args = build_parser().parse_args(["-p", "Say", "-f", str(tmp_path / "src" / "a.py"),
                                      "-f", str(tmp_path / "other" / "a.py")])
    sys_stdin, sys.stdin = sys.stdin, None
    try:
        message = oneshot_message(args)
    finally:
        sys.stdin = sys_stdin
    assert message == "a.py\n```\nA = 1\n```\n\nother/a.py\n```\nA = 3\n```\n\nSay"  # two files, two names


def test_help_says_p_f_json_and_the_context():
    helped = run("--help").stdout.decode()
    for said in ("-p PROMPT, --prompt PROMPT", "-f PATH, --file PATH", "--json", "--no-save", "--chat ID",
                 "A message longer than the context is refused"):
        assert said in " ".join(helped.split()), said
