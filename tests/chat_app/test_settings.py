"""Items 4, 6 and 7 of issue 13: settings that stay and show, prompt history across runs,
themes that persist; the config file and the command line over it."""

from __future__ import annotations

import pytest

from chat_app import config
from chat_app.__main__ import build_parser, main
from chat_app.commands import plural
from tests.chat_app.conftest import loaded, notices, send, wait_until

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
        assert any(n.startswith("Last reply: 1 token at") for n in notices(app)), notices(app)
        await send(pilot, "/theme nord")
        await send(pilot, "/theme no-such-theme")
        assert app.theme == "nord" and any("Unknown theme" in n for n in notices(app))
    assert config.load()["theme"] == "nord"
    app = make_app("--resume", "--theme", config.load()["theme"])  # as main() would, from the file
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await wait_until(pilot, lambda: len(app.session.messages) == 2 and app.session.params.temperature == 0.5,
                         what="the chat and its settings")
        assert app.session.system == "Be kind." and app.theme == "nord"
        await send(pilot, "/show")
        shown = notices(app)[-1]
        assert "System prompt: Be kind." in shown and "Set in this chat: temperature 0.5" in shown
        await pilot.press("up")  # earlier runs' prompts, from the store
        assert app.prompt.text == "/show"
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
