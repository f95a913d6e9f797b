"""tinyllm-chat: parse the command line, check what can be checked quickly, then run ChatApp.

Contract: `--help` and argument errors import neither torch nor textual, and this process
never imports torch: the TUI draws its first frame while the session's child process imports
it (a fraction of a second after the start, against seconds with torch; measured by
scripts/startup_time.py). Every bad input (a missing or broken checkpoint, an unknown device
or template, an out-of-range sampling value, an unusable data folder) prints ONE line,
`tinyllm-chat: error: ...`, on stderr and exits with code 2; never a traceback. Most are
found before the TUI opens (the options; the model's path, config, weight files and their
headers: tinyllm.formats.model_files.precheck); what needs torch (shapes against the config, the
tokenizer, the chat template, --device cuda without a GPU) is found by the child while the
TUI shows the load's progress, and ends the app the same way (ChatApp.bad_input). Without
--model the default model, models/tinychat, is opened (a wheel installs it as the package
tinyllm_models), or config.toml's model. `--resume` reopens the last chat with
the model it was written with (chat_app.chat_model), unless --model is on the command line:
decided here, before the session's child process starts; a chat whose model is gone goes on
with the model it would have had without --resume, said in one notice.
Anything else that goes wrong after that is fatal: one line on stderr naming the log, exit
code 1, and the traceback appended to `tinyllm-chat.log` in the data folder.
The session's child process writes its own stdout/stderr to `session.log` beside it.
SIGTERM and SIGHUP quit the app as Ctrl+Q does (the terminal restored, the reply so far
saved), and exit with code 128 + the signal's number (143, 129), saying nothing.
A chat that chat.db could not take by the time the app ends is one line on stderr naming the
unsaved-*.md file it was written to instead (or saying that it could not be).
Without a terminal (stdin, stdout or stderr redirected) the app is refused the same way, once
the options have been checked; `--help` works anywhere. `--threads` is 1 to the cores this
process may use.
Without the app: `-p PROMPT`, or text on stdin when stdin is not a terminal (read to its end;
`</dev/null` is nothing, and with nothing and no -p the app runs, or is refused as above), sends
one message and prints its reply (chat_app.oneshot, which does import torch, in this process:
the model loads here). `oneshot_message` builds the message: -p's text, after stdin's text and
the -f files (each a file, a folder or a glob, as /read takes them) as fenced blocks
(chat_app.attachments, 1 MiB in all); a file or stdin it cannot send, and -f,
--json, --no-save or --chat with no message, are one line and exit 2. That run ends with
os._exit once its output is flushed and chat.db closed (finalizing torch took 0.8 s more), so
it is run in a subprocess, never in a test's own process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from chat_app.crash_log import LOG_NAME  # noqa: F401 (the tests')
from chat_app.settled import Settled
from chat_app.shipped_models import DEFAULT_MODEL, find_default_model  # noqa: F401 (find_default_model: the tests')
from tinyllm.decode.sampling_params import DRY_MULTIPLIER as APP_DRY_MULTIPLIER
from tinyllm.decode.sampling_params import DRY_WINDOW, REPEAT_STOP, SamplingParams, parse_repeat_stop

if TYPE_CHECKING:
    from chat_app.app import ChatApp
    from chat_app.store import Store

PROG = "tinyllm-chat"
# --compile's choices as ChatSession's `compile` (tinyllm.session.chat): "on" is the native CPU step where
# it runs the model, the plain step's graphs on CUDA (Triton's kernels), else Inductor's compile in the background.
COMPILE = {"on": "auto", "off": None, "inductor": "inductor"}
DEFAULT_MAX_TOKENS = 1024  # a reply's limit unless set: long answers end, /continue goes on
QUANT_CHOICES = ("auto", "none", "int8", "int4")  # "keep" is what auto is on a CPU: not offered
SAMPLING = ("temperature", "top_p", "top_k", "repeat_penalty", "dry_multiplier", "dry_base",  # /set's names,
            "dry_allowed_length", "dry_last_n", "repeat_stop", "max_tokens", "seed")  # the options' dests




class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, no usage block: argparse's own errors look like ours."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _Version(argparse.Action):
    """--version, its number read only when asked (importlib.metadata took 0.1 s of every start)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog} {installed_version()}")
        parser.exit()


