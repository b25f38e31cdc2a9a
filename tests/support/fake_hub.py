"""A local Hugging Face Hub for tests: a real HTTP server in a thread that speaks the part of the
Hub protocol the real huggingface_hub client uses to download.

- `GET /api/models/{repo}[/revision/{rev}]`: id, commit sha, siblings with size, blob id and
  LFS sha256 (`?blobs=true` or not, like the Hub).
- `HEAD` / `GET /{repo}/resolve/{rev}/{file}`: `X-Repo-Commit`, `ETag`, `Content-Length`,
  `Accept-Ranges`, and `Range: bytes=N-` answered with 206 and `Content-Range`.
- Errors carry `X-Error-Code` as the Hub sends them: `GatedRepo` (401 without a token, 403 with
  a token that has no access), `RepoNotFound`, `RevisionNotFound`, `EntryNotFound`.
- Fault injection: cut a transfer after N bytes, fail requests with a status, report a size that
  differs from the real one, stall a transfer halfway until the test lets it go on. Every
  request is logged for assertions.
No `X-Xet-Hash`: downloads take the plain HTTP path.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubFile:
    source: bytes | Path
    lfs: bool
    _sha256: str | None = None

    @property
    def size(self) -> int:
        return len(self.source) if isinstance(self.source, bytes) else self.source.stat().st_size

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end)."""
        if isinstance(self.source, bytes):
            return self.source[start:end]
        with open(self.source, "rb") as fh:
            fh.seek(start)
            return fh.read(end - start)

    def sha256(self) -> str:
        if self._sha256 is None:  # files do not change while served: hash once
            h = hashlib.sha256()
            for off in range(0, self.size, 1 << 22):
                h.update(self.read(off, min(self.size, off + (1 << 22))))
            self._sha256 = h.hexdigest()
        return self._sha256

    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256()}\nsize {self.size}\n".encode()

    def oid(self) -> str:
        return git_oid(self.pointer() if self.lfs else self.read(0, self.size))


@dataclass
class HubRepo:
    files: dict[str, HubFile]
    gated: bool = False
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit
    commit: str = ""


@dataclass
class Cut:
    """Serve `after` bytes of the next `times` GETs of a file, then drop the connection;
    afterwards answer `then_status` to the next `then_times` requests for it."""

    after: int
    times: int = 1
    then_status: int | None = None
    then_times: int = 0


class FakeHub:
    def __init__(self, tokens: tuple[str, ...] = ("hf_test_token",)):
        self.repos: dict[str, HubRepo] = {}
        self.tokens = set(tokens)  # tokens with access to the gated repos
        self.reported_sizes: dict[tuple[str, str], int] = {}
        self.reported_sha256: dict[tuple[str, str], str] = {}  # an LFS sha256 the listing gives instead
        self.cuts: dict[tuple[str, str], Cut] = {}
        self.tampered: dict[tuple[str, str], bytes] = {}  # served instead of the real content
        # half of a file is sent, then nothing more until the event is set
        self.stalls: dict[tuple[str, str], threading.Event] = {}
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- content -----------------------------------------------------------------------

    def add_repo(self, repo: str, files: dict[str, bytes | Path], *, gated: bool = False,
                 branches: tuple[str, ...] = ("main",)) -> str:
        """Add a repo; returns its commit sha (derived from the content, so stable)."""
        hub_files = {name: HubFile(src, name.endswith(LFS_SUFFIXES)) for name, src in files.items()}
        content = json.dumps([repo, sorted((n, f.oid()) for n, f in hub_files.items())])
        commit = hashlib.sha1(content.encode()).hexdigest()
        self.repos[repo] = HubRepo(hub_files, gated, {b: commit for b in branches}, commit)
        return commit

    def requests(self, method: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.log if (method is None or r["method"] == method)
                    and (kind is None or r["kind"] == kind)]

    # --- lifecycle ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()


