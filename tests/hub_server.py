"""A Hugging Face Hub on 127.0.0.1 for the tests: the routes huggingface_hub 2.4.0 calls, served by
the standard library's HTTP server in a thread, with every request and byte it sends counted.

Routes (as the client builds them: `HfApi.model_info`, `hf_hub_url`, `get_hf_file_metadata`):
- GET  /api/models/{org}/{name}[/revision/{revision}]   the repo's commit and files (sizes with ?blobs=true)
- HEAD /{org}/{name}/resolve/{revision}/{path}           X-Repo-Commit, ETag, Content-Length
- GET  /{org}/{name}/resolve/{revision}/{path}           the file, or `Range: bytes=A-B` of it (206)
Errors carry the headers the client turns into its exceptions (X-Error-Code: RepoNotFound, GatedRepo,
RevisionNotFound, EntryNotFound), as the Hub sends them.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

API = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?$")
RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class Repo:
    """A repo at one commit: file name -> its path on disk. `gated`, `private`: as the Hub answers
    a client without access. `fault`: a bad answer to give ("429" on every request, "truncate": a
    range answered with half its bytes)."""

    def __init__(self, files: dict[str, Path], commit: str = "", gated: bool = False, private: bool = False,
                 fault: str | None = None, branches: tuple[str, ...] = ("main",)):
        self.files = files
        self.commit = commit or hashlib.sha1(json.dumps(sorted(files)).encode()).hexdigest()
        self.gated, self.private, self.fault = gated, private, fault
        self.refs = {name: self.commit for name in branches}

    @classmethod
    def from_dir(cls, folder: Path, **kw: Any) -> "Repo":
        files = {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}
        return cls(files, **kw)

    def resolve(self, revision: str) -> str | None:
        return self.commit if revision == self.commit else self.refs.get(revision)


class HubServer:
    """The server and what it saw: each request (method, path, Range header), the body bytes sent
    and the most requests in flight at once."""

    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []
        self.bytes_sent = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.bytes_sent = self.most_in_flight = 0

    def __enter__(self) -> "HubServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._serve(body=True)

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with hub.lock:
                hub.requests.append((self.command, path, self.headers.get("Range")))
                hub.in_flight += 1
                hub.most_in_flight = max(hub.most_in_flight, hub.in_flight)
            try:
                api, resolve = API.match(path), RESOLVE.match(path)
                if api:
                    self._api(api.group(1), api.group(2), "blobs=true" in (urlsplit(self.path).query or ""))
                elif resolve:
                    self._resolve(*resolve.groups(), body=body)
                else:
                    self._error(404, None, "no such route")
            finally:
                with hub.lock:
                    hub.in_flight -= 1

        def _repo(self, repo_id: str, revision: str | None, for_api: bool) -> tuple[Repo, str] | None:
            repo = hub.repos.get(repo_id)
            if repo is None or repo.private:  # the Hub answers a private repo as a missing one
                self._error(401, "RepoNotFound", "Repository not found")
                return None
            if repo.fault == "429":
                self._error(429, None, "Too Many Requests", {"Retry-After": "0"})
                return None
            if repo.gated and not for_api:
                self._error(403, "GatedRepo", "Access to model is restricted")
                return None
            commit = repo.resolve(revision or "main")
            if commit is None:
                self._error(404, "RevisionNotFound", "Invalid rev id")
                return None
            return repo, commit

        def _api(self, repo_id: str, revision: str | None, blobs: bool) -> None:
            found = self._repo(repo_id, revision, for_api=True)
            if found is None:
                return
            repo, commit = found
            siblings = [{"rfilename": name, **({"size": path.stat().st_size} if blobs else {})}
                        for name, path in repo.files.items()]
            doc = {"id": repo_id, "modelId": repo_id, "sha": commit, "private": repo.private,
                   "gated": "manual" if repo.gated else False, "siblings": siblings}
            self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, True)

        def _resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
            found = self._repo(repo_id, revision, for_api=False)
            if found is None:
                return
            repo, commit = found
            path = repo.files.get(name)
            if path is None:
                self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
                return
            size = path.stat().st_size
            headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(f"{commit}/{name}".encode()).hexdigest()}"',
                       "Accept-Ranges": "bytes"}
            wanted = RANGE.match(self.headers.get("Range") or "")
            if not wanted:
                self._send(200, b"", headers, False, size)
                if body:
                    self._stream(path, 0, size)
                return
            start, end = int(wanted.group(1)), min(int(wanted.group(2) or size - 1), size - 1)
            if start >= size:
                self._error(416, None, "Range Not Satisfiable", {"Content-Range": f"bytes */{size}"})
                return
            if repo.fault == "truncate":  # a proxy that cut the answer short, consistently
                end = start + (end - start) // 2
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            self._send(206, _read(path, start, end + 1) if body else b"", headers, body, end + 1 - start)

        def _stream(self, path: Path, start: int, stop: int) -> None:
            """A whole file, a MiB at a time: a client that stops reading stops it."""
            with path.open("rb") as fh:
                fh.seek(start)
                while start < stop:
                    chunk = fh.read(min(1 << 20, stop - start))
                    try:
                        self.wfile.write(chunk)
                    except OSError:
                        return
                    start += len(chunk)
                    with hub.lock:
                        hub.bytes_sent += len(chunk)

        def _error(self, status: int, code: str | None, message: str, extra: dict | None = None) -> None:
            headers = {"X-Error-Message": message, **(extra or {})}
            if code:
                headers["X-Error-Code"] = code
            self._send(status, json.dumps({"error": message}).encode(), headers, self.command != "HEAD")

        def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool,
                  length: int | None = None) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data) if length is None else length))
            self.end_headers()
            if body:
                self.wfile.write(data)
                with hub.lock:
                    hub.bytes_sent += len(data)

    return Handler


def _read(path: Path, start: int, stop: int) -> bytes:
    with path.open("rb") as fh:
        fh.seek(start)
        return fh.read(stop - start)
