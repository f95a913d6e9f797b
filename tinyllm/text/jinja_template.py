"""Chat templates from Jinja: a model's own `chat_template` (Hugging Face tokenizer_config.json
or chat_template.jinja, GGUF `tokenizer.chat_template`) turned into a per-message ChatTemplate.

ChatSession renders and prefills one message at a time; a Jinja template renders a whole
conversation. `derive_template` renders the Jinja template on small probe conversations
whose contents are markers, reads the per-message format strings off the differences, and
then checks them: a whole multi-turn conversation (with and without a system prompt) must
render to exactly the text Jinja renders. A template that cannot be split per message
(it rewrites earlier turns, or renders something that depends on the whole conversation)
is a ValueError; callers fall back to a built-in template (`guess_builtin`).

Contract:
- `derive_template(source, bos_token, eos_token, add_bos, is_piece) -> JinjaChatTemplate`.
  `bos` is True when the template starts with the BOS text, or when it never writes BOS and
  the tokenizer adds it itself (`add_bos`, as llama.cpp does). `stop` holds the special
  looking tokens ("<|im_end|>", "</s>"; single pieces by `is_piece`) that close a reply.
- `JinjaChatTemplate` is a ChatTemplate plus `default_system`: the system text the template
  writes when the conversation has none (SmolLM2's "You are a helpful AI assistant named
  SmolLM, ..."); open a session with it as the system prompt to match the model's template.
- Rendering follows transformers' environment: sandboxed, trim_blocks, lstrip_blocks,
  loopcontrols, raise_exception, tojson, strftime_now; and bounded: all the probe renders of
  one template together get MAX_RENDER_SECONDS, each render MAX_RENDER_CHARS of output, and a
  string or list made with `*` at most MAX_RENDER_CHARS items (a ValueError past any bound:
  a template with nested `range(100000)` loops or `'a' * 10**9` fails in seconds, in bounded
  memory).
- A template with a thinking switch (Qwen 3's `enable_thinking`) gets `thinking`: the generation
  prompt's tail with it true and false; and `reasoning_end` ("</think>") where it sends an
  earlier reply back without its reasoning exactly as `ChatTemplate.visible` does. Qwen 3's empty
  think block in the last reply after the last question is allowed: it vanishes once a question
  follows, which is how replies are sent back.
- `jinja_source(template) -> str`: the other way, a Jinja chat template (transformers' variables:
  messages, add_generation_prompt, bos_token, enable_thinking) that renders a conversation as
  the ChatTemplate renders it message by message (BOS as `bos_token` where the template has it,
  the system message where it goes, earlier replies as `visible` sends them back, the generation
  prompt and its thinking tail), so `derive_template(jinja_source(t))` gives `t` back. It writes
  `default_system` where the conversation has no system message (the model's own template did).
- `guess_builtin(text)` names the built-in template whose markers a template source or a
  model name shows ("<|im_start|>" -> chatml, "[INST]" -> llama2, "<|user|>" -> zephyr,
  "<start_of_turn>" or "gemma" -> gemma).
Refuses: a missing jinja2 (ValueError naming the extra to install); templates that do not
render or do not split per message (ValueError).
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime

from tinyllm.text.chat_template import TEMPLATES, ChatTemplate, get_template

__all__ = ["JinjaChatTemplate", "derive_template", "guess_builtin", "jinja_source", "template_from_dict"]

MAX_RENDER_SECONDS = 3.0  # all probe renders of one template (a real one takes milliseconds)
MAX_RENDER_CHARS = 200_000  # per render, and per string/list built with `*` (a real one: < 2,000)
_INSTALL = "pip install jinja2 (a dependency of tinyllm-chat since issue 34)"
# Probe contents: plain words, so strip()/trim in a template leaves them alone.
_SPECIAL = re.compile(r"<[^<>\s]+>|\[/?[A-Z_]+\]")
S, U1, A1, U2, A2, U3 = "qqSYSTEMqq", "qqUSER1qq", "qqASSIST1qq", "qqUSER2qq", "qqASSIST2qq", "qqUSER3qq"


@dataclass(frozen=True)
class JinjaChatTemplate(ChatTemplate):
    default_system: str | None = None  # the system text the template writes when none is given


def template_from_dict(d: dict) -> ChatTemplate:
    """The inverse of dataclasses.asdict for a (Jinja) ChatTemplate, as stored in config.json."""
    known = {f.name for f in fields(JinjaChatTemplate)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown chat template fields {unknown}")
    try:
        return JinjaChatTemplate(**{**d, "stop": tuple(d.get("stop", ())), "thinking": tuple(d.get("thinking", ()))})
    except TypeError as e:
        raise ValueError(f"incomplete chat template spec ({e})") from None


def guess_builtin(text: str) -> str | None:
    """The built-in template a template source or model name points at, or None."""
    low = text.lower()
    if "<|im_start|>" in text or "chatml" in low or "smollm" in low or "qwen" in low:
        return "chatml"
    if "[inst]" in low or "llama-2" in low or "llama2" in low or "mistral" in low:
        return "llama2"
    if "<|user|>" in text or "zephyr" in low or "tinyllama" in low:
        return "zephyr"
    if "<start_of_turn>" in text or "gemma" in low:
        return "gemma"
    return None


class _TooCostly(Exception):
    """A template render went past a bound (raised inside the render, turned into a ValueError)."""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise _TooCostly in this thread if the block runs longer than `seconds`. A loop with
    no call in it cannot be stopped from inside the sandbox, so a timer thread raises the
    exception in this one (CPython's PyThreadState_SetAsyncExc; it lands between bytecodes)."""
    tid, lock, state = threading.get_ident(), threading.Lock(), {"active": True, "fired": False}
    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async.argtypes = (ctypes.c_ulong, ctypes.py_object)

    def fire() -> None:
        with lock:
            if state["active"]:
                state["fired"] = True
                set_async(tid, _TooCostly)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["active"] = False
            if state["fired"]:  # fired, maybe not delivered yet: never let it escape later
                set_async(tid, ctypes.py_object())


