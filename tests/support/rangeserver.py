"""A loopback HTTP file server with byte ranges, for the remote-source tests and benchmark.

It serves files from a folder (``GET``/``HEAD``; one ``Range: bytes=a-b`` per
request, answered 206), counts requests and body bytes per path, and can
misbehave on purpose (:class:`Behaviour`): no Range support (ignored, or
``Accept-Ranges: none``), 500s before success, bodies cut short, a wrong
``Content-Length``.  Started and stopped by the test that uses it, on 127.0.0.1.
"""

from __future__ import annotations

import http.server
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclass
class Behaviour:
    """How the server answers; every field off is a well-behaved server."""

    ranges: str = "yes"  # "yes", "ignore" (send 200 with everything), "none" (and say so)
    fail_first: int = 0  # answer this many GETs with 500 first
    truncate_first: int = 0  # cut this many GET bodies short (then close the connection)
    size_delta: int = 0  # add this to the Content-Length that HEAD reports
    forbidden: str = "forbidden"  # paths starting with this get 403
    failed: int = 0
    truncated: int = 0


@dataclass
class Stats:
    requests: Counter[str] = field(default_factory=Counter)  # GETs by path
    body_bytes: Counter[str] = field(default_factory=Counter)
    ranges: list[tuple[str, str]] = field(default_factory=list)


#: How often the serving loop looks for shutdown(): at the default 0.5 s every
#: server's exit waited half a second (one per test that starts one).
POLL_SECONDS = 0.02


class LoopbackServer(http.server.ThreadingHTTPServer):
    """The tests' loopback HTTP servers (this one and hubserver's): a thread a request."""

    # socketserver listens with a backlog of 5: a client opening many connections at once
    # (concurrent range requests) would see its SYNs dropped and retried for seconds.
    request_queue_size = 256
    daemon_threads = True

    def serving_thread(self) -> threading.Thread:
        """The thread that serves until shutdown(), polling for it every POLL_SECONDS."""
        return threading.Thread(target=self.serve_forever, args=(POLL_SECONDS,), daemon=True)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive, no Nagle delay, no request log: the base of both servers'
    handlers."""

    protocol_version = "HTTP/1.1"
    # headers and body go out in separate writes: with Nagle's algorithm the body waits
    # for the client's delayed ACK, 40 ms a request on loopback
    disable_nagle_algorithm = True

    def log_message(self, *args: object) -> None:
        return


class RangeServer:
    """``with RangeServer(folder) as server: server.url("model.pt")``."""

    def __init__(self, folder: Path, behaviour: Behaviour | None = None) -> None:
        self.folder = folder
        self.behaviour = behaviour or Behaviour()
        self.stats = Stats()
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def _file(self) -> Path | None:
                if self.path.lstrip("/").startswith(server.behaviour.forbidden):
                    self.send_response(403)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                path = (server.folder / self.path.lstrip("/").split("?")[0]).resolve()
                if server.folder.resolve() not in path.parents or not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return path

            def do_HEAD(self) -> None:
                path = self._file()
                if path is None:
                    return
                b = server.behaviour
                self.send_response(200)
                self.send_header("Content-Length", str(path.stat().st_size + b.size_delta))
                self.send_header("Accept-Ranges", "none" if b.ranges == "none" else "bytes")
                self.end_headers()

            def do_GET(self) -> None:
                path = self._file()
                if path is None:
                    return
                b = server.behaviour
                with server._lock:
                    server.stats.requests[path.name] += 1
                    fail = b.failed < b.fail_first
                    b.failed += fail
                if fail:
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                size = path.stat().st_size
                start, end, status = 0, size, 200
                match = _RANGE.match(self.headers.get("Range", ""))
                if match and b.ranges == "yes":
                    start = int(match.group(1))
                    end = min(size, int(match.group(2)) + 1) if match.group(2) else size
                    status = 206
                with server._lock:
                    server.stats.ranges.append((path.name, self.headers.get("Range", "")))
                    cut = b.truncated < b.truncate_first
                    b.truncated += cut
                with path.open("rb") as fp:
                    fp.seek(start)
                    body = fp.read(end - start)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                self.end_headers()
                sent = body[: len(body) // 2] if cut else body
                with server._lock:  # counted before sending: the client may return at once
                    server.stats.body_bytes[path.name] += len(sent)
                self.wfile.write(sent)
                if cut:
                    self.close_connection = True

        self._httpd = LoopbackServer(("127.0.0.1", 0), Handler)
        self._thread = self._httpd.serving_thread()

    def url(self, name: str) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/{name}"

    def reset(self) -> None:
        self.stats = Stats()

    def __enter__(self) -> RangeServer:  # noqa: PYI034 - a test helper, not subclassed
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
