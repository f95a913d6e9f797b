"""Models by name from the Hugging Face Hub: `hf:OWNER/REPO[:FILE]` becomes a local path.

Contract:
- `is_hub(spec) -> bool`: whether a --model value names a Hub model (starts with "hf:").
- `fetch(spec, progress=True) -> Path`: downloads through `huggingface_hub` into the Hub's own
  cache (so a second call reads the cache, and an interrupted download resumes), with its
  progress bars on stderr unless `progress` is False. What comes back:
  - `hf:OWNER/REPO:FILE`: that one file (a GGUF);
  - `hf:OWNER/REPO` holding a `config.json`: the folder, with only what tinyllm reads
    (config, safetensors weights and index, tokenizer files, generation config);
  - `hf:OWNER/REPO` holding no config.json but one `.gguf`: that file; several: a one-line
    error listing them, asking for `:FILE`.
  Refuses with one line (ValueError): a malformed spec, a repo or file the Hub does not have
  (or that needs a login), and no connection where nothing is cached. `HF_ENDPOINT` points it
  at another server (the tests run a local one); `HF_HUB_OFFLINE=1` reads the cache only.
"""

from __future__ import annotations

import re
from pathlib import Path

PREFIX = "hf:"
# What a Hugging Face folder needs here (tinyllm.formats.hf): nothing else is downloaded. Newer
# repos (Qwen 3, Gemma 3) keep their chat template in a file of its own.
FOLDER_FILES = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                "chat_template.jinja", "chat_template.json"]
REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def is_hub(spec: str | Path) -> bool:
    return str(spec).startswith(PREFIX)


def parse(spec: str) -> tuple[str, str | None]:
    """"hf:OWNER/REPO[:FILE]" -> (repo, file or None); ValueError naming the form otherwise."""
    repo, _, file = str(spec)[len(PREFIX):].partition(":")
    if not REPO.match(repo) or (_ and not file):
        raise ValueError(f"{spec!r} is not a Hub model: write hf:OWNER/REPO or hf:OWNER/REPO:FILE.gguf")
    return repo, file or None


def fetch(spec: str, progress: bool = True) -> Path:
    from huggingface_hub import utils as hf_utils

    repo, file = parse(spec)
    try:
        with _bars(progress):
            return _fetch(repo, file, local=not _reachable())
    except hf_utils.LocalEntryNotFoundError:  # (an EntryNotFoundError too: first)
        raise ValueError(f"{spec}: cannot reach the Hub ({_endpoint()}) and it is not in the "
                         "Hub's cache yet: connect and try again") from None
    except hf_utils.RepositoryNotFoundError:
        raise ValueError(f"{spec}: the Hub has no model {repo} (or it is private or gated: "
                         "log in with `hf auth login`)") from None
    except (hf_utils.EntryNotFoundError, hf_utils.RevisionNotFoundError):
        raise ValueError(f"{spec}: {repo} on the Hub has no file {file}") from None
    except hf_utils.HfHubHTTPError as e:
        raise ValueError(f"{spec}: the Hub answered {_status(e)}") from None
    except Exception as e:  # no route, a connection that drops midway, a full disk: the HTTP
        # library's own errors (httpx or httpx2, by huggingface_hub's version) are not OSErrors
        raise ValueError(f"{spec}: the download failed ({type(e).__name__}: {e})") from None


def _fetch(repo: str, file: str | None, local: bool) -> Path:
    """`local`: the Hub cannot be reached, so only its cache answers (huggingface_hub would
    otherwise retry each request for about 20 s first)."""
    import huggingface_hub as hf
    from huggingface_hub import constants
    from huggingface_hub import utils as hf_utils

    if file is not None:
        return Path(hf.hf_hub_download(repo, file, local_files_only=local))
    try:
        hf.hf_hub_download(repo, "config.json", local_files_only=local)
    except hf_utils.LocalEntryNotFoundError:  # (a subclass of the next: first)
        if not local:
            raise
        ggufs = sorted(_cached(repo).glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
        raise
    except hf_utils.EntryNotFoundError:  # reachable, and no folder: a GGUF repo
        pass
    else:
        return Path(hf.snapshot_download(repo, allow_patterns=FOLDER_FILES, local_files_only=local))
    files = hf.HfApi(endpoint=constants.ENDPOINT).list_repo_files(repo)  # the endpoint as it is now
    ggufs = sorted(f for f in files if f.endswith(".gguf"))
    if len(ggufs) == 1:
        return Path(hf.hf_hub_download(repo, ggufs[0]))
    if not ggufs:
        raise ValueError(f"hf:{repo} holds neither a config.json (a Hugging Face model folder) nor "
                         "a .gguf file")
    raise ValueError(f"hf:{repo} holds {len(ggufs)} GGUF files: name one, e.g. hf:{repo}:{ggufs[0]} "
                     f"({', '.join(ggufs[:6])}{', ...' if len(ggufs) > 6 else ''})")


def _reachable(timeout: float = 5.0) -> bool:
    """Whether the Hub's host answers a TCP connection (HF_HUB_OFFLINE=1: never asked)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout).close()
    except OSError:
        return False
    return True


def _cached(repo: str) -> Path:
    """The newest snapshot folder of `repo` in the Hub's cache (may not exist)."""
    from huggingface_hub import constants

    snaps = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}" / "snapshots"
    found = sorted(snaps.iterdir(), key=lambda d: d.stat().st_mtime) if snaps.is_dir() else []
    return found[-1] if found else snaps / "none"


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _status(e) -> str:
    response = getattr(e, "response", None)
    code = getattr(response, "status_code", None)
    return f"HTTP {code}" if code else str(e).splitlines()[0]


class _bars:
    """huggingface_hub's progress bars on (stderr) or off, for the `with` block only."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

        self.was_off = are_progress_bars_disabled()
        if not self.on:
            disable_progress_bars()

    def __exit__(self, *exc):
        from huggingface_hub.utils import enable_progress_bars

        if not self.was_off and not self.on:
            enable_progress_bars()
