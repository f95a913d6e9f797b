"""Slash commands: the `/name ARGS` lines typed into the prompt, the app's CommandRunner.

Contract: `COMMANDS` is the table the help screen shows; `CommandRunner.run(text)` runs one. What a
command says back (its output, and every refusal: severity "error", never an exception) is a
note in the conversation (`ChatCore.note`: it stays, scrolls with the chat, and is neither saved
with it nor seen by the model); only what passes is a toast (`ChatCore.say`: "Exported").
`/export PATH` refuses to replace an existing file; `/export! PATH` overwrites it; either
writes only a regular file (a FIFO, a device or a folder is refused) and writes it on a
worker thread, with a toast when done (a note when it could not). `/read PATH` attaches a text
file, a folder's text files or a glob's to the next message (chat_app.attachments.gather: its
limits and refusals), as chips over the input (`prompt.attach`); it says nothing where one file
was attached (the chip is the answer), a note where a folder or a glob skipped some or attached
several, and a refusal in one line, nothing attached. This module imports
neither Textual nor torch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from chat_app.attachments import MAX_BYTES, MAX_FILES, gather
from chat_app.history import write_regular
from chat_app.jobs import SetSystem
from chat_app.worker import THINKING

if TYPE_CHECKING:
    from chat_app.chats import ChatSwitcher
    from chat_app.core import ChatCore
    from chat_app.model_switch import ModelSwitcher
    from chat_app.replies import Replies
    from chat_app.versions import VersionSwitcher

COMMANDS = {  # name: (arguments, what it does)
    "set": ("NAME VALUE", "sampling: temperature, top_p, top_k, repeat_penalty, dry_multiplier, dry_base, "
            "dry_allowed_length, dry_last_n, repeat_stop (off or N), max_tokens, seed, regen_temperature"),
    "system": ("TEXT", "set the system prompt (no TEXT: none); used from the next turn"),
    "export": ("PATH", "write the conversation to PATH as Markdown (/export! PATH overwrites)"),
    "read": ("PATH", "attach a text file to your next message (a folder or a glob: its text files, at most "
             f"{MAX_FILES}, {MAX_BYTES // 1024 ** 2} MiB in all); @PATH in a message does the same"),
    "continue": ("", "continue the last reply where it ended (like Ctrl+F)"),
    "edits": ("", "the other versions of the messages shown (edits and Ctrl+R keep the one they replace)"),
    "stats": ("", "speed and context of the last reply"),
    "show": ("", "the model, system prompt and settings in force (saved with the chat)"),
    "theme": ("NAME", "switch the colour theme and keep it (no NAME: list them)"),
    "clear": ("", "clear the screen and start a new chat (like Ctrl+N)"),
    "chats": ("", "saved chats: open, rename, delete (like Ctrl+O)"),
    "model": ("PATH", "open another model in a new chat (the old chat stays saved): a path, hf:OWNER/REPO, or a "
              "server (http(s)://HOST:PORT/v1[#MODEL], a [servers] NAME); no PATH: it and every model known here"),
    "help": ("", "this help (like F1)"),
}


class CommandRunner:
    def __init__(self, core: ChatCore, models: ModelSwitcher, chats: ChatSwitcher, versions: VersionSwitcher,
                 replies: Replies) -> None:
        self.core, self.models, self.chats, self.versions, self.replies = core, models, chats, versions, replies

    async def run(self, text: str) -> None:
        name, _, arg = text[1:].partition(" ")
        overwrite = name == "export!"
        name = "export" if overwrite else name
        if name not in COMMANDS:
            self.core.note(f"Unknown command /{name}; /help lists them.", "error")
            return
        if name == "export":
            await self.command_export(arg.strip(), overwrite)
            return
        await getattr(self, f"command_{name}")(arg.strip())

    async def command_set(self, arg: str) -> None:
        name, _, value = arg.partition(" ")
        name = name.replace("-", "_")
        if name == THINKING:
            self.switch_thinking(value.strip(), self.core.note)
            return
        if self.core.session is None or not value.strip():
            self.core.note("usage: /set NAME VALUE (after the model has loaded)", "error")
            return
        try:
            self.core.session.set_param(name, value.strip())
        except ValueError as e:
            self.core.note(str(e), "error")
            return
        self.core.save(self.core.store.set_setting, name, value.strip())  # kept with the chat
        sent = getattr(self.core.session, "sent_params", None)  # a server: only these go with a request
        if sent is not None and name not in sent:
            self.core.note(f"{name} = {getattr(self.core.session.params, name)}, kept with the chat but not sent: "
                          f"the server uses its own (it gets {', '.join(sent)})")
            return
        self.core.note(f"{name} = {getattr(self.core.session.params, name)} (from the next reply)")

    def switch_thinking(self, value: str | None, tell: Callable[[str, str], None]) -> None:
        """/set thinking on|off, and the key (value None: the other way): the chat template's
        own switch (enable_thinking) from the next reply, kept with the chat like /set's values."""
        s = self.core.session
        if s is None:
            tell("The model is still loading.", "warning")
            return
        if s.thinking is None:
            tell(f"/set thinking does not apply: {s.name}'s chat template has no thinking switch (enable_thinking).",
                 "error")
            return
        if value not in (None, "on", "off"):
            tell("usage: /set thinking on|off", "error")
            return
        on = not s.thinking if value is None else value == "on"
        try:
            s.set_thinking(on)
        except ValueError as e:
            tell(str(e), "error")
            return
        self.core.save(self.core.store.set_setting, THINKING, "on" if on else "off")  # kept with the chat
        self.core.view.status.show(thinking=on)
        tell(f"thinking {'on' if on else 'off'} (from the next reply)", "information")

    async def command_edits(self, arg: str) -> None:
        self.versions.show_versions()

    async def command_system(self, arg: str) -> None:
        self.core.queue(SetSystem(arg))
        if self.core.busy:
            self.core.note("The system prompt changes after this reply.")

    async def command_export(self, arg: str, overwrite: bool = False) -> None:
        if not arg:
            self.core.note("usage: /export PATH (/export! PATH overwrites)", "error")
            return
        self.replies.save_partial()  # the reply streaming now goes in as far as it got
        text, n = self.core.store.as_markdown()  # taken now, on the UI thread; written by a worker
        self.core.view.in_thread(lambda: self.export_file(arg, text, n, overwrite), name=f"export {arg}")

    def export_file(self, path: str, text: str, n: int, overwrite: bool) -> None:
        """The write of /export, on a worker thread (a slow disk never stops the UI); its
        notice comes back to the UI thread."""
        shown = shortened(path)  # a 300-character name made a 16-line notice
        try:
            write_regular(path, text, overwrite)
            message, severity = f"Exported {n} messages to {shown}.", "information"
        except FileExistsError:
            message, severity = f"{shown} exists; /export! {shown} overwrites it.", "error"
        except ValueError as e:
            message, severity = f"could not export: {str(e).replace(str(Path(path).expanduser()), shown)}", "error"
        except OSError as e:  # its strerror: str(e) names the path again
            message, severity = f"could not export to {shown}: {e.strerror or e}", "error"
        self.core.view.from_thread(self.core.say if severity == "information" else self.core.note, message, severity)

    async def command_read(self, arg: str) -> None:
        if not arg:
            self.core.note("usage: /read PATH (a file, a folder or a glob: attached to your next message)", "error")
            return
        try:
            attached, skipped = gather(arg)
            self.core.view.prompt.attach(attached)
        except ValueError as e:
            self.core.note(f"/read: {e}", "error")
            return
        if len(attached) > 1 or skipped:
            tokens = sum(a.tokens for a in attached)
            self.core.note(f"Attached {plural(len(attached), 'file')} (~{tokens:,} tokens) to your next message" +
                           (f"; skipped {len(skipped)} not text or not readable: {', '.join(skipped)}"
                            if skipped else "") + ".")

    async def command_stats(self, arg: str) -> None:
        stats, prefill = self.core.last_stats, self.core.prefill_tokens
        if self.core.session is None or stats is None:
            self.core.note("No reply yet.")
            return
        graphs = {True: "on", False: "off", None: "n/a on CPU"}[stats.graphs]
        self.core.note(f"Last reply: {plural(stats.tokens, 'token')} at {stats.tok_per_s:.1f} tok/s; "
                      f"first token after {stats.ttft_ms:.0f} ms (prefill of {plural(prefill, 'token')}).\n"
                      f"Context: {stats.position:,} of {stats.max_len:,} positions used; attention bucket W {stats.window}; "
                      f"CUDA graphs {graphs}; decode step {stats.step}.")

    async def command_show(self, arg: str) -> None:
        s = self.core.session
        if s is None:
            self.core.note("The model is still loading.")
            return
        p = s.params
        seed = "random" if p.seed is None else p.seed
        chat = self.core.store.settings
        think = "" if getattr(s, "thinking", None) is None else f"; thinking {'on' if s.thinking else 'off'}"
        family = f", family {s.family}" if getattr(s, "family", "") else ""
        weights = getattr(s, "weights", "") or s.dtype
        note = getattr(s, "context_note", "")
        context = f"context {s.max_len:,} positions" + (f" ({note})" if note else " (the model's own)")
        model = f"Model: {s.name} on {s.device}, weights {weights}{family}, {context}{think}."
        if s.capabilities.served:
            model = f"Model: {s.name}, served by {s.path.partition('#')[0]} (its weights and context are the server's)."
        self.core.note(f"{model}\n"
                      f"System prompt: {s.system or '(none)'}\n"
                      f"Sampling: temperature {p.temperature}, top_p {p.top_p}, top_k {p.top_k}, "
                      f"repeat_penalty {p.repeat_penalty}, max_tokens {p.max_tokens:,}, seed {seed}; Ctrl+R when greedy: "
                      f"regen_temperature {p.regen_temperature}.\n"
                      f"Set in this chat: {', '.join(f'{k} {v}' for k, v in chat.items()) or 'nothing'}. "
                      f"Theme: {self.core.view.theme_name}.")

    async def command_theme(self, arg: str) -> None:
        from chat_app import config

        view = self.core.view
        if arg not in view.themes:
            names = ", ".join(sorted(view.themes))
            self.core.note(f"Themes: {names}." if not arg else f"Unknown theme {arg!r}; one of {names}.",
                     "information" if not arg else "error")
            return
        view.use_theme(arg)
        try:
            where = config.save("theme", arg)
        except (OSError, ValueError) as e:
            self.core.note(f"Theme {arg} for now; could not keep it in the config file: {e}", "warning")
            return
        self.core.note(f"Theme {arg} (kept in {where}).")

    async def command_clear(self, arg: str) -> None:
        self.core.new_chat()

    async def command_continue(self, arg: str) -> None:
        self.replies.continue_reply()

    async def command_chats(self, arg: str) -> None:
        self.chats.show_list()

    async def command_model(self, arg: str) -> None:
        await self.models.command_model(arg)

    async def command_help(self, arg: str) -> None:
        self.core.view.show_help()



def shortened(path: str, width: int = 40) -> str:
    """A path as a one-line notice names it: at most `width` characters, its middle elided."""
    return path if len(path) <= width else path[:width // 3] + "…" + path[-(width - width // 3 - 1):]


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"