def build_parser(defaults: dict[str, object] | None = None) -> argparse.ArgumentParser:
    """The options; `defaults` (the config file's) replace the built-in defaults."""
    from tinyllm.formats.quant_rule import DEFAULT, quant_help  # imports no torch

    p = _Parser(prog=PROG, description="Chat with a small local language model in the terminal.")
    p.add_argument("--version", action=_Version, help="show the version and exit")
    p.add_argument("--model", default=None,
                   help="tinyllm checkpoint folder, Hugging Face folder (Llama, Mistral, Qwen 2/3, Gemma 2/3, "
                        "Phi-3) or .gguf file, "
                        "or hf:OWNER/REPO[:FILE] to download one from the Hugging Face Hub, "
                        "or an OpenAI-compatible server: http(s)://HOST:PORT/v1[#MODEL] or a [servers] NAME from "
                        "config.toml (its key: TINYLLM_CHAT_API_KEY or the table's api_key; docs/USING.md) "
                        f"(default: {DEFAULT_MODEL})")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: auto")
    p.add_argument("--max-len", type=int, default=None,
                   help="context length, at most the model's (default: the model's own, up to context_budget of "
                        "free memory, 0.5 unless config.toml says otherwise)")
    p.add_argument("--no-graphs", action="store_true", help="decode eagerly, without CUDA graphs")
    p.add_argument("--compile", choices=["on", "off", "inductor"], default="on",
                   help="the fast decode step: on a CPU the whole step as one C++ call (tinyllm.decode.cpu_step), "
                        "on a GPU CUDA graphs of the plain step's Triton kernels, both ready at once; for a model "
                        "neither runs, the step compiled in the background (torch.compile, Inductor), switched to "
                        "between replies and cached in the user cache folder (default: on); inductor: that "
                        "compiled step on a CPU and a GPU too")
    p.add_argument("--ignore-eos", action="store_true",
                   help="keep generating past the end-of-reply token, up to --max-tokens (for benchmarks)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: one per core, less one for the UI, at most 8)")
    p.add_argument("--quant", default=DEFAULT, choices=QUANT_CHOICES, help=quant_help(QUANT_CHOICES))
    g = p.add_argument_group("sampling (change them later with /set)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0, help="1 = off (default)")
    g.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    g.add_argument("--repeat-penalty", type=float, default=1.1,
                   help="> 1 discourages repeating the last 64 tokens; 1 = off (default: 1.1)")
    g.add_argument("--dry-multiplier", type=float, default=APP_DRY_MULTIPLIER,
                   help=f"DRY: penalize an id that would extend a repeat by multiplier * base^(length - "
                        f"allowed); 0 = off (default: {APP_DRY_MULTIPLIER})")
    g.add_argument("--dry-base", type=float, default=1.75, help="DRY's growth per repeated token (default: 1.75)")
    g.add_argument("--dry-allowed-length", type=int, default=2, help="DRY: repeats this long are free (default: 2)")
    g.add_argument("--dry-last-n", type=int, default=DRY_WINDOW,
                   help=f"DRY looks back over this many latest tokens (default: {DRY_WINDOW})")
    g.add_argument("--repeat-stop", type=parse_repeat_stop, default=REPEAT_STOP,
                   help=f"end a reply whose tail says one span this many times in a row (\"■ repeating\"; "
                        f"Ctrl+F goes on); off or 0 = never (default: {REPEAT_STOP})")
    g.add_argument("--max-tokens", type=int, default=None,
                   help=f"reply length limit (default: {DEFAULT_MAX_TOKENS}, or the context if less; "
                        "/continue goes on)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--template", default=None, help="chat template: chatml, llama2, zephyr "
                                                    "(default: the checkpoint's)")
    p.add_argument("--resume", action="store_true", help="reopen the last conversation")
    o = p.add_argument_group(
        "without the app (scripts and pipes; docs/USING.md)",
        "-p, or text on stdin when it is not a terminal, sends one message and prints the reply on stdout as "
        "it streams, with no window. Text on stdin is the message, or goes before -p's text as a file would. "
        "A message longer than the context is refused: one line on stderr, exit 2 (a resumed chat's oldest "
        "turns are dropped to make room, said on stderr). Exit codes: 0 the reply ended, 1 it failed (the "
        "model or server; what came is kept), 2 bad input (options, model, files, a message or reply past "
        "the context), 130 Ctrl+C (what came is kept), 129/143 SIGHUP/SIGTERM, 141 stdout closed.")
    o.add_argument("-p", "--prompt", default=None, metavar="PROMPT", help="send PROMPT, print the reply, exit")
    o.add_argument("-f", "--file", dest="files", action="append", default=[], metavar="PATH",
                   help="attach a text file to the message, or a folder's or a glob's (at most 50; repeatable): "
                        "each sent as a fenced block under its name; a binary, special or unreadable file is "
                        "refused (skipped in a folder, said on stderr), and so is more than 1 MiB in all")
    o.add_argument("--json", action="store_true",
                   help="print the reply's events as JSON lines (tokens, counts, tok/s, time to first token)")
    o.add_argument("--no-save", action="store_true", help="keep the message and reply out of the chat history")
    o.add_argument("--chat", type=int, default=None, metavar="ID",
                   help="continue saved chat ID (--json's last line names a reply's chat)")
    p.add_argument("--theme", default=None, help="a Textual theme, e.g. nord, gruvbox, textual-light "
                                                 "(/theme lists them; default: textual-dark)")
    p.epilog = ("Defaults for these options can be set in config.toml in the user config folder "
                "(see docs/USING.md); the command line wins.")
    p.set_defaults(servers={})
    if defaults:  # config.toml's model is a default --resume may replace: kept apart from --model
        defaults = dict(defaults)
        p.set_defaults(config_model=defaults.pop("model", None), **defaults)
    return p


def installed_version() -> str:
    """This package's version, as installed (an uninstalled source tree: "(not installed)")."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tinyllm-chat")
    except PackageNotFoundError:
        return "(not installed)"


def resolve_model(spec: str | Path) -> str | Path:
    """A --model value as a local path: `hf:OWNER/REPO[:FILE]` is downloaded first (tinyllm.formats.hub,
    the Hub's cache and progress bars, on stderr before the window opens)."""
    from tinyllm.formats import hub  # imports no torch

    if not hub.is_hub(spec):
        return spec
    print(f"{PROG}: getting {spec} from the Hugging Face Hub", file=sys.stderr)
    return str(hub.fetch(str(spec)))


def build_app(args: argparse.Namespace) -> ChatApp:
    """Check everything the command line says; FileNotFoundError/ValueError when it's wrong."""
    from functools import partial

    from chat_app.server_session import open_session

    s = settle(args)
    if args.theme:
        from textual.theme import BUILTIN_THEMES

        if args.theme not in BUILTIN_THEMES:
            raise ValueError(f"unknown theme {args.theme!r}; one of {', '.join(sorted(BUILTIN_THEMES))}")

    from chat_app.app import ChatApp

    # A local model's session runs in a child process: its decoding never waits for the UI's GIL.
    # A server's runs here (chat_app.server_session): no torch, no child process.
    opener = partial(open_session, s.local, args.servers, s.server.endpoint if s.server else None)
    assert s.store is not None
    return ChatApp(opener, s.store, model_name=s.name, resume=s.resumed, theme=args.theme, fallback=s.fallback,
                   servers=args.servers)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The launch's sampling settings, from the command line (DEFAULT_MAX_TOKENS where it gives none)."""
    max_tokens = DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          repeat_penalty=args.repeat_penalty, max_tokens=max_tokens,
                          seed=args.seed, dry_multiplier=args.dry_multiplier, dry_base=args.dry_base,
                          dry_allowed_length=args.dry_allowed_length, dry_last_n=args.dry_last_n,
                          repeat_stop=args.repeat_stop)


def settle(args: argparse.Namespace, keep_server: bool = False, store: bool = True) -> Settled:
    """The checks every start makes; FileNotFoundError/ValueError when something is wrong.
    `store=False` opens no chat history unless --resume or --chat needs one to read."""
    if args.model is None and getattr(args, "config_model", None) is None and not DEFAULT_MODEL.exists():
        raise FileNotFoundError(f"the default model {DEFAULT_MODEL} is not there yet; "
                                "pass --model PATH (a checkpoint folder, Hugging Face folder or .gguf file)")
    if args.threads is not None and not 1 <= args.threads <= cores():
        raise ValueError(f"--threads must be from 1 to {cores()} (the cores this process may use), got {args.threads}")
    use_compile_cache()
    from chat_app.store import Resumed, Store, StoreError
    from tinyllm.formats import hub
    from tinyllm.formats.model_files import precheck
    from tinyllm.text.chat_template import get_template  # none of these imports torch

    chat = getattr(args, "chat", None)
    history = Store.open(system=args.system) if store or args.resume or chat is not None else None
    resumed = history.resume() if history and args.resume else None
    if history is not None and chat is not None:
        try:
            resumed = Resumed(history.open_chat(chat))
        except StoreError as e:
            resumed = Resumed([], error=f"could not open chat {chat}: {e}")
    spec = args.model or getattr(args, "config_model", None)
    servers = args.servers
    if history and resumed and resumed.saved and not args.model:  # the chat's own model, where it still is
        spec, resumed.notice = chat_model(history, spec, servers)
    server = None
    if is_server(spec, servers):  # checked here, before the window opens: reachable, its model listed
        from chat_app import api_keys
        from chat_app.server_api import endpoint
        from chat_app.server_session import ServerSession

        env_key = api_keys.from_environment() if args.model else None  # the --model server's only (api_keys)
        server = ServerSession(endpoint(str(spec), servers, env_key), None)  # type: ignore[arg-type]
        name, path = server.name, server.path
        model_path, model_spec = None, server.endpoint.spec
        if not keep_server:
            server.close()
    else:
        path = resolve_model(spec) if spec else DEFAULT_MODEL
        name = precheck(path)  # the rest of open_session's checks run in the child
        model_path = str(Path(path).expanduser().resolve())
        model_spec = str(spec) if spec and hub.is_hub(spec) else None
    if history is not None:
        history.model, history.model_path, history.model_spec = name, model_path, model_spec
    if args.max_len is not None and args.max_len < 16:
        raise ValueError(f"--max-len must be at least 16, got {args.max_len}")
    params = sampling_params(args)
    if server is not None:
        server.params, server.system = params, args.system or None
    if args.template:
        get_template(args.template)
    local = dict(
        path=str(path), device=args.device, max_len=args.max_len, params=params, system=args.system,
        use_graph=False if args.no_graphs else None, template=args.template,
        compile=COMPILE[args.compile], threads=args.threads, ignore_eos=args.ignore_eos,
        quant=args.quant, cap_max_tokens=args.max_tokens is None,
        context_budget=getattr(args, "context_budget", None),
        log=str((history.folder if history else default_folder()) / "session.log"))
    fallback = args.model or getattr(args, "config_model", None)
    if spec == fallback or fallback and (hub.is_hub(fallback) or is_server(fallback, servers)):
        fallback = None
    else:  # the chat's own model: if the child refuses it, the one it would have had
        fallback = str(fallback or DEFAULT_MODEL)
    return Settled(history, resumed, name, path, server, local, fallback)


def is_server(spec: str | Path | None, servers: dict) -> bool:
    """chat_app.server_api.is_server, which imports httpx (0.2 s) only for a spec that may be one:
    a URL or hf: spec has a colon; a [servers] name is one of `servers`."""
    if not spec or ":" not in str(spec) and str(spec).partition("#")[0] not in servers:
        return False
    from chat_app.server_api import is_server as server

    return server(str(spec), servers)


def default_folder() -> Path:
    from chat_app.store import default_data_dir

    return default_data_dir()


def chat_model(store: Store, fallback: str | Path | None,
               servers: dict | None = None) -> tuple[str | Path | None, str | None]:
    """The model a resumed chat reopens with (its path, its hf: spec, fetched now, or its
    server), or `fallback` and the notice that says why not."""
    from chat_app.chat_model import gone, locate
    from tinyllm.formats import hub
    from tinyllm.formats.model_files import precheck

    where, why = locate(store.chat_model_path, store.chat_model_spec)
    if where is not None and is_server(where, servers or {}):
        return where, None  # reconnected before the window opens (build_app): a server that is down is one line
    if where is not None and hub.is_hub(where):
        try:
            return resolve_model(where), None
        except ValueError as e:
            where, why = None, str(e)
    if where is not None:
        return where, None
    current = str(fallback) if is_server(fallback, servers or {}) else \
        precheck(resolve_model(fallback) if fallback else DEFAULT_MODEL)
    if store.chat_model_path is None and store.chat_model == current:
        return fallback, None  # a chat saved before paths were kept, with this very model
    return fallback, gone(store.chat_model, why, current)


def cores() -> int:
    """The CPU cores this process may use: the most --threads that makes sense (100,000 threads
    made the model process exhaust the machine's process limit and crash)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def need_terminal() -> None:
    """The app reads keys from stdin and draws on the terminal (Textual writes to stderr):
    without one it never ended and wrote escape codes into a file. ValueError naming what is not."""
    import os

    missing = [name for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")) if not os.isatty(fd)]
    if missing:
        names = " and ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
        raise ValueError(f"{names} {'is' if len(missing) == 1 else 'are'} not a terminal: "
                         "tinyllm-chat is a full-screen app; run it in a terminal, without redirections")


def oneshot_message(args: argparse.Namespace) -> str | None:
    """The message to send without the app: -p's text, with what came on stdin (when it is not a
    terminal) and the -f files before it; None where the app is to run (no -p, nothing on stdin).
    ValueError for a file or stdin that cannot be sent, or an option that needs a message."""
    import os

    from chat_app.attachments import Attachment, check_total, compose, gather, merged, read_stream

    piped = None
    if not os.isatty(0):  # read to its end: `</dev/null` sends nothing
        try:
            piped = read_stream(sys.stdin.buffer, "stdin") if sys.stdin is not None else None
        except OSError:  # stdin closed
            piped = None
        piped = piped if piped and piped.strip() else None
    if args.prompt is None and piped is None:
        given = [name for name, on in (("-f", args.files), ("--json", args.json), ("--no-save", args.no_save),
                                       ("--chat", args.chat is not None)) if on]
        if given:
            raise ValueError(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with a message: "
                             "-p PROMPT, or text on stdin")
        return None
    if args.prompt is not None and not args.prompt.strip() and piped is None and not args.files:
        raise ValueError("-p got an empty message")
    files: list[Attachment] = []
    for pattern in args.files:  # as /read takes them: a file, a folder's or a glob's text files
        found, skipped = gather(pattern)
        files = merged(files, found)
        if skipped:
            print(f"{PROG}: note: skipped under {pattern}: {', '.join(skipped)}", file=sys.stderr)
    if args.prompt is None:  # stdin is the message
        check_total(files)
        return compose(files, piped or "")
    attached = [Attachment("stdin", piped), *files] if piped is not None else files
    check_total(attached)
    return compose(attached, args.prompt)


def given(argv: list[str]) -> set[str]:
    """The sampling options (and --system) the command line gives: they win over a resumed chat's."""
    unset = object()
    names = (*SAMPLING, "system")
    ns = argparse.Namespace(**dict.fromkeys(names, unset))
    build_parser().parse_args(argv, ns)  # argparse sets a default only where the namespace has none
    return {name for name in names if getattr(ns, name) is not unset}


