"""A loopback server that answers the Hugging Face Hub's file endpoints, for ``hf://`` tests.

It serves repositories from local folders (``HubServer({"user/tiny": folder})``; a key
``datasets/user/name`` serves a dataset repository) to huggingface_hub's own client, pointed
at it with ``HF_ENDPOINT``, so that ``HfFileSystem`` runs unchanged.  The endpoints are the
ones that client calls to find, list and read files (each repository has one revision,
``main``, whose commit id is also accepted):

* ``GET /api/{models,datasets,spaces}/{repo}[/revision/{rev}]``: repository info (its
  commit id and files);
* ``GET /api/{type}s/{repo}/tree/{rev}[/{path}]?recursive=&expand=``: a folder's entries,
  or the whole tree below it, in pages of ``page_size`` linked by a ``Link: rel="next"``
  header, as the Hub pages them;
* ``POST /api/{type}s/{repo}/paths-info/{rev}`` (form fields ``paths``, ``expand``): the
  entries of the paths that exist;
* ``HEAD``/``GET /[datasets/|spaces/]{repo}/resolve/{rev}/{path}``: a file, whole or one
  ``Range: bytes=a-b`` (answered 206), with ``X-Repo-Commit``, ``ETag`` and
  ``Content-Length`` as the Hub sends them.

Failures carry the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``), which the client turns into its own exceptions.  Every request is
logged (:class:`Request`); one the server does not implement is answered 404 and logged
with ``handled=False``, so a test can assert the client asked for nothing else.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from rangeserver import LoopbackServer, QuietHandler

REVISION = "main"
LAST_MODIFIED = "2025-01-01T00:00:00.000Z"
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # unquoted, without the query
    range: str = ""  # the Range header of a resolve request
    body_bytes: int = 0  # file bytes sent (resolve GETs)
    status: int = 200
    handled: bool = True


@dataclass
class _Repo:
    repo_type: str  # "model", "dataset", "space"
    repo_id: str
    folder: Path
    commit: str = field(init=False)

    def __post_init__(self) -> None:
        self.commit = hashlib.sha1(f"{self.repo_type}/{self.repo_id}".encode()).hexdigest()

    def entries(self) -> dict[str, Path]:
        """Every file and folder of the repository, by its path in the repository."""
        return {p.relative_to(self.folder).as_posix(): p for p in sorted(self.folder.rglob("*"))
                if not p.name.startswith(".")}


@functools.lru_cache(maxsize=256)
def _blob_id(local: Path, size: int, mtime_ns: int) -> str:
    """git's blob id of a file (what the Hub gives as a file's ``oid`` and ETag)."""
    digest = hashlib.sha1(b"blob %d\0" % size)
    with local.open("rb") as fp:
        while chunk := fp.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _entry(path: str, local: Path, expand: bool, commit: str) -> dict[str, Any]:
    """One tree / paths-info entry, in the Hub's JSON."""
    if local.is_dir():
        out: dict[str, Any] = {"type": "directory", "path": path,
                               "oid": hashlib.sha1(path.encode()).hexdigest()}
    else:
        st = local.stat()
        out = {"type": "file", "path": path, "size": st.st_size,
               "oid": _blob_id(local, st.st_size, st.st_mtime_ns)}
    if expand:
        out["lastCommit"] = {"id": commit, "title": "Upload", "date": LAST_MODIFIED}
    return out