def _environment():
    try:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ValueError(f"reading this model's chat template needs jinja2: {_INSTALL}") from None

    class LimitedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_RENDER_CHARS:
                        raise _TooCostly(f"'*' would build {len(seq) * n} items")
            if operator == "**" and isinstance(right, int) and abs(right) > 1024:
                raise _TooCostly(f"'**' with an exponent of {right}")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = LimitedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _msgs(*pairs: tuple[str, str]) -> list[dict]:
    return [{"role": r, "content": c} for r, c in pairs]


def _fmt(text: str, marker: str) -> str:
    """`text` with `marker` made the {content} field (literal braces escaped)."""
    if text.count(marker) != 1:
        raise ValueError(f"a message's content appears {text.count(marker)} times in its rendering")
    a, b = text.split(marker)
    esc = lambda s: s.replace("{", "{{").replace("}", "}}")  # noqa: E731
    return esc(a) + "{content}" + esc(b)


def _around(fmt: str) -> tuple[str, str]:
    """The literal text before and after {content} in a format string."""
    pre, post = fmt.split("{content}")
    unesc = lambda s: s.replace("{{", "{").replace("}}", "}")  # noqa: E731
    return unesc(pre), unesc(post)


def _after(longer: str, shorter: str, what: str) -> str:
    if not longer.startswith(shorter):
        raise ValueError(f"adding {what} changes how the earlier messages render")
    return longer[len(shorter):]


