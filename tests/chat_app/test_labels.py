"""Issue 31, section 2: every string that did not come from this code (model names, chat titles
and first messages, system prompts, file names, what a notice echoes) goes on the screen as
plain text: `[/b]`, `[/]` and `[bold]` show as typed (they raised MarkupError: the chat list
and the first reply crashed the app), and control characters show as symbols, so an OSC 0
(title), OSC 52 (clipboard) or CSI (clear) sequence never reaches the terminal
(chat_app.labels). What the screen shows is read as the terminal would get it: Textual's own
screenshot (notices too), as text. The real terminal, through a pty: tests/chat_app/test_pty.py."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from chat_app.commands import shortened
from chat_app.labels import printable
from chat_app.store import Saved, Store, StoreError
from chat_app.widgets.chat_list import ChatList
from chat_app.widgets.reply import Reply
from tests.chat_app.conftest import loaded, notes, notices, send, wait_until

pytestmark = pytest.mark.anyio
SIZE = (120, 40)
ESCAPES = "\x1b]0;PWNED\x07\x1b]52;c;SGVsbG8=\x07\x1b[2J"  # OSC 0 (title), OSC 52 (clipboard), CSI 2J (clear)
HOSTILE = f"[bold]x[/b] {ESCAPES}"
SHOWN = printable(HOSTILE)  # "[bold]x[/b] ␛]0;PWNED␇␛]52;c;SGVsbG8=␇␛[2J"
FILE = "g" + HOSTILE.replace("/", "|")  # as a file's name: a GGUF is named by its file (issue 34, item 9)
FILE_SHOWN = printable(FILE)
CONTROLS = {chr(c) for c in [*range(32), *range(0x7F, 0xA0)]} - {"\n"}


def screen_text(app) -> str:
    """The screen as the terminal would get it, without styles (as App.export_screenshot renders it)."""
    console = Console(width=app.size.width, height=app.size.height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text(styles=False)


async def shows(pilot, *texts: str) -> str:
    """Wait until the screen holds each text; assert it holds no control character; the screen."""
    await wait_until(pilot, lambda: all(t in screen_text(pilot.app) for t in texts), what=f"{texts} on screen")
    screen = screen_text(pilot.app)
    assert not CONTROLS & set(screen), f"a control character reaches the terminal:\n{screen!r}"
    return screen


def named_checkpoint(ckpt, folder, name: str):
    """A copy of the tiny checkpoint whose config.json names it `name`."""
    named = shutil.copytree(ckpt, folder / "named")
    config = json.loads((named / "config.json").read_text())
    (named / "config.json").write_text(json.dumps({**config, "name": name}))
    return named


def named_gguf(path, name: str):
    """The tiny model as a GGUF file whose general.name is `name`."""
    gguf = pytest.importorskip("gguf")
    from tests.tinyllm.test_gguf import sp_kv, tiny, write_gguf
    from tinyllm.tools.testing import make_tiny_tokenizer

    tok = make_tiny_tokenizer(path.parent)
    add_name = gguf.GGUFWriter.add_name
    gguf.GGUFWriter.add_name = lambda self, _: add_name(self, name)
    try:
        write_gguf(path, tiny(tok.vocab_size, tie=True), {}, sp_kv(tok))
    finally:
        gguf.GGUFWriter.add_name = add_name
    return path


async def test_titles_first_messages_and_saved_chats_are_plain_text(make_app, data_dir):
    store = Store.open(data_dir, model=HOSTILE)
    store.add(Saved("user", "In BBCode, what does [/b] do?"))
    store.add(Saved("assistant", f"It ends bold. {HOSTILE}", model=HOSTILE))
    store.set_system(f"Be {HOSTILE}")  # mid-chat: a note where it was set
    store.add(Saved("user", "More"))
    store.add(Saved("assistant", "Yes.", model=HOSTILE))
    store.new_chat()
    store.add(Saved("user", "a chat to rename"))
    store.add(Saved("assistant", "ok", model="tiny"))
    store.rename(store.conversation, f"t {ESCAPES}")
    store.add_prompt(f"an old prompt {HOSTILE}")
    store.close()
    app = make_app("--max-tokens", "3")
    async with app.run_test(size=SIZE, notifications=True) as pilot:  # toasts on screen too
        await loaded(pilot)
        await pilot.press("up")  # an earlier run's prompt, from the store
        await shows(pilot, f"an old prompt {SHOWN}")
        await pilot.press("down")
        await pilot.press("ctrl+o")  # was: MarkupError, exit 1 (and again on every launch)
        assert isinstance(app.screen, ChatList)
        await pilot.pause()
        await shows(pilot, "In BBCode, what does [/b] do?", printable(f"t {ESCAPES}"), SHOWN[:19] + "…")
        await pilot.press("f2")  # the rename shows the title's controls as symbols, too
        assert app.screen.query_one("#rename").value == printable(f"t {ESCAPES}")
        await shows(pilot)
        await pilot.press("enter")  # unchanged: the title stays as stored
        assert app.store.chats()[0].title == f"t {ESCAPES}"
        await pilot.press("f2")
        app.screen.query_one("#rename").value = "my notes [/]"
        await pilot.press("enter")  # was: MarkupError
        await shows(pilot, "my notes [/]")
        await pilot.press("ctrl+d")
        await shows(pilot, "Delete “my notes [/]”?")
        await pilot.press("n", "down", "enter")  # open the BBCode chat
        await wait_until(pilot, lambda: not isinstance(app.screen, ChatList) and len(app.query(Reply)) == 2,
                         what="the saved chat on screen")
        await wait_until(pilot, lambda: len(app.session.messages) == 4, what="the saved chat in the session")
        app.clear_notifications()
        await pilot.pause()
        await shows(pilot, "In BBCode, what does [/b] do?", SHOWN, f"It ends bold. {SHOWN}", f"system prompt: Be {SHOWN}")
        await send(pilot, "/show")  # the system prompt in a command's note
        assert f"System prompt: Be {SHOWN}" in notes(app)[-1]
        await shows(pilot, "System prompt: Be [bold]x[/b]", "␛]0;PWNED␇␛]52;c;SGVsbG8=␇␛[2J")  # the note
    assert not [n for n in notices(app) if "rror" in n]


async def test_model_names_are_plain_text(make_app, ckpt, tmp_path):
    """A config.json "name" and a GGUF's file name: the load's progress, the status bar, the
    reply's border title (was: MarkupError on the first reply), the chat list and notices."""
    app = make_app("--model", str(named_checkpoint(ckpt, tmp_path, HOSTILE)), "--max-tokens", "3")
    gguf = named_gguf(tmp_path / "gguf" / f"{FILE}.gguf", f"g{HOSTILE}")  # general.name is not shown
    async with app.run_test(size=SIZE, notifications=True) as pilot:  # toasts on screen too
        await loaded(pilot)
        assert str(app.load_progress.label.render()).startswith(f"Loading {SHOWN}: ")
        await send(pilot, "hi")
        app.clear_notifications()
        await pilot.pause()
        await shows(pilot, "· ready · [bold]x[/b] ␛]0;PWNED", f"╭─ {SHOWN} ─")
        await send(pilot, f"/system Be {HOSTILE}")
        await wait_until(pilot, lambda: app.session.system == f"Be {HOSTILE}")
        await send(pilot, "/show")
        await send(pilot, f"/export {tmp_path / HOSTILE.replace('/', '|')}.md")
        await wait_until(pilot, lambda: any("Exported" in n for n in notices(app)), what="the export (a worker writes it)")
        await send(pilot, f"/{HOSTILE.replace(' ', '')}")
        show = notes(app)[-2]
        assert show.startswith(f"Model: {SHOWN} on cpu") and f"\nSystem prompt: Be {SHOWN}\n" in show, show
        exported = f"{tmp_path / HOSTILE.replace('/', '|')}.md"
        assert Path(exported).is_file()
        assert notices(app)[-1] == f"Exported 2 messages to {shortened(printable(exported))}.", "one line, shown"
        assert notes(app)[-1] == f"Unknown command /{SHOWN.replace(' ', '')}; /help lists them."
        await shows(pilot, "Exported 2 messages to", "Unknown command")  # the toast, the note (wrapped)
        app.clear_notifications()
        await shows(pilot, f"system prompt: Be {SHOWN}")
        await send(pilot, f"/model {gguf}")
        await wait_until(pilot, lambda: app.session is not None and app.session.name == FILE,
                         what="the GGUF to load")
        # the notice comes once the switch has cleared the old chat, after the session is set
        await wait_until(pilot, lambda: any(n.startswith(f"Now chatting with {FILE_SHOWN}, in a new chat")
                                            for n in notices(app)), what="the switch's notice")
        await send(pilot, "hi")
        await pilot.press("ctrl+o")
        await pilot.pause()
        await shows(pilot, FILE_SHOWN[:19] + "…", SHOWN[:19] + "…")  # the chat list's model column
        await pilot.press("escape")
        app.clear_notifications()
        await pilot.pause()
        await shows(pilot, f"╭─ {FILE_SHOWN} ─", "· ready · g[bold]x[|b] ␛]0;PWNE")