class HubServer:
    """``with HubServer({"user/tiny": folder}) as hub: hub.endpoint``."""

    def __init__(self, repos: Mapping[str, Path], *, page_size: int = 1000) -> None:
        self.repos: dict[tuple[str, str], _Repo] = {}
        for key, folder in repos.items():
            head, _, rest = key.partition("/")
            kind = _TYPES.get(head) if rest.count("/") == 1 else None
            repo = _Repo(kind or "model", rest if kind else key, Path(folder))
            self.repos[repo.repo_type, repo.repo_id] = repo
        self.page_size = page_size
        self.log: list[Request] = []
        self._lock = threading.Lock()
        self._httpd = LoopbackServer(("127.0.0.1", 0), self._handler())
        self._thread = self._httpd.serving_thread()

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def served(self, name: str | None = None) -> int:
        """File bytes sent by resolve GETs (of files whose path ends with ``name``)."""
        return sum(r.body_bytes for r in self.log if name is None or r.path.endswith(name))

    def reset(self) -> None:
        with self._lock:
            self.log.clear()

    def _record(self, request: Request) -> None:
        with self._lock:
            self.log.append(request)

    def __enter__(self) -> HubServer:  # noqa: PYI034 - a test helper, not subclassed
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    # -- routing -----------------------------------------------------------------------
    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        hub = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server names it
                hub._route(self, "GET")

            def do_HEAD(self) -> None:  # noqa: N802 - http.server names it
                hub._route(self, "HEAD")

            def do_POST(self) -> None:  # noqa: N802 - http.server names it
                hub._route(self, "POST")

        return Handler

    def _route(self, h: http.server.BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        parts = url.path.strip("/").split("/")
        query = parse_qs(url.query)
        if parts[0] == "api" and len(parts) == 3 and parts[1] in _TYPES and method == "GET":
            # a one-part id (older clients try "user" before "user/tiny")
            return self._repo_info(h, _TYPES[parts[1]], parts[2], REVISION)
        if parts[0] == "api" and len(parts) >= 4 and parts[1] in _TYPES:
            repo_type, repo_id, rest = _TYPES[parts[1]], "/".join(parts[2:4]), parts[4:]
            if method == "GET" and not rest:
                return self._repo_info(h, repo_type, repo_id, REVISION)
            if method == "GET" and len(rest) == 2 and rest[0] == "revision":
                return self._repo_info(h, repo_type, repo_id, unquote(rest[1]))
            if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
                return self._tree(h, url.path, repo_type, repo_id, unquote(rest[1]),
                                  unquote("/".join(rest[2:])), query)
            if method == "POST" and len(rest) == 2 and rest[0] == "paths-info":
                form = parse_qs(body.decode())
                return self._paths_info(h, repo_type, repo_id, unquote(rest[1]),
                                        form.get("paths", []), _true(form.get("expand")))
        else:
            kind = _TYPES.get(parts[0]) if parts[0] in ("datasets", "spaces") else None
            at = 1 if kind else 0
            rest = parts[at + 2:]
            if method in ("GET", "HEAD") and len(rest) >= 3 and rest[0] == "resolve":
                return self._resolve(h, method, kind or "model", "/".join(parts[at:at + 2]),
                                     unquote(rest[1]), unquote("/".join(rest[2:])))
        self._send(h, method, url.path, 404, b"", handled=False)
        return None

    # -- answers -----------------------------------------------------------------------
    def _send(self, h: http.server.BaseHTTPRequestHandler, method: str, path: str, status: int,
              body: bytes, headers: Mapping[str, str] | None = None, *, range_: str = "",
              file_bytes: int = 0, handled: bool = True) -> None:
        self._record(Request(method, unquote(path), range_, file_bytes if method == "GET" else 0,
                             status, handled))
        h.send_response(status)
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(body)

    def _json(self, h: http.server.BaseHTTPRequestHandler, method: str, value: Any,
              headers: Mapping[str, str] | None = None) -> None:
        self._send(h, method, urlsplit(h.path).path, 200, json.dumps(value).encode(),
                   {"Content-Type": "application/json", **(headers or {})})

    def _error(self, h: http.server.BaseHTTPRequestHandler, method: str, code: str,
               message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(h, method, urlsplit(h.path).path, 404, body,
                   {"Content-Type": "application/json", "X-Error-Code": code,
                    "X-Error-Message": message})

    def _find(self, h: http.server.BaseHTTPRequestHandler, method: str, repo_type: str,
              repo_id: str, revision: str) -> _Repo | None:
        """The repository at ``revision``, or None after answering 404."""
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            self._error(h, method, "RepoNotFound", "Repository not found")
        elif revision not in (REVISION, repo.commit):
            self._error(h, method, "RevisionNotFound", "Invalid rev id: " + revision)
        else:
            return repo
        return None

    def _repo_info(self, h: http.server.BaseHTTPRequestHandler, repo_type: str, repo_id: str,
                   revision: str) -> None:
        repo = self._find(h, "GET", repo_type, repo_id, revision)
        if repo is not None:
            files = [p for p, local in repo.entries().items() if local.is_file()]
            # the fields the Hub always sends (older clients require them)
            self._json(h, "GET", {"id": repo_id, "_id": repo.commit[:24], "sha": repo.commit,
                                  "author": repo_id.partition("/")[0], "private": False,
                                  "disabled": False, "gated": False, "downloads": 0,
                                  "likes": 0, "tags": [], "createdAt": LAST_MODIFIED,
                                  "lastModified": LAST_MODIFIED,
                                  "siblings": [{"rfilename": p} for p in files]})

    def _tree(self, h: http.server.BaseHTTPRequestHandler, url_path: str, repo_type: str,
              repo_id: str, revision: str, path: str, query: Mapping[str, list[str]]) -> None:
        repo = self._find(h, "GET", repo_type, repo_id, revision)
        if repo is None:
            return
        entries = repo.entries()
        if path and not (path in entries and entries[path].is_dir()):
            self._error(h, "GET", "EntryNotFound", f"{path} does not exist on {revision}")
            return
        prefix = path + "/" if path else ""
        recursive, expand = _true(query.get("recursive")), _true(query.get("expand"))
        below = [p for p in entries if p.startswith(prefix)
                 and (recursive or "/" not in p[len(prefix):])]
        start = int((query.get("cursor") or ["0"])[0])
        page = below[start:start + self.page_size]
        headers = {}
        if start + self.page_size < len(below):
            params = urlencode({"recursive": recursive, "expand": expand,
                                "cursor": start + self.page_size})
            headers["Link"] = f'<{self.endpoint}{url_path}?{params}>; rel="next"'
        self._json(h, "GET", [_entry(p, entries[p], expand, repo.commit) for p in page], headers)

    def _paths_info(self, h: http.server.BaseHTTPRequestHandler, repo_type: str, repo_id: str,
                    revision: str, paths: list[str], expand: bool) -> None:
        repo = self._find(h, "POST", repo_type, repo_id, revision)
        if repo is not None:
            entries = repo.entries()
            self._json(h, "POST", [_entry(p, entries[p], expand, repo.commit)
                                   for p in paths if p in entries])

    def _resolve(self, h: http.server.BaseHTTPRequestHandler, method: str, repo_type: str,
                 repo_id: str, revision: str, path: str) -> None:
        repo = self._find(h, method, repo_type, repo_id, revision)
        if repo is None:
            return
        local = repo.entries().get(path)
        if local is None or not local.is_file():
            self._error(h, method, "EntryNotFound", f"{path} does not exist on {revision}")
            return
        size = local.stat().st_size
        headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes",
                   "ETag": '"' + str(_entry(path, local, False, repo.commit)["oid"]) + '"',
                   "Content-Type": "application/octet-stream"}
        asked = h.headers.get("Range", "")
        start, end, status = 0, size, 200
        if asked:
            match = _RANGE.match(asked)
            if match is None or int(match.group(1)) >= size:
                self._send(h, method, urlsplit(h.path).path, 416, b"",
                           {"Content-Range": f"bytes */{size}"}, range_=asked)
                return
            start = int(match.group(1))
            end = min(size, int(match.group(2)) + 1) if match.group(2) else size
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        with local.open("rb") as fp:
            fp.seek(start)
            body = fp.read(end - start) if method == "GET" else b""
        headers["Content-Length"] = str(end - start)
        self._send(h, method, urlsplit(h.path).path, status, body, headers, range_=asked,
                   file_bytes=len(body))


def _true(values: list[str] | None) -> bool:
    """A boolean query or form field, as the client sends it (``True``, ``true``, ``1``)."""
    return values is not None and len(values) > 0 and values[0].lower() in ("true", "1")