class _Error(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        self.status, self.code, self.message, self.commit = status, code, message, commit


_API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return None

    # --- routing -----------------------------------------------------------------------

    def do_GET(self) -> None:
        self._handle(head=False)

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def _handle(self, head: bool) -> None:
        path = urlsplit(self.path).path
        api, resolve = _API.match(path), _RESOLVE.match(path)
        kind = "api" if api else "resolve" if resolve else "other"
        with self.hub._lock:
            self.hub.log.append({"method": self.command, "path": path, "kind": kind,
                                 "range": self.headers.get("Range"),
                                 "auth": self.headers.get("Authorization")})
        try:
            if api and not head:
                self._model_info(api.group(1), unquote(api.group(2) or "main"))
            elif resolve:
                self._resolve(resolve.group(1), unquote(resolve.group(2)), unquote(resolve.group(3)), head)
            else:
                raise _Error(404, None, "Not Found")
        except _Error as e:
            body = json.dumps({"error": e.message}).encode()
            self.send_response(e.status)
            if e.code:
                self.send_header("X-Error-Code", e.code)
            self.send_header("X-Error-Message", e.message)
            if e.commit:
                self.send_header("X-Repo-Commit", e.commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

    # --- access ------------------------------------------------------------------------

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[7:] if auth.lower().startswith("bearer ") else None

    def _repo(self, repo_id: str) -> HubRepo:
        repo = self.hub.repos.get(repo_id)
        token = self._token()
        if repo is None:
            # like the Hub: without a token a missing repo answers 401, with one 404
            raise _Error(404 if token else 401, "RepoNotFound", "Repository not found")
        if repo.gated and token not in self.hub.tokens:
            status = 403 if token else 401
            raise _Error(status, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                                              "and be authenticated to access it. Please log in.")
        return repo

    def _commit(self, repo: HubRepo, rev: str) -> str:
        if rev in repo.branches:
            return repo.branches[rev]
        if rev == repo.commit:
            return rev
        raise _Error(404, "RevisionNotFound", f"Invalid rev id: {rev}")

    # --- endpoints ---------------------------------------------------------------------

    def _model_info(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, rev)
        siblings = []
        for name, f in sorted(repo.files.items()):
            size = self.hub.reported_sizes.get((repo_id, name), f.size)
            entry: dict[str, Any] = {"rfilename": name, "size": size, "blobId": f.oid()}
            if f.lfs:
                sha256 = self.hub.reported_sha256.get((repo_id, name), f.sha256())
                entry["lfs"] = {"size": size, "sha256": sha256, "pointerSize": len(f.pointer())}
            siblings.append(entry)
        body = json.dumps({"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                           "gated": "auto" if repo.gated else False, "siblings": siblings}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _resolve(self, repo_id: str, rev: str, name: str, head: bool) -> None:
        repo = self._repo(repo_id)
        commit = self._commit(repo, rev)
        f = repo.files.get(name)
        if f is None:
            raise _Error(404, "EntryNotFound", f"{name} does not exist on \"{rev}\"", commit)
        key = (repo_id, name)
        if key in self.hub.tampered:
            f = HubFile(self.hub.tampered[key], f.lfs, f.sha256())  # same headers, other bytes
        cut = self.hub.cuts.get(key)
        if not head and cut and cut.times <= 0 and cut.then_times > 0 and cut.then_status:
            cut.then_times -= 1
            raise _Error(cut.then_status, None, "Service Unavailable")
        start, end = 0, f.size
        m = _RANGE.match(self.headers.get("Range") or "")
        if m and not head:
            start = int(m.group(1))
            end = int(m.group(2)) + 1 if m.group(2) else f.size
            if start >= f.size:
                raise _Error(416, None, "Range Not Satisfiable")
        self.send_response(206 if m and not head else 200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{f.sha256() if f.lfs else f.oid()}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if m and not head:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
        self.end_headers()
        if head:
            return
        if not head and cut and cut.times > 0:
            cut.times -= 1
            self._send(f, start, min(end, start + cut.after))
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the client sees the body end early
            return
        stall = self.hub.stalls.get(key)
        if stall is not None:
            half = start + (end - start) // 2
            self._send(f, start, half)
            self.wfile.flush()
            stall.wait(60)
            start = half
        self._send(f, start, end)

    def _send(self, f: HubFile, start: int, end: int) -> None:
        for off in range(start, end, 1 << 20):
            self.wfile.write(f.read(off, min(end, off + (1 << 20))))
