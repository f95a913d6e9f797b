"""Chat templates: how a conversation becomes text a model was trained on.

A template renders one message at a time, so a conversation's token ids are the
concatenation of each message's ids: a new turn is encoded and prefilled alone, after the
conversation so far (no re-render, no re-prefill). Built in: "chatml" (the default model's
own, and SmolLM2's), "llama2" ([INST] ... [/INST]), "zephyr" (<|user|> ... </s>), "gemma"
(<start_of_turn>user ... <end_of_turn>, the system text at the head of the first user turn,
as Gemma's own template puts it: for a Gemma file that carries no template).

Contract: `TEMPLATES[name]` is a `ChatTemplate`; `get_template(name)` raises a ValueError
naming the choices. `system` and `user` are format strings with exactly one plain
`{content}` field and nothing else (no attribute, index, conversion or format spec: a spec
like "{content.__class__}" would write object reprs into the prompt); anything else is a
ValueError when the template is made. `stop` lists the pieces that end an assistant reply besides EOS.
`thinking` is a template's thinking switch (Qwen 3's `enable_thinking`): what the generation
prompt adds after `assistant_prefix` with thinking on and off ("" and "<think>\n\n</think>\n\n"),
() where it has none; `reasoning_end` ("</think>") is where the text of an earlier reply that
the template sends back begins (`visible`); "" where it sends replies back whole.
"""

from __future__ import annotations

import string
from dataclasses import dataclass


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    system: str  # "{content}" rendered as the system message
    user: str  # "{content}" rendered as a user message
    assistant_prefix: str  # opens an assistant reply (the generation prompt)
    assistant_suffix: str  # closes an assistant reply (fed with the next turn)
    stop: tuple[str, ...] = ()  # pieces that end a reply (besides EOS)
    bos: bool = True  # the conversation starts with BOS
    system_in_first_user: bool = False  # llama2: the system text lives inside the first [INST]
    thinking: tuple[str, ...] = ()  # the generation prompt's tail with thinking (on, off); () no switch
    reasoning_end: str = ""  # an earlier reply is sent back from after its last one ("</think>")

    def __post_init__(self) -> None:
        for name in ("system", "user"):
            _check_format(name, getattr(self, name))
        if self.thinking and (len(self.thinking) != 2 or not all(isinstance(t, str) for t in self.thinking)):
            raise ValueError(f"chat template thinking must be two strings (on, off), got {self.thinking!r}")
        for name in ("assistant_prefix", "assistant_suffix", "reasoning_end"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"chat template {name} must be a string, got {getattr(self, name)!r}")

    @property
    def thinking_default(self) -> bool | None:
        """Whether the template thinks when not told (None: it has no switch)."""
        if not self.thinking:
            return None
        on, off = self.thinking
        return not (off == "" and on != "")

    def visible(self, content: str) -> str:
        """An earlier reply as the template sends it back: without its reasoning (Qwen 3:
        `content.split('</think>')[-1].lstrip('\\n')`)."""
        end = self.reasoning_end
        return content.split(end)[-1].lstrip("\n") if end and end in content else content

    def render_system(self, content: str) -> str:
        return self.system.format(content=content)

    def render_user(self, content: str, system: str | None = None) -> str:
        if self.system_in_first_user and system:
            content = self.system.format(content=system) + content
        return self.user.format(content=content)


def _check_format(name: str, fmt: object) -> None:
    if not isinstance(fmt, str):
        raise ValueError(f"chat template {name} must be a string, got {fmt!r}")
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(fmt) if f is not None]
    except ValueError as e:
        raise ValueError(f"chat template {name} {fmt!r} is not a format string ({e})") from None
    if fields != [("content", "", None)]:
        raise ValueError(f"chat template {name} {fmt!r} must hold exactly one plain {{content}} field")


TEMPLATES: dict[str, ChatTemplate] = {
    "chatml": ChatTemplate(
        name="chatml",
        system="<|im_start|>system\n{content}<|im_end|>\n",
        user="<|im_start|>user\n{content}<|im_end|>\n",
        assistant_prefix="<|im_start|>assistant\n",
        assistant_suffix="<|im_end|>\n",
        stop=("<|im_end|>",),
    ),
    "llama2": ChatTemplate(
        name="llama2",
        system="<<SYS>>\n{content}\n<</SYS>>\n\n",
        user="[INST] {content} [/INST]",
        assistant_prefix="",
        assistant_suffix=" </s><s>",
        stop=("</s>",),
        system_in_first_user=True,
    ),
    "gemma": ChatTemplate(
        name="gemma",
        system="{content}\n\n",
        user="<start_of_turn>user\n{content}<end_of_turn>\n",
        assistant_prefix="<start_of_turn>model\n",
        assistant_suffix="<end_of_turn>\n",
        stop=("<end_of_turn>",),
        system_in_first_user=True,
    ),
    "zephyr": ChatTemplate(
        name="zephyr",
        system="<|system|>\n{content}</s>\n",
        user="<|user|>\n{content}</s>\n",
        assistant_prefix="<|assistant|>\n",
        assistant_suffix="</s>\n",
        stop=("</s>",),
    ),
}


def get_template(name: str) -> ChatTemplate:
    if name not in TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; choose one of {', '.join(TEMPLATES)}")
    return TEMPLATES[name]