def derive_template(source: str, bos_token: str | None = None, eos_token: str | None = None,
                    add_bos: bool = False, is_piece: Callable[[str], bool] | None = None,
                    name: str | None = None) -> JinjaChatTemplate:
    """Split a Jinja chat template into per-message format strings (see the module doc)."""
    env = _environment()
    try:
        tmpl = env.from_string(source)
    except Exception as e:  # jinja2.TemplateSyntaxError and friends
        raise ValueError(f"the chat template does not parse ({e})") from None
    bos_text, eos_text = bos_token or "", eos_token or ""

    deadline = time.monotonic() + MAX_RENDER_SECONDS

    def render(messages: list[dict], gen: bool, **extra: object) -> str:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise _TooCostly("out of time")
            with _time_limit(left):
                out: list[str] = []
                size = 0
                for piece in tmpl.generate(messages=messages, add_generation_prompt=gen, bos_token=bos_text,
                                           eos_token=eos_text, tools=None, documents=None, **extra):
                    size += len(piece)
                    if size > MAX_RENDER_CHARS:
                        raise _TooCostly(f"more than {MAX_RENDER_CHARS} characters of output")
                    out.append(piece)
                return "".join(out)
        except _TooCostly as e:
            raise ValueError(f"the chat template costs too much to render ({e or 'out of time'}; limits: "
                             f"{MAX_RENDER_SECONDS:g} s, {MAX_RENDER_CHARS} characters)") from None
        except Exception as e:  # the template's own raise_exception, undefined names, ...
            raise ValueError(f"the chat template does not render a plain conversation ({e})") from None

    r_u1 = render(_msgs(("user", U1)), False)
    prefix = _after(render(_msgs(("user", U1)), True), r_u1, "the generation prompt")
    r_u1a1 = render(_msgs(("user", U1), ("assistant", A1)), False)
    reply = _after(r_u1a1, r_u1, "an assistant message")
    if not reply.startswith(prefix) or A1 not in reply:
        raise ValueError("an assistant message does not start with the generation prompt")
    lead, suffix = reply[len(prefix):].split(A1, 1)
    if lead.strip():
        # Qwen 3 writes an (empty) think block into the last reply after the last question
        # only: once a question follows, the reply renders without it, which is how a reply
        # is sent back. Where it does not vanish, adding a user message below says so.
        r_u1a1, lead = r_u1 + prefix + A1 + suffix, ""
    user = _fmt(_after(render(_msgs(("user", U1), ("assistant", A1), ("user", U2)), False), r_u1a1,
                       "a user message"), U2)
    first_user = user.format(content=U1)
    if not r_u1.endswith(first_user):
        raise ValueError("the first user message renders unlike the later ones")
    head = r_u1[:-len(first_user)]
    # The template writes BOS first (through the variable: SmolLM2's BOS is "<|im_start|>",
    # which its template writes as a message opener, not as BOS).
    bos_written = bool(bos_text) and "bos_token" in source and head.startswith(bos_text)
    head = head[len(bos_text):] if bos_written else head

    # The system message: its own block, or merged into the first user message (llama2).
    in_first_user, system_renders = False, True
    try:
        r_s = render(_msgs(("system", S), ("user", U1)), False)
    except ValueError:  # templates that refuse a system role (Mistral): put it before the text
        system, in_first_user, system_renders = "{content}\n\n", True, False
    else:
        r_s = r_s[len(bos_text):] if bos_written else r_s
        if r_s.endswith(first_user):
            system = _fmt(r_s[:-len(first_user)], S)
        else:
            pre, post = _around(user)
            middle = r_s[len(pre):len(r_s) - len(post)] if r_s.startswith(pre) and r_s.endswith(post) else ""
            if not middle.endswith(U1):
                raise ValueError("the system message renders neither alone nor inside the first user message")
            system, in_first_user = _fmt(middle[:-len(U1)], S), True
    default_system = None
    if head:
        pre, post = _around(system)
        if in_first_user or not (head.startswith(pre) and head.endswith(post)):
            raise ValueError(f"the template writes {head!r} before the first message, "
                             "which is no system block")
        default_system = head[len(pre):len(head) - len(post)]
    # BOS: written by the template, or (when the template never writes it) added by the
    # tokenizer itself, as llama.cpp does.
    bos = bos_written or (add_bos and bool(bos_text) and "bos_token" not in source and bos_text not in source)

    # Stop pieces: the special-looking single tokens that close a reply ("<|im_end|>", "</s>").
    marks = [m for m in _SPECIAL.findall(suffix) if is_piece is None or is_piece(m)]
    stop = tuple(dict.fromkeys(marks or ([eos_text] if eos_text and eos_text in suffix else [])))
    builtin = next((n for n, t in TEMPLATES.items()
                    if (t.system, t.user, t.assistant_prefix, t.assistant_suffix, t.system_in_first_user)
                    == (system, user, prefix, suffix, in_first_user)), None)
    thinking, reasoning_end = _thinking(source, render, r_u1, prefix, suffix, user)
    out = JinjaChatTemplate(name=name or builtin or "jinja", system=system, user=user,
                            assistant_prefix=prefix, assistant_suffix=suffix, stop=stop, bos=bos,
                            system_in_first_user=in_first_user, default_system=default_system,
                            thinking=thinking, reasoning_end=reasoning_end)
    _check(out, render, lead, bos_text if bos_written else "", system_renders)
    return out


def _thinking(source: str, render, r_u1: str, prefix: str, suffix: str, user: str) -> tuple[tuple[str, ...], str]:
    """(the generation prompt's tail with enable_thinking true and false, where the template
    has that switch and both prompts go on from the plain one; else ()), and "</think>" where
    the template sends an earlier reply back from after it, exactly as `ChatTemplate.visible`
    does (Qwen 3), else ""."""
    thinking: tuple[str, ...] = ()
    if "enable_thinking" in source:
        base = r_u1 + prefix
        tails = [render(_msgs(("user", U1)), True, enable_thinking=on) for on in (True, False)]
        if all(t.startswith(base) for t in tails) and tails[0] != tails[1]:
            thinking = tuple(t[len(base):] for t in tails)
    end = "</think>"
    if end in source:
        said = "qqTHOUGHTqq" + end + "\n\n" + A1
        want = r_u1 + prefix + A1 + suffix + user.format(content=U2)
        if render(_msgs(("user", U1), ("assistant", said), ("user", U2)), False) == want:
            return thinking, end
    return thinking, ""


