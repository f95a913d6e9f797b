"""Conversation: what was said, and the token ids the model sees of it. No torch here.

It owns the messages, the system prompt, the chat template's rendering and encoding of them,
and `context`: the ids the model sees (the head, then messages[first_message:], each message
contributing its own ids). A cache holds a prefix of `context`: any object with `n` (positions
held) and `truncate(n)` (a GraphDecoder). Whenever the context changes other than by growing
at its end, the cache is rewound to the longest prefix it still shares with the new one, and
keeps at least one id out (a reply needs one to prefill).

Contract:
- Turns: `add_user(text, max_tokens)` appends a user turn, `replace_last_turn(text,
  max_tokens)` puts a new user turn in place of the last one and its reply (edit),
  `take_back_reply()` removes the last reply (regenerate), `reopen_reply()` opens the last
  reply again without its closing suffix (continue), `add_reply(ids, text, stopped)` appends
  the model's reply. Each of the first four returns an `undo` that puts the conversation back
  as it was; `or_restore(events, undo)` calls it where the reply's events fail before the
  first one.
- An edit is as if its text had been sent instead: the context goes back to what it was
  before the old turn was added (the turns that turn's fitting dropped return), and the new
  turn is fitted from there, so the model sees what a fresh chat that sent the edited
  message would show it. The cache goes back to the positions it held then (those it still
  holds), so the new turn is prefilled from where the fresh chat prefills it: the same greedy
  reply, near-ties included.
- Fitting: when a new turn plus a reply reserve (min(max_tokens, max_len // 4)) would not fit
  in max_len, the oldest whole turns leave the context (the system prompt stays; a turn starts
  at a user message), trimming to 3/4 of max_len so the next turns fit without another
  re-prefill. `messages` keeps everything said; `first_message` is the first one the model sees.
- Thinking (a template with a switch, Qwen 3's `enable_thinking`: ChatTemplate.thinking):
  `thinking` is on, off, or None where the template has no switch. A user turn ends with the
  generation prompt as the switch stands when its reply opens (its last `prompt` ids: Qwen 3
  with thinking off, `<think>\n\n</think>\n\n`; regenerate renders it again). Once a later
  turn follows, the turn before is what the template renders for an earlier one: the user
  turn without that tail, the reply without its reasoning (`ChatTemplate.visible`: Qwen 3
  sends back only the text after `</think>`), and the cache keeps the prefix it shares with
  that. Templates without a switch or reasoning tag are never re-rendered.
- Errors are ValueErrors that say what to do, and leave the conversation unchanged: an empty
  message, one too long for the context, a system prompt that leaves no room for a message and
  its reply (`set_system` refuses it; where one came in anyway, each message's error names the
  system prompt, not the message), no message to edit, no reply to regenerate or continue, a
  full context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from tinyllm.session.chat_events import Finished, Message, Prefilled, Token

if TYPE_CHECKING:
    from tinyllm.text.chat_template import ChatTemplate
    from tinyllm.text.tokenizer import Tokenizer

Events = Iterator[Prefilled | Token | Finished]


class Cache(Protocol):
    """What the conversation asks of the cache that holds a prefix of its context."""

    @property
    def n(self) -> int: ...

    def truncate(self, n: int) -> None: ...


def stop_ids(tokenizer: Tokenizer, template: ChatTemplate) -> set[int]:
    """The ids that end a reply: EOS and the template's stop pieces the tokenizer has."""
    stops = {tokenizer.eos_id}
    for piece in template.stop:
        i = tokenizer.piece_to_id(piece)
        if i is not None:
            stops.add(i)
    return stops


def or_restore(events: Events, undo: Callable[[], None]) -> Events:
    """The events; if they fail before the first one, undo() puts the conversation back."""
    started = False
    try:
        for event in events:
            started = True
            yield event
    except BaseException:
        if not started:
            undo()
        raise


