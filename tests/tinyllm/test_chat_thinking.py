# ruff: noqa: E501  (QWEN3_TEMPLATE keeps the lines of Qwen 3's own template)
"""Qwen 3's thinking: the template's switch (enable_thinking) split per message, earlier turns
sent back as the template renders them (no reasoning, no empty think block), the session's
family and switch. QWEN3_TEMPLATE mirrors Qwen 3's own chat template (its tool parts left out:
the last reply after the last question gets a think block, earlier replies lose theirs through
`content.split('</think>')[-1]`, the generation prompt closes an empty block when thinking is off)."""

import jinja2
import pytest

from tests.tinyllm.test_conversation import Bytes, Cache
from tinyllm.session.conversation import Conversation
from tinyllm.text.chat_template import TEMPLATES
from tinyllm.text.jinja_template import derive_template

QWEN3_TEMPLATE = r"""{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""


def render(messages: list[tuple[str, str]], **kwargs) -> str:
    """The conversation as Qwen 3's template renders it for the next reply (Jinja itself)."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(QWEN3_TEMPLATE).render(messages=[{"role": r, "content": c} for r, c in messages],
                                                  add_generation_prompt=True, **kwargs)


def qwen3():
    return derive_template(QWEN3_TEMPLATE, None, "<|im_end|>")


def test_the_qwen3_template_splits_per_message_with_its_thinking_switch():
    t = qwen3()
    assert (t.assistant_prefix, t.assistant_suffix) == ("<|im_start|>assistant\n", "<|im_end|>\n")
    assert t.thinking == ("", "<think>\n\n</think>\n\n") and t.thinking_default is True
    assert t.reasoning_end == "</think>" and t.visible("<think>\nhm\n</think>\n\nYes.") == "Yes."
    assert TEMPLATES["chatml"].thinking_default is None and TEMPLATES["chatml"].visible("a</think>b") == "a</think>b"


@pytest.mark.parametrize("thinking", [True, False])
def test_earlier_think_blocks_are_not_in_the_ids(thinking):
    """The ids the model sees for the next reply are the template's whole render: earlier
    replies without their reasoning, the generation prompt as the switch says; the cache keeps
    the prefix it shares."""
    c = Conversation(Bytes(), qwen3(), 4096, Cache())
    c.thinking = thinking
    said: list[tuple[str, str]] = []
    for question, reply in [("Hi?", "<think>\nThey greet.\n</think>\n\nHello!"), ("2+2?", "<think>\nadd\n</think>\n\n4"),
                            ("Thanks", "You are welcome.")]:
        c.add_user(question, 64)
        said.append(("user", question))
        kw = {} if thinking else {"enable_thinking": False}
        assert c.context == c.encode(render(said, **kw)), question
        c.cache.ids = list(c.context)  # prefilled
        reply_ids = c.encode(reply)  # what the model wrote
        c.cache.ids += reply_ids
        c.add_reply(reply_ids, reply, stopped=False)
        said.append(("assistant", reply))
    assert "They greet" not in str(c.context) and c.messages[1].content.startswith("<think>")
    c.add_user("Bye", 64)
    context = bytes(i - 3 for i in c.context if i > 2).decode()
    assert "<think>" not in context.split("Bye")[0] and "They greet" not in context
    assert c.cache.ids == c.context[:len(c.cache.ids)], "the cache holds a prefix of the context"


def test_regenerate_takes_the_switch_as_it_stands_and_undo_puts_it_back():
    c = Conversation(Bytes(), qwen3(), 4096, Cache())
    c.add_user("Hi?", 64)
    c.add_reply(c.encode("<think>\nx\n</think>\n\nHello"), "<think>\nx\n</think>\n\nHello", stopped=False)
    before = list(c.context)
    c.thinking = False
    undo = c.take_back_reply()
    assert c.context == c.encode(render([("user", "Hi?")], enable_thinking=False))
    undo()
    assert c.context == before


def test_loaded_chats_and_fitting_render_as_the_template_does():
    c = Conversation(Bytes(), qwen3(), 260, Cache())
    turns = [("user", "one"), ("assistant", "<think>\nlong thoughts here\n</think>\n\nA1"), ("user", "two")]
    c.load_messages(turns)
    assert c.context == c.encode(render(turns))
    c.thinking = False
    c.load_messages(turns)
    assert c.context == c.encode(render(turns, enable_thinking=False))
    c.add_reply(c.encode("A2"), "A2", stopped=False)
    dropped, _ = c.add_user("three " * 20, 64)  # the oldest turns leave; what stays renders as the template does
    assert dropped > 0
    kept = [(m.role, m.content) for m in c.messages[c.first_message:]]
    assert c.context == c.encode(render(kept, enable_thinking=False))


def test_a_session_names_its_family_and_switches_thinking_where_the_template_has_it(tmp_path):
    torch = pytest.importorskip("torch")
    from tests.tinyllm.test_families import make_family
    from tests.tinyllm.test_hf import save_bpe
    from tinyllm.session.chat import open_session

    path = tmp_path / "qwen3"
    tok = save_bpe(path)
    make_family("qwen3", path, tok.get_vocab_size())
    (path / "chat_template.jinja").write_text(QWEN3_TEMPLATE)
    s = open_session(path, "cpu", compile=None)
    assert s.family == "qwen3" and s.thinking is True
    s.set_thinking(False)
    s.set_param("max_tokens", "3")
    list(s.send("Hi"))
    assert s.context[:len(s.encode(render([("user", "Hi")], enable_thinking=False)))] == \
        s.encode(render([("user", "Hi")], enable_thinking=False))
    del torch