def fatal(error: BaseException, data_dir: Path | None = None) -> NoReturn:
    """One line on stderr, the traceback in the data folder's log, exit code 1."""
    from chat_app import crash_log

    where = crash_log.log(error, data_dir)
    message = str(error).splitlines()[0] if str(error) else ""
    print(f"{PROG}: fatal: {type(error).__name__}: {message} ({where})", file=sys.stderr)
    sys.exit(1)


def use_compile_cache() -> None:
    """Keep torch.compile's on-disk caches (Inductor's, Triton's) in the user cache folder, so a
    second launch finds the compiled step there; unless the environment already names them.
    Set before torch is imported."""
    import os

    from platformdirs import user_cache_dir

    root = Path(user_cache_dir("tinyllm-chat"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))


def main(argv: list[str] | None = None) -> None:
    import os

    from chat_app import config

    try:
        defaults = config.load()
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    args = build_parser(defaults).parse_args(argv)
    try:
        message = oneshot_message(args)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    if message is not None:  # -p, or text on stdin: the reply on stdout, no window (chat_app.oneshot)
        from functools import partial

        from chat_app import oneshot

        try:
            wins = given(sys.argv[1:] if argv is None else argv) if args.resume or args.chat is not None else set()
            code = oneshot.run(args, message, wins,
                               partial(settle, args, keep_server=True, store=not args.no_save))
        except Exception as e:
            fatal(e)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # all written and closed: Python's own exit, finalizing torch, took 0.8 s more
    try:
        app = build_app(args)
        need_terminal()
    except (FileNotFoundError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl+C while a server is asked for its models, say
        print(f"{PROG}: interrupted before the window opened", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        fatal(e)
    try:
        app.run()
    except Exception as e:
        fatal(e, app.store.folder)
    if app.farewell:  # the chat history could not be saved: where this run's chat went instead
        print(app.farewell, file=sys.stderr)
    if app.bad_input is not None:  # found by the session's child: one line, as above
        print(f"{PROG}: error: {app.bad_input}", file=sys.stderr)
        sys.exit(2)
    if app.crash is not None:
        fatal(app.crash, app.store.folder)
    if app.quit_signal is not None:  # SIGTERM, SIGHUP: a quit, as the shell reports one
        sys.exit(128 + app.quit_signal)
    if app.return_code:
        print(f"{PROG}: fatal: the app stopped with code {app.return_code}", file=sys.stderr)
        sys.exit(app.return_code)


if __name__ == "__main__":
    main()
