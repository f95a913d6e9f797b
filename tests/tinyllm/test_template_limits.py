"""Chat templates with no limits: costly Jinja renders and format-string specs are refused."""

import time

import pytest

import tinyllm.text.jinja_template as jt
from tinyllm.text.chat_template import ChatTemplate
from tinyllm.text.jinja_template import derive_template, template_from_dict

pytest.importorskip("jinja2")
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_normal_template_still_derives():
    assert derive_template(CHATML, is_piece=lambda p: True).stop == ("<|im_end|>",)


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + CHATML,  # calls
    "{% set s = 'a' * 100000 %}{% for i in s %}{% for j in s %}{% endfor %}{% endfor %}" + CHATML,  # no calls
])
def test_a_template_that_never_ends_is_stopped(monkeypatch, source):
    monkeypatch.setattr(jt, "MAX_RENDER_SECONDS", 0.5)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="costs too much"):
        derive_template(source)
    assert time.monotonic() - t0 < 30  # not minutes (without the bound: hours)


@pytest.mark.parametrize("source", ["{{ 'a' * 1500000000 }}" + CHATML, "{{ [1] * 10**9 }}" + CHATML,
                                    "{{ 2 ** 1000000000 }}" + CHATML, "{% set n = 10 %}{{ 2 ** (n ** 9) }}" + CHATML,
                                    "{% for i in range(100000) %}{{ 'xxxxxxxxxx' }}{% endfor %}" + CHATML])
def test_a_template_that_builds_too_much_is_stopped(source):
    with pytest.raises(ValueError, match="costs too much"):
        derive_template(source)


@pytest.mark.parametrize("user", ["{content.__class__.__mro__}", "{content!r}", "{content:>1000000000}",
                                  "{content[0]}", "{other}", "no field", "{content}{content}", "{", 5])
def test_bad_format_specs_are_refused(user):
    with pytest.raises(ValueError, match="user"):
        ChatTemplate(name="x", system="{content}", user=user, assistant_prefix="", assistant_suffix="")
    with pytest.raises(ValueError):
        template_from_dict({"name": "x", "system": "{content}", "user": user, "assistant_prefix": "",
                            "assistant_suffix": ""})


def test_escaped_braces_are_fine():
    t = ChatTemplate(name="x", system="{{sys}} {content}", user="{{u}} {content}", assistant_prefix="{",
                     assistant_suffix="}")
    assert t.render_user("hi") == "{u} hi"


@pytest.mark.parametrize("chat", [{"template": "nope"},
                                  {"spec": {"name": "x", "system": "{content}", "user": "{content.__class__}",
                                            "assistant_prefix": "", "assistant_suffix": ""}}])
def test_a_checkpoint_with_a_bad_template_fails_the_cli_check(tmp_path, chat):
    import json

    from tinyllm.formats.open_model import inspect_any
    from tinyllm.tools.testing import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path / "tiny", max_seq_len=64)
    config = json.loads((path / "config.json").read_text())
    config["chat"] = chat
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="template"):
        inspect_any(path)