EVERY_CONTROL = "".join(chr(c) for c in [*range(32), *range(0x7F, 0xA0)])  # C0, DEL and C1: tab and newline too
REPLY = f"Here: {ESCAPES} \x1bP1$r0m\x1b\\ (DCS) and every control: {EVERY_CONTROL} end"  # as a server might send it


def assert_inert(data: bytes) -> str:
    """data as UTF-8 holds no control character a terminal acts on (tab and newline are kept) and
    shows the escapes as the screen does; the text."""
    text = data.decode("utf-8")
    assert not (CONTROLS - {"\t"}) & set(text), f"a control character reaches the file:\n{text!r}"
    assert b"\x1b" not in data and b"\x07" not in data and b"\xc2\x9b" not in data  # ESC, BEL, C1 CSI
    assert printable(REPLY) in text and "␛]52;c;SGVsbG8=␇" in text and "\t" in text
    return text


async def test_export_and_the_unsaved_copy_write_no_control_a_terminal_acts_on(make_app, data_dir, tmp_path,
                                                                               monkeypatch):
    """Issue 52, defect 1: a reply holding OSC 52 (clipboard), OSC 0 (title) and CSI 2J was stored
    raw and /export wrote it raw: `cat` of the file set the clipboard and the title. chat.db keeps
    it as it came (nothing lost); /export and the unsaved-*.md written at quit (the one Markdown
    rendering, chat_app.history.markdown) show each control as the screen does."""
    import sqlite3

    store = Store.open(data_dir, model=HOSTILE)
    store.add(Saved("user", f"say {ESCAPES}"))
    store.add(Saved("assistant", REPLY, model=HOSTILE))
    store.close()
    app = make_app("--max-tokens", "3", "--resume")
    out = tmp_path / "chat.md"
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the resumed chat")
        await send(pilot, f"/export {out}")
        await wait_until(pilot, lambda: any("Exported" in n for n in notices(app)), what="the export (a worker writes it)")
    text = assert_inert(out.read_bytes())
    assert f"## {SHOWN}" in text and f"say {printable(ESCAPES)}" in text  # the model's name and the message too
    with sqlite3.connect(data_dir / "chat.db") as db:  # the store: the reply as it came
        assert db.execute("SELECT content FROM messages WHERE role = 'assistant'").fetchall() == [(REPLY,)]

    not_a_folder = tmp_path / "file"  # a data folder that is a file: the chat goes to unsaved-*.md at quit
    not_a_folder.write_text("")
    store = Store(not_a_folder / "chat.db")
    for m in (Saved("user", "hi"), Saved("assistant", REPLY, model=HOSTILE)):
        with pytest.raises(StoreError):
            store.add(m)
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    assert store.rescue()
    assert_inert(next(here.glob("unsaved-*.md")).read_bytes())


async def test_what_the_app_copies_holds_no_control_a_terminal_acts_on(make_app, data_dir, monkeypatch):
    """Issue 52, part 5: the clipboard is written out too. A copied message (C on a picked one:
    UserMessage keeps the text as typed, for the input to take back) and a copied reply (Ctrl+T)
    go out with every control made visible; OSC 52 carries the copy to the terminal's clipboard,
    and a paste of it into a shell would act on what it holds."""
    from textual.app import App

    store = Store.open(data_dir)
    store.add(Saved("user", f"say {REPLY}"))
    store.add(Saved("assistant", REPLY))
    store.close()
    copied: list[str] = []
    monkeypatch.setattr(App, "copy_to_clipboard", lambda self, text: copied.append(text))  # what goes out
    app = make_app("--max-tokens", "3", "--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2, what="the resumed chat")
        await pilot.press("ctrl+t")  # the last reply
        await pilot.press("tab", "home", "c")  # the first message, picked and copied
        await wait_until(pilot, lambda: len(copied) == 2, what="two copies")
    assert copied[1].startswith("say ")
    for text in copied:
        assert_inert(text.encode())
