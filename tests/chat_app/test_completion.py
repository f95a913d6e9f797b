"""Tab completion's pure function (chat_app.completion): what a Tab makes of the prompt's text."""

from __future__ import annotations

import pytest

from chat_app.commands import COMMANDS
from chat_app.completion import Completion, Sources, complete, paths

FILES = ("data/", "data.txt", "docs/", "./data/", "./data.txt")  # what the file system would offer
SOURCES = Sources(themes=["gruvbox", "nord", "textual-dark", "textual-light"],
                  settings={"temperature": ["0.0"], "top_p": ["1.0"], "top_k": ["0"], "seed": ["none"]},
                  models=["/m/tinychat", "/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "hf:owner/repo"],
                  files=lambda word: [p for p in FILES if p.startswith(word)])


def tab(text: str, sources: Sources = SOURCES) -> str | None:
    """The text after one Tab that extends it (None: it cannot)."""
    found = complete(text, sources)
    return None if found is None else found.extended()


@pytest.mark.parametrize("typed, after", [
    ("/th", "/theme "),  # one command, which takes an argument: a space after it
    ("/he", "/help"),  # one that takes none: no space
    ("/cont", "/continue"),
    ("/ch", "/chats"),
    ("/theme n", "/theme nord"),
    ("/theme text", "/theme textual-"),  # as far as they agree
    ("/set te", "/set temperature "),  # a setting's name, then its value follows
    ("/set temperature ", "/set temperature 0.0"),  # the value in force
    ("/set seed n", "/set seed none"),
    ("/model tiny", "/model /m/tinychat"),  # a known model by its folder's name ...
    ("/model smol", "/model /data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),  # ... file's name, any case
    ("/model hf:o", "/model hf:owner/repo"),  # ... or as /model takes it
    ("/model ./da", "/model ./data"),  # a path: data/, data.txt
    ("/export do", "/export docs/"),  # a folder: no space, more path may follow
    ("/export! da", "/export! data"),
    ("/read do", "/read docs/"),  # /read takes a path too
    ("see @do", "see @docs/"),  # @PATH in a message
    ("two lines\nand @./da", "two lines\nand @./data"),
])
def test_one_tab(typed, after):
    assert tab(typed) == after


@pytest.mark.parametrize("typed", [
    "hello", "", "/unknown", "/help ", "/system be", "/theme zzz", "/set nope ", "/set temperature 0.0\n",
    "hi /theme n",  # a command only at the start of the message
    "/model da",  # neither a known model nor a path (no "/", ".", "~"): the folder is not listed
])
def test_nothing_to_complete(typed):
    assert complete(typed, SOURCES) is None


@pytest.mark.parametrize("typed, choices", [
    ("/c", ("chats", "clear", "continue")),  # they part at once: nothing added, listed instead
    ("/theme textual-", ("textual-dark", "textual-light")),
])
def test_candidates_that_part_at_the_cursor_add_nothing(typed, choices):
    found = complete(typed, SOURCES)
    assert found is not None and found.extended() is None and found.choices == choices


def test_slash_alone_lists_every_command_sorted():
    found = complete("/", SOURCES)
    assert found is not None and found.extended() is None
    assert found.choices == tuple(sorted(COMMANDS)) and "theme" in found.choices and len(found.choices) == 13


def test_a_whole_word_has_nothing_more():
    """A unique candidate already typed whole: nothing to complete (the prompt lets Tab move the focus)."""
    found = complete("/theme nord", SOURCES)
    assert found is not None and found.choices == ("nord",) and found.extended() is None
    assert tab("/help") is None


def test_choices_go_round():
    found = complete("/theme textual-", SOURCES)
    assert isinstance(found, Completion) and found.choices == ("textual-dark", "textual-light")
    assert [found.choice(turn) for turn in range(3)] == ["/theme textual-dark", "/theme textual-light",
                                                         "/theme textual-dark"]


def test_set_names_then_values_follow_the_commands_parsing():
    found = complete("/set top", SOURCES)
    assert found is not None and found.choices == ("top_p", "top_k") and found.more
    assert found.extended() == "/set top_"
    assert tab("/set top-p ") == "/set top-p 1.0"  # /set takes top-p for top_p
    assert complete("/set temperature 0.0 1", SOURCES) is None


def test_model_paths_come_from_the_file_system(tmp_path, monkeypatch):
    (tmp_path / "models" / "tinychat").mkdir(parents=True)
    (tmp_path / "models" / "SmolLM2.gguf").write_text("")
    (tmp_path / "models" / ".hidden").write_text("")
    monkeypatch.chdir(tmp_path)
    sources = Sources(models=["/m/tinychat"])
    assert tab("/model ./mo", sources) == "/model ./models/"
    found = complete("/model ./models/", sources)
    assert found is not None and found.choices == ("./models/SmolLM2.gguf", "./models/tinychat/")
    assert tab("/model models/t", sources) == "/model models/tinychat/"
    assert tab(f"/model {tmp_path}/models/S", sources) == f"/model {tmp_path}/models/SmolLM2.gguf"
    assert complete("/model ./models/.", sources).choices == ("./models/.hidden",)  # dot files once "." is typed
    assert complete("/model ./nowhere/x", sources) is None


def test_paths_keep_a_tilde_as_typed(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "notes.md").write_text("")
    assert paths("~/no") == ["~/notes.md"]
    assert paths("/definitely/not/here/") == []
