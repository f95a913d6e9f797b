"""Issue 34, item 8: the command palette (Ctrl+P; chat_app.palette) and Tab completion in the
prompt, through Pilot: the palette opens, typing filters it, and choosing a command, a
setting, a theme, a saved chat or a model does what the command would."""

from __future__ import annotations

import pytest
from textual.command import CommandList, CommandPalette

from chat_app import config, known_models, palette
from chat_app.commands import COMMANDS
from chat_app.store import Saved, Store
from chat_app.widgets.conversation import Conversation
from tests.chat_app.conftest import loaded, notes, wait_until
from tests.chat_app.test_chats import other_model, seed_chats
from tests.chat_app.test_labels import screen_text

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


def searching(app) -> bool:
    """The palette is still gathering hits (its list may be filled again, the pick back at the top)."""
    return any(w.node is app.screen and not w.is_finished for w in app.workers)


def shown(app) -> list[str]:
    """The palette's hits, as their plain text, best first."""
    if not CommandPalette.is_open(app):
        return []
    options = app.screen.query_one(CommandList)
    return [str(options.get_option_at_index(i).hit.text) for i in range(options.option_count)
            if getattr(options.get_option_at_index(i), "hit", None) is not None]


async def search(pilot, query: str, want: str) -> list[str]:
    """Open the palette afresh and type the query; the hits once `want` is among them. (Each key
    is handled before the next, so the last search begun is the query's: once it has ended,
    the list is its.)"""
    app = pilot.app
    if CommandPalette.is_open(app):
        await pilot.press("escape")
    await pilot.press("ctrl+p")
    await wait_until(pilot, lambda: CommandPalette.is_open(app), what="the palette to open")
    await pilot.press(*query)
    assert app.screen.query_one("CommandInput").value == query
    await wait_until(pilot, lambda: not searching(app) and want in shown(app),
                     what=f"{want!r} among the hits for {query!r}")
    return shown(app)


async def choose(pilot, query: str, want: str) -> None:
    """Search, move to the hit `want` and press Enter; the palette closes."""
    hits = await search(pilot, query, want)
    pilot.app.screen.query_one(CommandList).highlighted = hits.index(want)
    await pilot.press("enter")
    await wait_until(pilot, lambda: not CommandPalette.is_open(pilot.app), what="the palette to close")
    await pilot.pause()


async def test_ctrl_p_lists_the_commands_and_typing_filters(make_app, data_dir):
    seed_chats(data_dir)
    store = Store.open(data_dir, model="SmolLM2")
    store.add(Saved("user", "In BBCode, what does [/b] do?"))  # shown as typed, never read as markup
    store.close()
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: "^p Commands" in screen_text(app).splitlines()[-1],
                         what="the footer's right end")
        await pilot.press("ctrl+p")
        await wait_until(pilot, lambda: not searching(app) and len(shown(app)) == len(COMMANDS),
                         what="the commands listed")
        assert shown(app)[:2] == ["/set NAME VALUE", "/system TEXT"]  # the table's order: one discover
        hits = await search(pilot, "nord", "Theme: nord")
        assert hits[0] == "Theme: nord" and not any(h.startswith("/") for h in hits)
        hits = await search(pilot, "temperature", "Set: temperature")
        assert hits[0] == "Set: temperature" and "Set: regen_temperature" in hits
        hits = await search(pilot, "Old answer", "Chat: Old question")  # by its text, through the store
        assert hits[0] == "Chat: Old question" and "Chat: Newer question" not in hits  # ranked as a title would be
        assert "Model: tinychat" in await search(pilot, "tinychat", "Model: tinychat")  # the models folder
        await search(pilot, "[/b]", "Chat: In BBCode, what does [/b] do?")
        assert "[/b]" in screen_text(app)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not CommandPalette.is_open(app), what="Esc to close it")
        await pilot.press("ctrl+o")  # over the chat list it stays shut: what it chooses acts on the chat
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert not CommandPalette.is_open(app)


