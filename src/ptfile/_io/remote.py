"""Remote sources: any fsspec URL (``https://``, ``s3://``, ``gs://``, ``hf://``…) read by range.

A checkpoint's metadata is a few small pieces of a large file: a ZIP's end
records and central directory at its tail, and ``data.pkl`` near its head.
:class:`RemoteSource` is a :class:`~ptfile._io.local.Source` that reads exactly those
with positioned range requests through fsspec (which knows every backend);
nothing here speaks HTTP or S3 itself.  What fsspec's own file caches do not
do, and this module does:

* **Few round trips.**  The first read near the head fetches
  :data:`HEAD_BYTES`; the first read in the last :data:`TAIL_BYTES` fetches
  that whole tail (the end records and, for most files, the central
  directory) in one request.  Other small reads fetch a
  :data:`BLOCK_BYTES` block, so neighbouring reads (a local header, then its
  record) share one request; blocks are aligned, so reads that walk back
  share them too.  Reads of :data:`BIG_READ_BYTES` or more are
  fetched exactly and not cached.  The cache keeps at most
  :data:`CACHE_BYTES` (least recently used spans go first).
* **Coalesced, concurrent reads.**  :meth:`RemoteSource.pread_many` merges
  ranges less than :data:`COALESCE_GAP_BYTES` apart and fetches the merged
  ranges concurrently (fsspec's ``cat_ranges``); :meth:`RemoteSource.read_all`
  fetches the whole file in :data:`CHUNK_BYTES` chunks the same way, with a
  progress bar on a terminal.
* **Checked responses.**  Every response must have exactly the requested
  length.  A transient failure (a connection error, a 5xx or 429, a short or
  truncated body) is retried :data:`RETRIES` times with exponential backoff;
  a 404, a 403, or a failure that outlasts the retries is a
  :class:`~ptfile.errors.RemoteError` naming the URL and the range.
* **Servers without Range support.**  A server that says ``Accept-Ranges:
  none``, or gives no size, is read once, whole and in order, into memory,
  with a progress bar on a terminal, if the file is at most
  ``Limits.max_whole_download_bytes``; otherwise the read is refused.  A
  server that answers a range request with the whole file has just sent it:
  that body is kept as the file (one download), with a
  :class:`~ptfile.errors.PtfileWarning`.

``fsspec`` is an optional dependency (ptfile's ``remote`` extra), as are
the backends it needs (``s3fs``, ``gcsfs``, ``huggingface_hub``); a missing one
is an :class:`~ptfile.errors.UnsupportedFeatureError` naming the package.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, Final, TypeAlias

from ..errors import PtfileWarning, RemoteError, UnsupportedFeatureError
from ..limits import DEFAULT_LIMITS, Limits
from .local import BytesSource, FileLike, Source, check_range, open_source
from .paths import is_url, url_scheme
from .progress import progress_bar

__all__ = ["RemoteSource", "StorageOptions", "local_path", "open_any", "open_target",
           "watched_sources"]

#: fsspec's options for a URL's backend (credentials, endpoints…), as fsspec takes them.
StorageOptions: TypeAlias = "Mapping[str, Any] | None"

#: First fetch at the head: the signature, ``data.pkl``'s local header and, for
#: most state dicts, the whole pickle and the next records' headers.
HEAD_BYTES: Final = 64 << 10
#: First fetch at the tail: the end records (the EOCD search needs 65,557 bytes)
#: and the central directory of checkpoints of up to ~4,000 tensors.
TAIL_BYTES: Final = 512 << 10
#: What any other small read fetches.
BLOCK_BYTES: Final = 64 << 10
#: Reads at least this big are fetched exactly, and not cached.
BIG_READ_BYTES: Final = 1 << 20
#: Cached spans in all.
CACHE_BYTES: Final = 16 << 20
#: Ranges closer than this are fetched as one.
COALESCE_GAP_BYTES: Final = 64 << 10
#: One request of a whole-file read.
CHUNK_BYTES: Final = 8 << 20
#: Requests in flight at once in a whole-file read (between progress updates).
CONCURRENCY: Final = 16
#: Requests in flight at once for small ranges (prefetched local headers).
SMALL_CONCURRENCY: Final = 32
#: Attempts after the first, and the first wait (doubled each time).
RETRIES: Final = 4
BACKOFF_SECONDS: Final = 0.05

#: When set (to a list), every RemoteSource opened in this context is appended to it, so
#: a caller can add up the requests and bytes one piece of work fetched (ptfile.bulk).
watched_sources: contextvars.ContextVar[list[RemoteSource] | None] = contextvars.ContextVar(
    "watched_sources", default=None)


#: By URL scheme: the package its fsspec backend needs, what installs it, and ptfile's
#: extra that pins a working set of versions.
BACKENDS: Final[Mapping[str, tuple[str, str, str]]] = {
    "http": ("aiohttp", "'fsspec[http]'", "remote"),
    "https": ("aiohttp", "'fsspec[http]'", "remote"),
    "s3": ("s3fs", "s3fs", "s3"), "s3a": ("s3fs", "s3fs", "s3"),
    "gs": ("gcsfs", "gcsfs", "gcs"), "gcs": ("gcsfs", "gcsfs", "gcs"),
    "hf": ("huggingface_hub", "huggingface_hub", "hf"),
}


def _missing_backend(url: str, exc: ImportError) -> UnsupportedFeatureError:
    """The error for a backend that is not installed: the package, how to install it,
    and the extra that pins versions that work together."""
    scheme = url_scheme(url) or ""
    if scheme not in BACKENDS:  # fsspec's own message names the package
        return UnsupportedFeatureError(
            f"reading {scheme}:// URLs needs a package that is not installed: {exc}")
    package, install, extra = BACKENDS[scheme]
    return UnsupportedFeatureError(
        f"reading {scheme}:// URLs needs {package}, which is not installed: pip install "
        f"{install}, or ptfile's {extra} extra: pip install 'ptfile[{extra}]' ({exc})")


def filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the path on it.

    Raises
    ------
    UnsupportedFeatureError
        fsspec, or the backend the scheme needs, is not installed.
    """
    try:
        import fsspec.core  # type: ignore[import-untyped]  # optional: only URLs need it
    except ImportError:
        raise UnsupportedFeatureError(
            f"reading {url_scheme(url)}:// URLs needs fsspec: pip install 'fsspec[http]' "
            f"(ptfile's remote extra)") from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except ImportError as exc:  # the backend package (s3fs, gcsfs, huggingface_hub…)
        raise _missing_backend(url, exc) from None
    except ValueError as exc:  # an unknown protocol
        raise UnsupportedFeatureError(f"cannot read {url!r}: {exc}") from None
    return fs, str(path)