def _check(t: JinjaChatTemplate, render, lead: str, bos_text: str, with_system: bool) -> None:
    """Whole conversations must render through `t` exactly as Jinja renders them."""
    turns = [("user", U1), ("assistant", A1), ("user", U2), ("assistant", A2), ("user", U3)]
    for system in (S, None) if with_system else (None,):
        msgs = ([("system", system)] if system else []) + turns
        want = render(_msgs(*msgs), True)
        want = want[len(bos_text):] if bos_text and want.startswith(bos_text) else want
        got = ""
        sys_text = system or t.default_system
        if sys_text and not t.system_in_first_user:
            got += t.render_system(sys_text)
        for i, (role, content) in enumerate(turns):
            if role == "user":
                got += t.render_user(content, system if i == 0 else None)
                got += t.assistant_prefix if i == len(turns) - 1 else ""
            else:
                got += t.assistant_prefix + lead + content + t.assistant_suffix
        if got != want:
            raise ValueError(f"the chat template does not split per message: {want!r} vs {got!r}")


def jinja_source(t: ChatTemplate) -> str:
    """A Jinja chat template that renders whole conversations as `t` renders each message."""
    q = lambda s: json.dumps(s, ensure_ascii=False)  # noqa: E731  (a Jinja string literal: JSON's escapes)
    (sys_pre, sys_post), (user_pre, user_post) = _around(t.system), _around(t.user)
    default = getattr(t, "default_system", None)
    system_text = f"{q(sys_pre)} + system + {q(sys_post)}"  # the system message as the template renders it
    lines = [
        "{%- if messages and messages[0]['role'] == 'system' -%}",
        "{%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}",
        f"{{%- else -%}}{{%- set system = {q(default or '')} -%}}{{%- set turns = messages -%}}",
        "{%- endif -%}",
        "{{- bos_token -}}" if t.bos else "",
        "" if t.system_in_first_user else f"{{%- if system -%}}{{{{- {system_text} -}}}}{{%- endif -%}}",
        "{%- for message in turns -%}",
        "{%- set content = message['content'] -%}",
        "{%- if message['role'] == 'user' -%}",
        (f"{{%- if loop.first and system -%}}{{%- set content = {system_text} + content -%}}{{%- endif -%}}"
         if t.system_in_first_user else ""),
        f"{{{{- {q(user_pre)} + content + {q(user_post)} -}}}}",
        "{%- elif message['role'] == 'assistant' -%}",
        (f"{{%- if {q(t.reasoning_end)} in content -%}}"
         f"{{%- set content = content.split({q(t.reasoning_end)})[-1].lstrip('\\n') -%}}{{%- endif -%}}")
        if t.reasoning_end else "",
        f"{{{{- {q(t.assistant_prefix)} + content + {q(t.assistant_suffix)} -}}}}",
        "{%- else -%}{{- raise_exception('only user and assistant messages follow the first system one') -}}",
        "{%- endif -%}",
        "{%- endfor -%}",
        f"{{%- if add_generation_prompt -%}}{{{{- {q(t.assistant_prefix)} -}}}}",
    ]
    if t.thinking:
        on, off = t.thinking
        think = f"(enable_thinking if enable_thinking is defined else {str(bool(t.thinking_default)).lower()})"
        lines.append(f"{{%- if {think} -%}}{{{{- {q(on)} -}}}}{{%- else -%}}{{{{- {q(off)} -}}}}{{%- endif -%}}")
    lines.append("{%- endif -%}")
    return "\n".join(line for line in lines if line) + "\n"


def pick_template(source: str | None, tokenizer, add_bos: bool, template: str | None,
                  name: str) -> ChatTemplate:
    """`template` by name; else the model's own Jinja template when it splits per message;
    else a built-in guessed from the template source or `name` (the model's name and family);
    else chatml."""
    if template:
        return get_template(template)
    bos = tokenizer.id_to_piece(tokenizer.bos_id) if tokenizer.bos_id is not None else None
    eos = tokenizer.id_to_piece(tokenizer.eos_id) if tokenizer.eos_id is not None else None
    if source:
        try:
            return derive_template(source, bos, eos, add_bos, lambda p: tokenizer.piece_to_id(p) is not None)
        except ValueError as e:
            guess = guess_builtin(source) or "chatml"
            warnings.warn(f"{name}: using the built-in {guess!r} chat template: {e}", stacklevel=2)
            return get_template(guess)
    return get_template(guess_builtin(name) or "chatml")
