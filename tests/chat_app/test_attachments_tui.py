"""Files in a message, in the app (issue 52, part 2): `/read PATH` and `@PATH` (Tab-completed)
attach text files as chips over the input; Enter sends them fenced under their names before the
text, saved with the chat as sent; a chip's × or Backspace at the input's start removes it;
binary, unreadable and special files, and anything past the limits, are refused in one line,
the chat untouched; a message past the context comes back, chips and all, with how far over it
is. Under Pilot, with the tiny model in its child process; no test waits on time."""

from __future__ import annotations

import os

import pytest

from chat_app.attachments import MAX_FILES, Attachment, compose, fenced, gather, merged, split
from chat_app.widgets.attachment_bar import AttachmentBar
from chat_app.widgets.conversation import UserMessage
from tests.chat_app.conftest import loaded, notes, notices, rows, send, wait_until

SIZE = (100, 30)
pytestmark = pytest.mark.anyio


@pytest.fixture
def files(tmp_path):
    tmp_path = tmp_path / "files"  # beside the app's data folder
    tmp_path.mkdir()
    (tmp_path / "notes.md").write_text("# Notes\nthe sea is blue\n")
    (tmp_path / "code.py").write_text("print('hi')\n" * 10)
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\0\0\0binary")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner.txt").write_text("inside\n")
    (tmp_path / ".hidden").write_text("secret\n")
    return tmp_path


def users(app) -> list[str]:
    return [w.text for w in app.query(UserMessage)]


def chips(app) -> list[str]:
    return app.chat_screen.query_one(AttachmentBar).chips


async def command(pilot, text: str) -> None:
    app = pilot.app
    app.prompt.load_text(text)
    await pilot.press("enter")
    await wait_until(pilot, lambda: not app.prompt.text, what=f"{text} to run")
    await pilot.pause()


def test_split_undoes_compose():
    attached = [Attachment("a.py", "x = 1\n"), Attachment("empty", ""), Attachment("b.md", "``` inside\nno end"),
                Attachment("pasted text", "y" * 100)]
    message = compose(attached, "explain them")
    back, text = split(message)
    assert [a.name for a in back] == ["a.py", "empty", "b.md", "pasted text"] and text == "explain them"
    assert compose(back, text) == message
    assert split("plain words") == ([], "plain words")
    assert split("a.py\n```\nunclosed") == ([], "a.py\n```\nunclosed")


