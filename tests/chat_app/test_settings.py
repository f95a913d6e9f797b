"""Items 4, 6 and 7 of issue 13: settings that stay and show, prompt history across runs,
themes that persist; the config file and the command line over it."""

from __future__ import annotations

import pytest

from chat_app import config
from chat_app.__main__ import build_parser, main
from chat_app.commands import plural
from chat_app.store import Saved, Store
from tests.chat_app.conftest import loaded, notes, notices, send, wait_until
from tinyllm.decode.sampling_params import LIMITS

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


async def test_settings_history_and_theme_come_back_after_a_restart(make_app, tmp_path):
    app = make_app("--max-tokens", "1", "--ignore-eos")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "/set temperature 0.5")
        await send(pilot, "/system Be kind.")
        await wait_until(pilot, lambda: app.session.system == "Be kind.")
        await send(pilot, "first prompt")
        await send(pilot, "/stats")
        assert any(n.startswith("Last reply: 1 token at") for n in notes(app)), notes(app)
        await send(pilot, "/theme nord")
        await send(pilot, "/theme no-such-theme")
        assert app.theme == "nord" and any("Unknown theme" in n for n in notes(app))
    assert config.load()["theme"] == "nord"
    app = make_app("--resume", "--theme", config.load()["theme"])  # as main() would, from the file
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2 and app.session.params.temperature == 0.5,
                         what="the chat and its settings")
        assert app.session.system == "Be kind." and app.theme == "nord"
        await send(pilot, "/show")
        shown = notes(app)[-1]
        assert "System prompt: Be kind." in shown and "Set in this chat: temperature 0.5" in shown
        await pilot.press("up")  # in an empty prompt: edits the chat's last message (issue 34, item 7)
        assert app.prompt.editing == app.prompt.text == "first prompt"
        await pilot.press("up")  # then earlier runs' prompts, from the store
        assert app.prompt.text == "/show" and app.prompt.editing is None
        await pilot.press("up", "up", "up", "up")  # /theme x2, /stats, then the message
        assert app.prompt.text == "first prompt"
        await pilot.press("ctrl+n")  # a new chat keeps what is set now
        await wait_until(pilot, lambda: not app.session.messages)
        assert app.session.params.temperature == 0.5


def test_config_file_gives_defaults_the_command_line_wins(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "config"
    monkeypatch.setenv("TINYLLM_CHAT_CONFIG_DIR", str(folder))
    folder.mkdir()
    (folder / "config.toml").write_text('temperature = 0.7\nmax-tokens = 64\ntheme = "gruvbox"\n')
    args = build_parser(config.load()).parse_args(["--temperature", "0.2"])
    assert (args.temperature, args.max_tokens, args.theme) == (0.2, 64, "gruvbox")
    config.save("theme", "nord")
    assert config.load()["theme"] == "nord" and config.load()["max_tokens"] == 64
    for bad, says in [("temperature = 'hot'\n", "temperature must be a float"), ("colour = 1\n", "unknown setting"),
                      ("temperature = \n", "config file")]:
        (folder / "config.toml").write_text(bad)
        with pytest.raises(SystemExit) as e:
            main([])
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and err.count("\n") == 1, err
    assert plural(1, "token") == "1 token" and plural(2, "token") == "2 tokens"


# ---- issue 31, section 4: values that made every reply fail, refused where they are set -------

def errors(app) -> list[str]:
    """The refusals of commands: error notes in the conversation."""
    from chat_app.widgets.system_note import SystemNote

    return [n.text for n in app.query(SystemNote) if n.severity == "error"]


@pytest.mark.parametrize("line, says", [
    ("temperature = 1e308\n", "temperature must be 0 (greedy) or from 0.001 to 100, got 1e+308"),
    ("top-k = 1000000000000000000\n", "top_k must be from 0 (off) to 1,000,000, got 1000000000000000000"),
    ("repeat_penalty = 0\n", "repeat_penalty must be from 0.01 to 100 (1 = off), got 0")])
def test_config_values_no_reply_can_use_are_one_line_naming_the_file(monkeypatch, capsys, line, says):
    from chat_app.app import ChatApp

    monkeypatch.setattr(ChatApp, "run", lambda self: pytest.fail("the app opened"))
    config.path().parent.mkdir(parents=True)
    config.path().write_text(line)
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2 and capsys.readouterr().err == f"tinyllm-chat: error: config file {config.path()}: {says}\n"


async def test_set_refuses_values_no_reply_can_use_and_replies_go_on(make_app):
    app = make_app("--max-tokens", "2")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        params = app.session.params
        for name, value in [("temperature", "1e308"), ("top_k", str(10**30)), ("repeat_penalty", "1e308"),
                            ("top_p", "1e-300"), ("max_tokens", "2000000")]:
            await send(pilot, f"/set {name} {value}")  # was: accepted, then every reply failed
            assert errors(app)[-1].startswith(f"{name} must be {LIMITS[name][2]}, got "), errors(app)
        assert len(errors(app)) == 5 and app.session.params == params and not app.store.settings
        await send(pilot, "hi")
        assert len(errors(app)) == 5 and app.session.messages[-1].role == "assistant"


async def test_a_saved_value_no_reply_can_use_is_skipped_and_the_rest_apply(make_app, data_dir):
    store = Store.open(data_dir)
    store.add(Saved("user", "Hi"))
    store.add(Saved("assistant", "Hello."))
    for name, value in [("temperature", "1e308"), ("top_k", "40"), ("top_p", "1e-300"), ("max_tokens", "3"),
                        ("warmth", "9")]:
        store.set_setting(name, value)  # as a chat.db written before the limits, or by hand
    store.close()
    app = make_app("--resume")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: (app.session.params.top_k, app.session.params.max_tokens) == (40, 3),
                         what="the saved settings that are fine")  # was: the first bad one stopped the rest
        skipped = [n for n in notices(app) if n.startswith("Skipped a setting saved with this chat: ")]
        assert [n.split(": ", 1)[1].split(" ", 1)[0] for n in skipped] == ["temperature", "top_p", "unknown"], skipped
        assert "temperature must be 0 (greedy) or from 0.001 to 100, got 1e+308" in skipped[0]
        assert (app.session.params.temperature, app.session.params.top_p) == (0.0, 1.0)  # the launch's
        assert app.store.settings == {"top_k": "40", "max_tokens": "3"}  # /show says what applies
        await send(pilot, "again")
        assert not errors(app) and app.session.messages[-1].role == "assistant"