async def test_choosing_runs_a_command_or_fills_the_prompt(make_app, data_dir):
    seed_chats(data_dir)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await choose(pilot, "stats", "/stats")  # takes no argument: runs
        assert notes(app)[-1] == "No reply yet."
        await choose(pilot, "theme", "/theme NAME")  # takes one: into the prompt, to finish
        assert app.prompt.text == "/theme " and app.focused is app.prompt
        assert app.prompt.cursor_location == app.prompt.document.end
        await choose(pilot, "top_k", "Set: top_k")
        assert app.prompt.text == "/set top_k "
        await choose(pilot, "gruvbox", "Theme: gruvbox")  # applied and kept, as /theme does
        assert app.theme == "gruvbox" and config.load()["theme"] == "gruvbox"
        assert notes(app)[-1].startswith("Theme gruvbox (kept in")
        await choose(pilot, "old quest", "Chat: Old question")  # opened as the chat list opens it
        await wait_until(pilot, lambda: [m.content for m in app.session.messages][:1] == ["Old question"],
                         what="the chosen chat in the session")
        assert app.store.chat.messages[0].content == "Old question"


async def test_choosing_a_model_switches_to_it(make_app, data_dir, tmp_path, monkeypatch):
    folder = tmp_path / "models"
    other = other_model(folder, "other")
    monkeypatch.setattr(known_models, "models_folder", lambda: folder)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        old = await loaded(pilot)
        hits = await search(pilot, "model", "Model: other")
        assert "/model PATH" in hits
        await choose(pilot, "other", "Model: other")
        await wait_until(pilot, lambda: app.session is not None and app.session is not old, what="the other model")
        assert app.session.path == str(other.resolve())


def test_known_models_are_the_folders_and_the_saved_chats(data_dir, tmp_path):
    """The models folder's models, then those saved chats used, the newest first: each once, a
    local one only while it is there."""
    folder = tmp_path / "models"
    for name in ("tinychat", "__pycache__", ".hidden"):
        (folder / name).mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    gone, kept = tmp_path / "gone.gguf", tmp_path / "kept.gguf"
    kept.write_text("")
    store = Store.open(data_dir)
    try:
        for name, path, spec in [("gone", gone, None), ("kept", kept, None), ("hub", tmp_path / "cache.gguf", "hf:o/r"),
                                 ("tinychat", folder / "tinychat", None), ("kept", kept, None)]:
            store.model, store.model_path, store.model_spec = name, str(path), spec
            store.add(Saved("user", f"a chat with {name}"))
            store.new_chat()
        assert palette.known_models(store, folder) == [
            ("tinychat", str(folder / "tinychat")), ("kept", str(kept)), ("hub", "hf:o/r")]
    finally:
        store.close()


async def test_tab_completes_a_command_then_its_arguments(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        prompt = app.prompt
        await pilot.press(*"/th", "tab")
        assert prompt.text == "/theme "
        await pilot.press("tab")  # the themes part at once: listed under the input, the text as it was
        assert prompt.text == "/theme " and "nord" in str(prompt.border_subtitle)
        themes = sorted(app.available_themes)
        await pilot.press("tab")
        assert prompt.text == f"/theme {themes[0]}"
        assert str(prompt.border_subtitle).startswith(f"Tab: {themes[1]}  {themes[2]}")  # what Tab puts in next
        await pilot.press("tab")  # Tab again: the next one
        assert prompt.text == f"/theme {themes[1]}"
        await pilot.press("x")  # typing ends it
        assert not prompt.border_subtitle and prompt.text == f"/theme {themes[1]}x"
        prompt.load_text("/set temp")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("tab", "tab")
        assert prompt.text == "/set temperature 0.0"  # the name, then the value in force
        assert app.focused is prompt
        await pilot.press("tab")  # nothing more to complete: Tab moves on, as it always has
        assert isinstance(app.focused, Conversation)
        await pilot.press("shift+tab")
        prompt.load_text("hello")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("tab")  # not a command: the focus moves
        assert isinstance(app.focused, Conversation) and prompt.text == "hello"