class Conversation:
    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate, max_len: int, cache: Cache,
                 system: str | None = None):
        self.tokenizer, self.template, self.max_len, self.cache = tokenizer, template, max_len, cache
        self.system = system
        self.messages: list[Message] = []
        self.context: list[int] = []
        self.first_message = 0
        self.thinking: bool | None = template.thinking_default  # None: the template has no switch
        # Before each user turn was added (by its index): first_message, and the positions the
        # cache held. An edit of that turn starts again from there (a turn not added here, a
        # resumed chat's, from first_message 0, as load did, and the prefix the cache shares).
        self._first_before: dict[int, int] = {}
        self._cache_before: dict[int, int] = {}
        self.rebuild()

    # ---- tokens -----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Encode text, mapping literal "<s>" / "</s>" to BOS / EOS (templates use them)."""
        ids: list[int] = []
        specials = {"<s>": self.tokenizer.bos_id, "</s>": self.tokenizer.eos_id}
        rest = text
        while rest:
            hits = [(rest.find(s), s) for s in specials if s in rest]
            if not hits:
                ids += self.tokenizer.encode(rest)
                break
            at, s = min(hits)
            if at:
                ids += self.tokenizer.encode(rest[:at])
            ids.append(specials[s])
            rest = rest[at + len(s):]
        return ids

    def user_ids(self, content: str, first: bool) -> list[int]:
        """A user turn's ids (with the system prompt where the template puts it in the first)."""
        system = self.system if first else None
        return self.encode(self.template.render_user(content, system) + self.template.assistant_prefix)

    def prompt_ids(self) -> list[int]:
        """The generation prompt's tail after assistant_prefix as the thinking switch stands
        ([] where the template has none, or adds nothing)."""
        if self.thinking is None:
            return []
        tail = self.template.thinking[0 if self.thinking else 1]
        return self.encode(tail) if tail else []

    def head_ids(self) -> list[int]:
        """The ids before the first message: BOS, and the system prompt where it stands alone."""
        ids = [self.tokenizer.bos_id] if self.template.bos else []
        if self.system and not self.template.system_in_first_user:
            ids += self.encode(self.template.render_system(self.system))
        return ids

    def _reply_ids(self, content: str, stopped: bool = False) -> Message:
        """A reply as the template renders it before a later turn (its reasoning left out)."""
        ids = self.encode(self.template.visible(content)) + self.encode(self.template.assistant_suffix)
        return Message("assistant", content, ids, stopped=stopped)

    # ---- the context ------------------------------------------------------------------

    def rebuild(self, first: int = 0) -> None:
        """The ids the model sees: head + messages[first:]. The cache is rewound to the
        longest prefix it already holds; the next prefill appends the rest."""
        ids = self.head_ids()
        for i, m in enumerate(self.messages[first:]):
            if m.role == "user" and i == 0 and self.template.system_in_first_user:
                ids += self.user_ids(m.content, True) + (m.ids[-m.prompt:] if m.prompt else [])
            else:
                ids += m.ids
        keep = 0
        for a, b in zip(self.context[:self.cache.n], ids, strict=False):
            if a != b:
                break
            keep += 1
        self.cache.truncate(max(0, min(keep, len(ids) - 1)))  # a reply needs >= 1 id to prefill
        self.context, self.first_message = ids, first

    def fit(self, extra: int, max_tokens: int) -> int:
        """Drop the oldest whole turns until context + extra + a reply reserve fits.
        Returns how many messages were dropped. A reply of `reserve` ids takes reserve - 1
        positions: its last id is drawn, never fed (DecodeRunner's context_full is the same
        rule), so a prompt of P ids and its reply fit where P + reserve - 1 <= max_len. (It was
        P + reserve: --max-len 64 --max-tokens 8 refused a prompt of 57 ids that fits.)"""
        reserve = min(max_tokens, self.max_len // 4)
        room = self.max_len + (1 if reserve else 0)  # what context + extra + reserve may reach
        head = len(self.head_ids())
        if head + extra + reserve > room:
            system = self.system_tokens()
            if system and head + extra + reserve - system <= room:  # the message alone fits
                raise ValueError(self._system_too_long(system, reserve))
            over = head + extra + reserve - room  # said, so a user knows how much to cut
            raise ValueError(f"message too long: {extra:,} tokens, {over:,} over what the context holds "
                             f"({self.max_len:,}, with {reserve:,} kept for the reply); shorten it or raise --max-len")
        if len(self.context) + extra + reserve <= room:
            return 0
        # Trim to 3/4 of the context, so the next turns fit without another re-prefill.
        target = max(self.max_len * 3 // 4, head + extra + reserve)
        start = first = self.first_message
        while len(self.context) + extra + reserve > target and first < len(self.messages):
            first += 1
            while first < len(self.messages) and self.messages[first].role != "user":
                first += 1  # a turn starts at a user message
            self.rebuild(first)
        return first - start

    def system_tokens(self) -> int:
        """How many ids the system prompt adds to the context (0 without one)."""
        if not self.system:
            return 0
        if self.template.system_in_first_user:
            return len(self.encode(self.template.render_user("", self.system))) - len(
                self.encode(self.template.render_user("", None)))
        return len(self.encode(self.template.render_system(self.system)))

    def _system_too_long(self, system: int, reserve: int) -> str:
        return (f"the system prompt is too long: {system} tokens, and the context holds {self.max_len} "
                f"(with {reserve} kept for the reply); shorten it (/system TEXT) or raise --max-len")

    # ---- whole conversations ----------------------------------------------------------

    def set_system(self, text: str | None, max_tokens: int) -> None:
        """A new system prompt; the context is rebuilt (the next turn re-prefills). ValueError,
        changing nothing, for one that leaves no room for a message and its reply."""
        old, self.system = self.system, text or None
        reserve = min(max_tokens, self.max_len // 4)
        system = self.system_tokens()
        if system and len(self.head_ids()) + reserve + (system if self.template.system_in_first_user else 0) \
                >= self.max_len:
            self.system = old
            raise ValueError(self._system_too_long(system, reserve))
        self.rebuild()

    def new_chat(self) -> None:
        self.messages, self._first_before, self._cache_before = [], {}, {}
        self.rebuild()

    def load_messages(self, messages: list[tuple[str, str]]) -> None:
        """Restore a conversation (resume): (role, content) pairs, re-encoded. A user turn
        followed by another (a crash before its reply began) gets an empty stopped reply, so
        turns alternate. A last user turn stays as it is: the context ends ready for its reply.
        A chat longer than the context keeps its latest whole turns, as `fit` drops them."""
        self.messages, self._first_before, self._cache_before = [], {}, {}
        for role, content in messages:
            if role == "system":
                self.system = content
            elif role == "user":
                if self.messages and self.messages[-1].role == "user":
                    self.messages.append(self._reply_ids("", stopped=True))
                self.messages.append(Message("user", content, self.user_ids(content, len(self.messages) == 0)))
            else:
                self.messages.append(self._reply_ids(content))
        if self.messages and self.messages[-1].role == "user":  # ready for its reply
            self.messages[-1] = self._prompted(self.messages[-1])
        self.rebuild()
        if len(self.head_ids()) < self.max_len < len(self.context):  # longer than this context: its latest turns
            self.fit(0, 0)  # (a system prompt too long for it is said at the next message)

    # ---- the generation prompt, and earlier turns as the template renders them ----------

    def _prompted(self, m: Message) -> Message:
        """User turn `m` ending with the generation prompt as the thinking switch stands now."""
        tail = self.prompt_ids()
        return Message("user", m.content, m.ids[:len(m.ids) - m.prompt] + tail, prompt=len(tail))

    def _settle(self) -> Callable[[], None] | None:
        """The last turn as the template renders it once another follows: the user turn
        without its generation prompt's tail, the reply without its reasoning; the context is
        rebuilt (the cache keeps the prefix it shares). Returns what puts them back (the
        caller rebuilds); None where nothing changed."""
        at = next((i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i].role == "user"), None)
        if at is None:
            return None
        old = self.messages[at:]
        new = [Message("user", m.content, m.ids[:len(m.ids) - m.prompt]) if m.role == "user" and m.prompt else
               self._reply_ids(m.content, m.stopped) if m.role == "assistant" and
               self.template.visible(m.content) != m.content else m for m in old]
        if all(a is b for a, b in zip(old, new, strict=True)):
            return None
        self.messages[at:] = new
        self.rebuild(self.first_message)

        def back() -> None:
            self.messages[at:at + len(old)] = old

        return back

    # ---- turns ------------------------------------------------------------------------

    def add_user(self, text: str, max_tokens: int) -> tuple[int, Callable[[], None]]:
        """Append a user turn, dropping the oldest turns where it would not fit. Returns (how
        many messages were dropped, undo: the turn taken back and the dropped turns returned)."""
        if not text.strip():
            raise ValueError("empty message")
        was_first = self.first_message
        settled = self._settle()
        first = self.first_message >= len(self.messages)  # no earlier turn in the context
        ids, tail = self.user_ids(text, first), self.prompt_ids()
        held = self.cache.n
        try:
            dropped = self.fit(len(ids) + len(tail), max_tokens)
        except ValueError:
            if settled is not None:
                settled()
                self.rebuild(was_first)
            raise
        self._first_before[len(self.messages)], self._cache_before[len(self.messages)] = was_first, held
        self.messages.append(Message("user", text, ids + tail, prompt=len(tail)))
        self.context = self.context + ids + tail

        def undo() -> None:
            self.messages.pop()
            if settled is not None:
                settled()
            self.rebuild(was_first)

        return dropped, undo

    def replace_last_turn(self, text: str, max_tokens: int) -> tuple[int, Callable[[], None]]:
        """Put a user turn `text` in place of the last user turn and its reply (an edit), as if
        it had been sent instead: the context is rebuilt from where it stood before the old turn
        was added, and the new turn is fitted from there. Returns (how many messages were
        dropped, undo: the old turn and its reply back as they were)."""
        at = next((i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i].role == "user"), None)
        if at is None:
            raise ValueError("there is no message to edit")
        if not text.strip():
            raise ValueError("empty message")
        old, was_first = self.messages[at:], self.first_message
        befores = dict(self._first_before), dict(self._cache_before)

        def undo() -> None:
            self.messages, (self._first_before, self._cache_before) = self.messages[:at] + old, befores
            self.rebuild(was_first)

        self.messages = self.messages[:at]
        self.rebuild(min(self._first_before.get(at, 0), at))
        # The cache back to where it stood, so the new turn's prefill is the one a fresh chat
        # runs, id for id: prefilled from another position, a near-tie may fall the other way.
        self.cache.truncate(min(self.cache.n, self._cache_before.get(at, self.cache.n)))
        try:
            dropped, _ = self.add_user(text, max_tokens)
        except ValueError:  # too long, say: the conversation as it was
            undo()
            raise
        return dropped, undo

    def take_back_reply(self) -> Callable[[], None] | None:
        """Remove the last reply, to generate it again; returns undo. None where the last turn
        is a user's with no reply yet (a resumed chat): the context is ready for its reply."""
        if not self.messages:
            raise ValueError("there is no reply to regenerate")
        if self.messages[-1].role == "user":
            self.messages[-1] = self._prompted(self.messages[-1])  # the thinking switch as it stands now
            self.rebuild(self.first_message)
            return None
        old = self.messages.pop()
        asked = self.messages[-1]
        self.messages[-1] = self._prompted(asked)
        self.rebuild(self.first_message)

        def undo() -> None:
            self.messages[-1] = asked
            self.messages.append(old)
            self.rebuild(self.first_message)

        return undo

    def reopen_reply(self) -> tuple[Message, list[int], Callable[[], None]]:
        """Open the last reply again: the context ends with its ids less the closing suffix, so
        the model goes on from where it ended. Returns (the reply, the ids kept, undo)."""
        if not self.messages or self.messages[-1].role != "assistant":
            raise ValueError("there is no reply to continue")
        old = self.messages[-1]
        suffix = self.encode(self.template.assistant_suffix)
        body = old.ids[:len(old.ids) - len(suffix)] if suffix and old.ids[-len(suffix):] == suffix else old.ids
        if len(self.context) - len(old.ids) + len(body) + 1 >= self.max_len:
            raise ValueError("the context is full: the reply cannot go on (start a new chat, or raise --max-len)")
        self.messages.pop()
        self.rebuild(self.first_message)
        self.context = self.context + body
        return old, body, self._put_back(old)

    def _put_back(self, old: Message) -> Callable[[], None]:
        def undo() -> None:
            self.messages.append(old)
            self.rebuild(self.first_message)
        return undo

    def add_reply(self, ids: list[int], text: str, stopped: bool) -> None:
        """Append the model's reply: ids (what the cache was fed of it), then the closing suffix."""
        ids = ids + self.encode(self.template.assistant_suffix)
        self.messages.append(Message("assistant", text, ids, stopped=stopped))
        self.context = self.context + ids

    def joined(self, old: Message, body: list[int], events: Events) -> Events:
        """A continued reply's events; at its end, the old and the new part become one message,
        and Finished carries the whole reply's text."""
        for event in events:
            if isinstance(event, Finished):
                new = self.messages.pop()
                text = old.content + new.content
                self.messages.append(Message("assistant", text, body + new.ids, stopped=new.stopped))
                event = Finished(event.reason, text, event.stats)
            yield event