def test_a_file_read_again_replaces_itself_and_a_namesake_takes_more_of_its_path(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.txt").write_text(f"from {d}\n")
    a, b = gather(str(tmp_path / "a" / "x.txt"))[0], gather(str(tmp_path / "b" / "x.txt"))[0]
    assert [x.name for x in a + b] == ["x.txt", "x.txt"]  # an absolute path: named by its file's name
    both = merged(a, b)
    assert [(x.name, x.text) for x in both] == [("x.txt", "from a\n"), ("b/x.txt", "from b\n")]
    (tmp_path / "a" / "x.txt").write_text("edited\n")
    again = merged(both, gather(str(tmp_path / "a" / "x.txt"))[0])  # the same file: its new read, once
    assert [(x.name, x.text) for x in again] == [("b/x.txt", "from b\n"), ("x.txt", "edited\n")]
    third = merged(again, [Attachment("b/x.txt", "elsewhere", "/c/b/x.txt")])  # no shorter name free
    assert [x.name for x in third] == ["b/x.txt", "x.txt", "c/b/x.txt"]
    back, _ = split(compose(third, "hi"))  # chips of a message come back with no path: matched by name
    assert [x.name for x in merged(back, [Attachment("x.txt", "new", "/a/x.txt")])] == ["b/x.txt", "c/b/x.txt", "x.txt"]
    pasted = merged([Attachment("pasted text", "1")], [Attachment("pasted text", "2")])
    assert [(x.name, x.text) for x in pasted] == [("pasted text", "2")]


async def test_two_files_of_one_name_are_two_chips(make_app, data_dir, tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x.txt").write_text(f"from {d}\n")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await command(pilot, f"/read {tmp_path / 'a' / 'x.txt'}")
        await command(pilot, f"/read {tmp_path / 'b' / 'x.txt'}")
        assert chips(app) == ["x.txt · ~2 tokens", "b/x.txt · ~2 tokens"]  # was one: the second replaced the first
        await send(pilot, "compare")
        sent = compose([Attachment("x.txt", "from a\n"), Attachment("b/x.txt", "from b\n")], "compare")
        assert [r[3] for r in rows(data_dir) if r[2] == "user"] == [sent]


async def test_read_attaches_a_chip_that_is_sent_fenced_and_saved(make_app, data_dir, files):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        path, content = "notes.md", "# Notes\nthe sea is blue\n"  # an absolute path: named by its file's name
        await command(pilot, f"/read {files / path}")
        assert chips(app) == [f"{path} · ~6 tokens"]  # 24 bytes / 4
        assert app.chat_screen.query_one(AttachmentBar).display and not notes(app)  # the chip is the answer
        await send(pilot, "What colour is the sea?")
        sent = compose([Attachment(path, content)], "What colour is the sea?")
        assert [r[3] for r in rows(data_dir) if r[2] == "user"] == [sent]  # saved as sent
        assert sent.startswith(fenced(path, content))
        assert users(app) == [sent] and chips(app) == [] and not app.chat_screen.query_one(AttachmentBar).display
        shown = str(app.query(UserMessage).last().render())
        assert f"▪ {path} · attached, ~6 tokens" in shown and "the sea is blue" not in shown
        assert app.session.messages[0].content == sent  # what the model got


async def test_a_folder_and_a_glob_attach_their_text_files(make_app, files):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await command(pilot, f"/read {files}")
        names = [c.split(" · ")[0] for c in chips(app)]
        assert names == [f"{files.name}/{n}" for n in ("code.py", "notes.md", "sub/inner.txt")]  # no .hidden, png
        assert "Attached 3 files" in notes(app)[-1] and "logo.png (binary)" in notes(app)[-1]
        await command(pilot, f"/read {files}/*.py")  # the same file again, by the same name: one chip
        assert len(chips(app)) == 3 and chips(app)[-1].startswith(f"{files.name}/code.py")


@pytest.mark.parametrize("what", ["binary", "missing", "fifo", "device", "folder-too-big", "no-match", "total"])
async def test_refused_in_one_line_and_nothing_attached(make_app, data_dir, files, what):
    os.mkfifo(files / "pipe")
    for i in range(MAX_FILES + 1):
        (files / "sub" / f"f{i:02}.txt").write_text("x\n")
    (files / "big.txt").write_text("y" * (700 * 1024))
    (files / "big2.txt").write_text("z" * (700 * 1024))
    arg, says = {"binary": (files / "logo.png", "is binary"), "missing": (files / "nope.txt", "cannot read"),
                 "fifo": (files / "pipe", "a special file (a FIFO)"), "device": ("/dev/zero", "a special file"),
                 "folder-too-big": (files / "sub", f"more than {MAX_FILES} files"),
                 "no-match": (f"{files}/*.rs", "nothing matches"), "total": (files / "big*.txt", "over the")}[what]
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        before = rows(data_dir)
        await command(pilot, f"/read {arg}")
        said = notes(app)[-1]
        assert said.startswith("/read: ") and says in said and "\n" not in said, said
        assert chips(app) == [] and rows(data_dir) == before and not users(app)


async def test_a_chip_goes_with_its_cross_or_backspace_at_the_start(make_app, files):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await command(pilot, f"/read {files}/*.py")
        await command(pilot, f"/read {files}/notes.md")
        assert len(chips(app)) == 2
        bar = app.chat_screen.query_one(AttachmentBar)
        await pilot.pause()
        x = 1 + len(f" {chips(app)[0]} ") + 1  # the padding, the first chip, then its " × "
        await pilot.click(AttachmentBar, offset=(x, 0))
        await wait_until(pilot, lambda: len(chips(app)) == 1, what="the click to remove the first chip")
        assert chips(app)[0].startswith("notes.md")
        app.prompt.load_text("typed")
        app.prompt.move_cursor((0, 2))
        await pilot.press("backspace")  # not at the start: a character
        assert app.prompt.text == "tped" and len(chips(app)) == 1
        app.prompt.move_cursor((0, 0))
        await pilot.press("backspace")
        assert app.prompt.text == "tped" and chips(app) == [] and not bar.display


async def test_at_path_completes_with_tab_and_is_attached_when_sent(make_app, data_dir, files, monkeypatch):
    monkeypatch.chdir(files)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.prompt.load_text("what does @co")
        app.prompt.move_cursor(app.prompt.document.end)
        await pilot.press("tab")
        assert app.prompt.text == "what does @code.py"
        app.prompt.insert(" print, asks @alice")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.busy and not app.prompt.text, what="the reply")
        text = "what does @code.py print, asks @alice"
        assert [r[3] for r in rows(data_dir) if r[2] == "user"] == [compose([Attachment("code.py", "print('hi')\n"
                                                                                       * 10)], text)]
        # mid-text: the word at the cursor completes, what follows stays
        app.prompt.load_text("see @no and @sub/i")
        app.prompt.move_cursor((0, 7))
        await pilot.press("tab")
        assert app.prompt.text == "see @notes.md and @sub/i" and app.prompt.cursor_location == (0, 13)


async def test_at_path_that_cannot_be_attached_keeps_the_message(make_app, data_dir, files, monkeypatch):
    monkeypatch.chdir(files)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        app.prompt.load_text("look at @logo.png")
        await pilot.press("enter")
        await wait_until(pilot, lambda: notices(app), what="the refusal")
        assert notices(app)[-1].startswith("Not sent: logo.png is binary")
        assert app.prompt.text == "look at @logo.png" and not users(app) and not rows(data_dir)


async def test_past_the_context_the_message_comes_back_with_its_chips(make_app, data_dir, files):
    (files / "long.txt").write_text("word " * 400)
    app = make_app("--max-len", "128", "--max-tokens", "4")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await command(pilot, f"/read {files}/long.txt")
        app.prompt.load_text("summarize it")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.busy and app.prompt.text and notices(app), what="the refusal")
        said = notices(app)[-1]
        assert said.startswith("message too long: ") and " over what the context holds (128, " in said, said
        over = int(said.split(", ")[1].split(" over")[0].replace(",", ""))
        assert over > 0 and "\n" not in said
        assert app.prompt.text == "summarize it" and chips(app)[0].startswith("long.txt")
        assert not users(app) and not [r for r in rows(data_dir) if r[2] == "user"]  # the chat untouched