#: Open options, by URL scheme, for backends that read ranges through fsspec's generic
#: ``cat_file`` (open, seek, read): their buffered file's default read-ahead cache would
#: fetch a whole block (5 MiB) past every range; without a cache it fetches the range.
EXACT_READS: Final[Mapping[str, Mapping[str, Any]]] = {"hf": {"cache_type": "none"}}


def _read_options(url: str, fs: Any) -> dict[str, Any]:
    """What :meth:`RemoteSource._fetch` passes to ``fs.cat_file`` (and ``cat_ranges``)."""
    import fsspec.spec  # type: ignore[import-untyped]  # installed with fsspec.core above

    generic = getattr(type(fs), "cat_file", None) is fsspec.spec.AbstractFileSystem.cat_file
    return dict(EXACT_READS.get(url_scheme(url) or "", {})) if generic else {}


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return status if isinstance(status, int) else None


def _is_transient(exc: BaseException) -> bool:
    """A failure a retry may cure: connection trouble, a 5xx/429/408, a broken body."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    status = _status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return isinstance(exc, (OSError, TimeoutError)) or \
        type(exc).__module__.startswith(("aiohttp", "asyncio", "botocore", "aiobotocore"))


def _remote_error(url: str, what: str, exc: BaseException) -> RemoteError:
    status = _status(exc)
    if isinstance(exc, FileNotFoundError) or status == 404:
        # A backend may say which part is missing (huggingface_hub: "(repository not found)",
        # "(revision not found)"); most only name the path again.
        said = str(exc.args[-1]) if isinstance(exc, FileNotFoundError) and exc.args else ""
        why = f": {said}" if said and said not in url else ""
        return RemoteError(f"{url}: not found (404) reading {what}{why}", url=url, status=404)
    if isinstance(exc, PermissionError) or status in (401, 403):
        return RemoteError(f"{url}: access denied ({status or 403}) reading {what}; pass "
                           "credentials with storage_options", url=url, status=status or 403)
    return RemoteError(f"{url}: reading {what} failed after {RETRIES + 1} attempts: "
                       f"{type(exc).__name__}: {exc}", url=url, status=status)


class RemoteSource:
    """A :class:`~ptfile._io.local.Source` over an fsspec URL: checked, cached range reads.

    ``requests`` and ``bytes_fetched`` count what was asked of the server (the
    size look-up excluded).
    """

    map_access: str | None = None
    reads_on_demand: bool = True

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.name: str | None = url
        self._fs, self._path = filesystem(url, storage_options)
        self._read_options = _read_options(url, self._fs)
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, bytes] = OrderedDict()  # start -> bytes, LRU order
        self._cached = 0
        self._whole: bytes | bytearray | None = None
        self.requests = self.bytes_fetched = 0
        info = self._info()
        size = info.get("size")
        if info.get("type") == "directory":
            raise RemoteError(f"{url}: is a directory, not a checkpoint file", url=url)
        if not isinstance(size, int) or size < 0 or info.get("partial") is False:
            self._whole = self._stream_whole(size, limits)
            size = len(self._whole)
        self.size: int = size
        watching = watched_sources.get()
        if watching is not None:
            watching.append(self)

    def _info(self) -> dict[str, Any]:
        """fsspec's ``info`` of the file.  fsspec's HTTP backend turns every failure of
        its size look-up into "not found": a one-byte read then says what the server
        really answers (403, 500…)."""
        try:
            info = self._call(self._fs.info, "the file's size", self._path)
        except RemoteError as exc:
            if exc.status != 404 or url_scheme(self.name) not in ("http", "https"):
                raise
            self._call(self._fs.cat_file, "the file", self._path, start=0, end=1)
            raise
        return info if isinstance(info, dict) else {}

    # -- fetching ----------------------------------------------------------------------
    def _call(self, fn: Any, what: str, *args: Any, **kwargs: Any) -> Any:
        for attempt in range(RETRIES + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # classified: transient ones are retried
                if not _is_transient(exc) or attempt == RETRIES:
                    raise _remote_error(self.name or "", what, exc) from exc
            time.sleep(BACKOFF_SECONDS * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` in one checked request (retried when short)."""
        what = f"bytes {start:#x}..{end:#x}"
        for attempt in range(RETRIES + 1):
            data = self._call(self._fs.cat_file, what, self._path, start=start, end=end,
                              **self._read_options)
            self.requests += 1
            self.bytes_fetched += len(data)
            if len(data) == end - start:
                return bytes(data)
            if len(data) == self.size and (start, end) != (0, self.size):
                return self._keep_whole(data)[start:end]
            if attempt < RETRIES:
                time.sleep(BACKOFF_SECONDS * 2**attempt)
        raise RemoteError(f"{self.name}: reading {what} gave {len(data)} bytes, expected "
                          f"{end - start} (a truncated body or a wrong Content-Length)",
                          url=self.name)

    def _keep_whole(self, data: bytes) -> bytes:
        warnings.warn(f"{self.name}: the server ignores range requests and sent the whole "
                      f"file ({len(data)} bytes); ptfile keeps it in memory",
                      PtfileWarning, stacklevel=4)
        self._whole = data
        return data

    def _stream_whole(self, size: int | None, limits: Limits) -> bytearray:
        """The whole file, read once in order: for servers that cannot serve ranges."""
        cap = limits.max_whole_download_bytes
        if size is not None and size > cap:
            raise RemoteError(f"{self.name}: the server does not serve byte ranges, and "
                              f"reading the file needs all {size} bytes (above "
                              f"Limits.max_whole_download_bytes = {cap})", url=self.name)
        out = bytearray()
        with progress_bar(size or 0, "download") as update, \
                self._call(self._fs.open, "the file", self._path, "rb", block_size=0) as fp:
            self.requests += 1
            while chunk := self._read_chunk(fp):
                out += chunk
                if len(out) > cap:
                    raise RemoteError(f"{self.name}: more than Limits.max_whole_download_bytes"
                                      f" = {cap} bytes", url=self.name)
                update(len(chunk))
        self.bytes_fetched += len(out)
        if size is not None and len(out) != size:
            raise RemoteError(f"{self.name}: the server announced {size} bytes and sent "
                              f"{len(out)}", url=self.name)
        return out

    def _read_chunk(self, fp: Any) -> bytes:
        """The next chunk of a streamed read; a broken stream is a RemoteError (a streamed
        read cannot resume, so it is not retried)."""
        try:
            chunk: bytes = fp.read(CHUNK_BYTES)
        except Exception as exc:
            raise RemoteError(f"{self.name}: the streamed read broke: {type(exc).__name__}: "
                              f"{exc}", url=self.name, status=_status(exc)) from exc
        return chunk

    # -- the cache ---------------------------------------------------------------------
    def _cached_slice(self, offset: int, n: int) -> bytes | None:
        for start, data in reversed(self._cache.items()):
            if start <= offset and offset + n <= start + len(data):
                self._cache.move_to_end(start)
                return data[offset - start:offset - start + n]
        return None

    def _remember(self, start: int, data: bytes) -> None:
        old = self._cache.pop(start, None)
        self._cached += len(data) - (len(old) if old is not None else 0)
        self._cache[start] = data
        while self._cached > CACHE_BYTES and len(self._cache) > 1:
            _, dropped = self._cache.popitem(last=False)
            self._cached -= len(dropped)

    def _span_for(self, offset: int, n: int) -> tuple[int, int]:
        """What to fetch for a small read at ``offset``: the tail, the head, or a block."""
        size = self.size
        if offset >= size - TAIL_BYTES:
            return max(0, size - TAIL_BYTES), size
        if offset < HEAD_BYTES and not self._cache:
            return 0, min(size, max(HEAD_BYTES, offset + n))
        start = offset - offset % BLOCK_BYTES  # aligned: reads walking back share blocks too
        return start, min(size, max(start + BLOCK_BYTES, offset + n))

    # -- the Source interface ----------------------------------------------------------
    def pread(self, offset: int, n: int, what: str) -> bytes:
        """Exactly ``n`` bytes at ``offset``, or a FormatError naming ``what``."""
        check_range(self.size, offset, n, what)
        if self._whole is not None:
            return bytes(self._whole[offset:offset + n])
        if n >= BIG_READ_BYTES:
            return self._fetch_big(offset, n)
        with self._lock:
            found = self._cached_slice(offset, n)
            if found is not None:
                return found
            start, end = self._span_for(offset, n)
            data = self._fetch(start, end)
            if self._whole is None:
                self._remember(start, data)
            return data[offset - start:offset - start + n]

    def _fetch_big(self, offset: int, n: int) -> bytes:
        """A big read, fetched exactly, less a cached span that holds its end (the
        tail block holds the end of a big central directory)."""
        end = offset + n
        with self._lock:
            held = next(((start, data) for start, data in self._cache.items()
                         if offset < start < end <= start + len(data)), None)
        if held is None:
            return self._fetch(offset, end)
        start, data = held
        return self._fetch(offset, start) + data[:end - start]

    def view(self, offset: int, n: int, what: str) -> memoryview:
        return memoryview(self.pread(offset, n, what))

    def read_fresh(self, offset: int, n: int, what: str) -> bytearray:
        return bytearray(self.pread(offset, n, what))

    def pread_many(self, ranges: Sequence[tuple[int, int]], what: str) -> list[bytes]:
        """The bytes of each ``(offset, n)``: ranges close together are fetched as one,
        and the merged ranges concurrently."""
        for offset, n in ranges:
            check_range(self.size, offset, n, what)
        if self._whole is not None or len(ranges) <= 1:
            return [self.pread(offset, n, what) for offset, n in ranges]
        merged = _coalesce(ranges)
        fetched = dict(zip(merged, self._fetch_concurrently(merged), strict=True))
        out = []
        for offset, n in ranges:
            start, end = next(s for s in merged if s[0] <= offset and offset + n <= s[1])
            out.append(fetched[start, end][offset - start:offset - start + n])
        return out

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch the ranges not cached yet together (neighbours as one, the rest
        concurrently) and keep them, so the reads that follow cost no request."""
        if self._whole is not None:
            return
        with self._lock:
            wanted = [(o, n) for o, n in ranges if o >= 0 and n > 0 and o + n <= self.size
                      and self._cached_slice(o, n) is None]
        spans = [s for s in _coalesce(wanted) if s[1] - s[0] < BIG_READ_BYTES]
        if spans:
            fetched = self._fetch_concurrently(spans, at_once=SMALL_CONCURRENCY)
            with self._lock:
                for (start, _), data in zip(spans, fetched, strict=True):
                    self._remember(start, data)

    def _fetch_concurrently(self, spans: Sequence[tuple[int, int]],
                            into: memoryview | None = None,
                            update: Callable[[int], None] | None = None,
                            at_once: int = CONCURRENCY) -> list[bytes]:
        """Each ``[start, end)`` span, fetched concurrently; a failed one is fetched again
        on its own (with :meth:`_fetch`'s retries and checks).  With ``into``, each span
        is copied there at its offset instead of returned."""
        out: list[bytes] = []
        for i in range(0, len(spans), at_once):
            group = spans[i:i + at_once]
            got = self._call(self._fs.cat_ranges, "byte ranges", [self._path] * len(group),
                             [s for s, _ in group], [e for _, e in group], on_error="return",
                             **self._read_options)
            for (start, end), data in zip(group, got, strict=True):
                if isinstance(data, bytes) and len(data) == end - start:
                    self.requests += 1
                    self.bytes_fetched += len(data)
                else:
                    data = self._fetch(start, end)
                if into is None:
                    out.append(data)
                else:
                    into[start:end] = data
                if update is not None:
                    update(end - start)
        return out

    def read_all(self) -> memoryview:
        """The whole file in one fresh buffer, its chunks fetched concurrently (with a
        progress bar on a terminal): memory is the file size plus a few chunks."""
        if self._whole is not None:
            return memoryview(self._whole)
        import numpy as np  # here, not at import: the CLI starts without numpy

        view = np.empty(self.size, np.uint8).data.cast("B")
        spans = [(s, min(self.size, s + CHUNK_BYTES)) for s in range(0, self.size, CHUNK_BYTES)]
        with progress_bar(self.size, "download", enabled=len(spans) > 1) as update:
            self._fetch_concurrently(spans, view, update)
        return view

    def gather(self, offsets: Sequence[int], lengths: Sequence[int]) -> bytes | None:
        """None: :meth:`pread_many` is how a remote source reads many ranges."""
        return None

    def detached(self) -> RemoteSource:
        """This source: reads stay possible after :meth:`close`."""
        return self

    def close(self) -> None:
        """Drop the cache (the filesystem object is fsspec's, cached and shared)."""
        with self._lock:
            self._cache.clear()
            self._cached = 0


def _coalesce(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, n)`` ranges as sorted ``[start, end)`` spans, neighbours merged.

    Examples
    --------
    >>> _coalesce([(100, 10), (0, 10), (1 << 20, 4)])
    [(0, 110), (1048576, 1048580)]
    """
    spans: list[tuple[int, int]] = []
    for offset, n in sorted(ranges):
        if spans and offset - spans[-1][1] < COALESCE_GAP_BYTES:
            spans[-1] = (spans[-1][0], max(spans[-1][1], offset + n))
        else:
            spans.append((offset, offset + n))
    return spans


def local_path(f: object) -> object:
    """``f``, with a ``file://`` URL turned into its local path."""
    if url_scheme(f) == "file":
        from urllib.parse import unquote, urlparse

        return unquote(urlparse(str(f)).path)
    return f


def open_any(f: FileLike, *, storage_options: Mapping[str, Any] | None = None,
             mmap: bool = False, access: str = "private", lazy: bool = False,
             limits: Limits = DEFAULT_LIMITS) -> Source:
    """:func:`ptfile._io.local.open_source`, for URLs too: a URL is a :class:`RemoteSource`
    when ``lazy`` (metadata work: only the bytes asked for are fetched), else its
    whole file is fetched concurrently into memory.  ``mmap`` applies to local files,
    ``storage_options`` to URLs.

    Raises
    ------
    RemoteError
        The URL cannot be read (not found, forbidden, failing).
    UnsupportedFeatureError
        fsspec or the backend the URL needs is not installed.
    """
    if is_url(f):
        remote = RemoteSource(str(f), storage_options, limits=limits)
        if lazy:
            return remote
        return BytesSource(remote.read_all(), name=remote.name)
    # storage_options apply to URLs only: a local path (a shell loop over mixed inputs with
    # one --storage-option) opens as it is.
    return open_source(local_path(f), mmap=mmap, access=access, lazy=lazy)  # type: ignore[arg-type]


@contextlib.contextmanager
def open_target(url: str, storage_options: StorageOptions = None) -> Iterator[IO[bytes]]:
    """A writable file at ``url``: complete on success, discarded (never left partial)
    when the block raises.  Object stores (S3, GCS) only show the object once it is
    complete.

    Raises
    ------
    UnsupportedFeatureError
        The backend cannot write (``https://``), or is not installed.
    RemoteError
        The backend refused the write.
    """
    fs, path = filesystem(url, storage_options)
    try:
        fp = fs.open(path, "wb")
    except NotImplementedError:
        raise UnsupportedFeatureError(f"{url_scheme(url)}:// URLs cannot be written") from None
    except Exception as exc:
        raise _remote_error(url, "the target", exc) from exc
    try:
        yield fp
    except BaseException:
        discard = getattr(fp, "discard", None)
        with contextlib.suppress(Exception):
            if callable(discard):
                discard()
            else:
                fp.close()
                fs.rm(path)
        raise
    try:
        fp.close()
    except Exception as exc:
        raise _remote_error(url, "the target", exc) from exc
