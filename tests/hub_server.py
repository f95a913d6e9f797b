"""A local stand-in for the Hugging Face Hub, for `HF_ENDPOINT`: the few routes huggingface_hub's
downloads use, serving folders under `root` as repos `root/OWNER/NAME/...`, at one commit.

  HEAD|GET /OWNER/NAME/resolve/REV/FILE       the file (ETag, X-Repo-Commit; Range resumes)
  GET /api/models/OWNER/NAME[/revision/REV]   the repo's sha and files
  GET /api/models/OWNER/NAME/tree/REV         its files, as list_repo_files reads them
A missing repo or file answers 404 with the Hub's X-Error-Code (RepoNotFound, EntryNotFound).
`requests` counts the file downloads (GET of resolve/), so a test can tell the cache answered.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubServer:
    def __init__(self, root: Path):
        self.root, self.requests = root, 0
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._resolve(self, body=False)

            def do_GET(self):
                if self.path.startswith("/api/models/"):
                    hub._api(self)
                else:
                    hub._resolve(self, body=True)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_port}"

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def _files(self, repo: Path) -> list[Path]:
        return sorted(f for f in repo.rglob("*") if f.is_file())

    def _api(self, h) -> None:
        owner, name, *rest = unquote(h.path.split("?")[0])[len("/api/models/"):].split("/")
        repo = self.root / owner / name
        if not repo.is_dir():
            return _send(h, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
        if rest[:1] == ["tree"]:
            body = [{"type": "file", "path": str(f.relative_to(repo)), "size": f.stat().st_size,
                     "oid": hashlib.sha1(f.read_bytes()).hexdigest()} for f in self._files(repo)]
        else:
            body = {"id": f"{owner}/{name}", "sha": COMMIT,
                    "siblings": [{"rfilename": str(f.relative_to(repo))} for f in self._files(repo)]}
        _send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _resolve(self, h, body: bool) -> None:
        parts = unquote(h.path.split("?")[0]).lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve" or not (self.root / parts[0] / parts[1]).is_dir():
            return _send(h, 404, b"", {"X-Error-Code": "RepoNotFound"})
        f = self.root / parts[0] / parts[1] / "/".join(parts[4:])
        if not f.is_file():
            return _send(h, 404, b"", {"X-Error-Code": "EntryNotFound"})
        data = f.read_bytes()
        start = 0
        if (rng := h.headers.get("Range", "")).startswith("bytes="):
            start = int(rng[6:].split("-")[0])
        if body:
            self.requests += 1
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
        _send(h, 206 if start else 200, data[start:] if body else b"", headers, len(data) - start)


def _send(h, code: int, body: bytes, headers: dict, length: int | None = None) -> None:
    h.send_response(code)
    for k, v in headers.items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body) if length is None else length))
    h.end_headers()
    if body:
        h.wfile.write(body)
