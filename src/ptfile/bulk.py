"""Thousands of checkpoints: scan, inspect, verify and convert in bulk, locally or on Dask.

Inputs
------
:func:`expand` turns inputs into a sorted, deduplicated list of files:

* a **glob** (``*``, ``?``, ``[``; ``**`` crosses folders), local or any fsspec
  URL (``s3://bucket/models/**/*.bin``, ``hf://user/repo/*.bin``): every file it
  matches, whatever its name (the pattern is the caller's choice);
* a **directory**, local, or a URL **prefix** (a URL ending in ``/``, or one
  without a checkpoint suffix that fsspec says is a directory; never probed for
  ``http(s)://``): walked recursively, keeping the files whose suffix is one of
  :data:`CHECKPOINT_SUFFIXES` (the names the formats ptfile reads are saved
  under), skipping hidden folders (``.git``, ``.cache``);
* a distributed checkpoint (a folder holding ``.metadata``) is one input, never
  walked into;
* anything else (a file, a URL, a path that does not exist) is itself: a
  missing file gives an error record, not silence.

Results
-------
Each function yields one **record** per file, as it finishes (unordered;
:func:`ordered` sorts them): a JSON-able dict with ``url``, ``command``,
``verdict``, ``ok``, ``exit_code``, ``error`` (``{"type", "message"}`` or None),
``seconds``, ``attempts``, ``bytes_fetched`` and ``requests`` (range reads of
URLs; None for local files) and ``result`` (the command's own report).  One bad
file never stops the run: a ptfile error, an I/O error, and even a stray
exception (a ptfile bug: its type is kept) become that file's error record.
Transient I/O errors (a connection error, a 5xx, a short body; not a 404 or a
403) are retried :data:`RETRIES` times with exponential backoff, on top of the
range reader's own retries.  :func:`summarize` gives the closing record.

Exit codes and verdicts
-----------------------
=========  ===========================================  ====  ===============
command    verdict                                      code  constant
=========  ===========================================  ====  ===============
scan       ``allowed`` (clean)                          0     EXIT_OK
scan       ``dangerous``                                1     EXIT_UNSAFE
scan       ``unknown`` (0 with ``allow_unknown``)       3     EXIT_UNKNOWN
verify     ``ok`` / ``damaged``                         0/1   EXIT_INVALID
inspect    ``ok``                                       0
convert    ``converted`` / ``skipped`` (output exists)  0
any        ``error`` (could not read, write, scan)      2     EXIT_ERROR
=========  ===========================================  ====  ===============

Over many files the worst code wins, in the order of :data:`WORST_FIRST`: a
failed check (1: dangerous, damaged) before an error (2) before unknown globals
(3) before 0 — the order ``ptfile scan`` has always used over several files.

Execution
---------
* ``client=`` a ``distributed.Client``: each file is one task
  (``client.submit(..., pure=False, retries=...)``), at most
  :data:`DASK_WINDOW_PER_THREAD` tasks per worker thread in flight, results
  streamed back as they finish (``as_completed``).  A task holds one file's
  metadata (scan, inspect: range reads, a cache of at most 16 MiB), one record
  at a time (verify) or one file's tensors (convert), all under ``limits``.  A
  worker that dies loses nothing: the scheduler runs its tasks again elsewhere.
  Dask is imported only then (``pip install 'ptfile[dask]'``).
* otherwise a local pool (``pool="auto"``): **threads** when any input is a URL
  (the work waits on the network; :data:`THREADS` by default), **processes**
  when every input is local (parsing pickles and CRCs is CPU work that holds the
  GIL; one per core by default, started by ``forkserver``: no fork of a process
  that already runs fsspec's I/O thread), nothing when there is one file or one
  worker; small local runs (under :data:`PROCESS_MIN_FILES` files and
  :data:`PROCESS_MIN_BYTES` bytes) use threads, as starting processes would cost
  more than it saves.  ``pool="thread" | "process" | "serial"`` decides.

Bulk convert
------------
Each output goes beside its input (``model.bin`` → ``model.safetensors``) or,
with ``out_prefix``, under it, at the path relative to the input that named it
(a directory or prefix, a glob's folder before its first wildcard, a file's
folder): ``convert("s3://b/zoo/", "out/")`` writes ``out/bert/model.safetensors``
for ``s3://b/zoo/bert/model.bin``.  Outputs appear whole or not at all: a local output is
written in a temporary folder beside it and renamed into place; a URL output is
uploaded once written (object stores show an object only once complete).  So an
existing output is a complete one, and a rerun skips it (``skipped``): bulk
conversion resumes where it stopped.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import glob as globbing
import itertools
import multiprocessing
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from ._io import is_url, url_scheme
from ._remote import StorageOptions, filesystem, watched_sources
from .errors import PtfileError, RemoteError, UnsupportedFeatureError
from .limits import Limits

__all__ = ["CHECKPOINT_SUFFIXES", "EXIT_ERROR", "EXIT_INVALID", "EXIT_OK", "EXIT_UNKNOWN",
           "EXIT_UNSAFE", "WORST_FIRST", "Record", "convert", "expand", "expands", "inspect",
           "ordered", "output_for", "require_dask", "run_one", "scan", "summarize", "verify", "worst"]

EXIT_OK: Final = 0
#: ``scan`` found something dangerous.
EXIT_UNSAFE: Final = 1
#: ``verify`` found damage (same value as EXIT_UNSAFE: "the check failed").
EXIT_INVALID: Final = 1
#: The command could not do its work: unreadable or unsupported input.
EXIT_ERROR: Final = 2
#: ``scan``: nothing dangerous, but names on no allowlist.
EXIT_UNKNOWN: Final = 3
#: Which code wins over several files, worst first (then EXIT_OK).
WORST_FIRST: Final = (EXIT_UNSAFE, EXIT_ERROR, EXIT_UNKNOWN)
#: ``scan``'s code per verdict.
SCAN_CODES: Final = {"allowed": EXIT_OK, "dangerous": EXIT_UNSAFE, "unknown": EXIT_UNKNOWN}

#: File names a directory walk keeps: what the formats ptfile reads are saved under by
#: torch.save, torch.jit.save, torch.export.save and pickle (.bin: Hugging Face; .ckpt:
#: Lightning; .tar: pre-0.4).  Not .safetensors: no pickle to scan, and bulk convert's
#: own outputs.
CHECKPOINT_SUFFIXES: Final = frozenset({".pt", ".pth", ".bin", ".ckpt", ".pt2", ".tar",
                                        ".pkl", ".pickle"})
#: The file that marks a distributed checkpoint's folder.
DCP_MARKER: Final = ".metadata"
#: Schemes whose URLs have no folders to probe (a probe would be a GET of the page).
_FLAT_SCHEMES: Final = frozenset({"http", "https"})
#: The output suffix per conversion kind.
OUTPUT_SUFFIXES: Final = {"safetensors": ".safetensors", "npz": ".npz", "pt": ".pt"}

#: Attempts after the first for a transient I/O error, and the first wait (doubled each time).
RETRIES: Final = 2
BACKOFF_SECONDS: Final = 0.2
#: Threads of the local pool for URLs.
THREADS: Final = 16
#: Local-pool tasks in flight per worker, and Dask tasks per worker thread: enough to keep
#: everyone busy, few enough that millions of inputs never become millions of futures.
WINDOW_PER_WORKER: Final = 4
DASK_WINDOW_PER_THREAD: Final = 8

Record: TypeAlias = dict[str, Any]
Command: TypeAlias = Literal["scan", "inspect", "verify", "convert"]
Pool: TypeAlias = Literal["auto", "thread", "process", "serial"]


# --------------------------------------------------------------------------- inputs


def _has_magic(text: str) -> bool:
    return any(c in text for c in "*?[")


def _suffix(name: str) -> str:
    return os.path.splitext(name.rstrip("/"))[1].lower()


def _is_dcp_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, DCP_MARKER))


def _walk_local(root: str) -> list[str]:
    if _is_dcp_dir(root):
        return [root]
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for d in [d for d in dirs if _is_dcp_dir(os.path.join(folder, d))]:
            found.append(os.path.join(folder, d))
            dirs.remove(d)
        found += [os.path.join(folder, f) for f in files if _suffix(f) in CHECKPOINT_SUFFIXES]
    return found


def _expand_local(item: str) -> list[str]:
    if _has_magic(item):
        return [p for p in globbing.glob(item, recursive=True) if os.path.isfile(p)]
    if os.path.isdir(item):
        return _walk_local(item)
    return [os.path.normpath(item)]


def _walk_remote(fs: Any, path: str) -> list[str]:
    files = [p for p, info in fs.find(path, detail=True).items() if info.get("type") != "directory"]
    dcp = {p.rpartition("/")[0] for p in files if p.rpartition("/")[2] == DCP_MARKER}
    kept = [p for p in files if _suffix(p) in CHECKPOINT_SUFFIXES and not _hidden(p, path)
            and not any(p.startswith(d + "/") for d in dcp)]
    return kept + sorted(dcp)


def _hidden(path: str, root: str) -> bool:
    """True when a folder between ``root`` and ``path`` is hidden (``.git``, ``.cache``)."""
    return any(part.startswith(".") for part in path[len(root):].split("/")[:-1])


def _expand_url(item: str, storage_options: StorageOptions) -> list[str]:
    fs, path = filesystem(item, storage_options)
    try:
        if _has_magic(path):
            matched = fs.glob(path, detail=True)
            paths = [p for p, info in matched.items() if info.get("type") != "directory"]
        elif url_scheme(item) not in _FLAT_SCHEMES and (
                item.endswith("/") or _suffix(path) not in CHECKPOINT_SUFFIXES) \
                and fs.isdir(path):
            paths = _walk_remote(fs, path.rstrip("/"))
        else:
            return [item]
    except (OSError, ValueError) as exc:  # fsspec's listing errors: not found, denied, bad bucket
        raise RemoteError(f"{item}: cannot list: {type(exc).__name__}: {exc}", url=item) from exc
    return [fs.unstrip_protocol(p) for p in paths]


def expand(inputs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
           storage_options: StorageOptions = None) -> list[str]:
    """The files that ``inputs`` name (globs, directories, URL prefixes expanded), sorted
    and without duplicates.

    Raises
    ------
    RemoteError
        A URL pattern or prefix cannot be listed.
    UnsupportedFeatureError
        fsspec, or the backend a URL needs, is not installed.

    Examples
    --------
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> for name in ("a.pt", "sub/b.bin", "sub/notes.txt", ".git/c.pt"):
    ...     os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    ...     open(os.path.join(root, name), "wb").close()
    >>> [os.path.relpath(p, root) for p in expand([root, os.path.join(root, "*.pt")])]
    ['a.pt', 'sub/b.bin']
    """
    found: set[str] = set()
    for item in _items(inputs):
        found.update(_expand_url(item, storage_options) if is_url(item) else
                     _expand_local(item))
    return sorted(found)


def expands(item: str) -> bool:
    """True when ``item`` stands for files it does not name (a glob, a directory, a URL
    prefix ending in ``/``): the command line then reports in JSON Lines.

    Examples
    --------
    >>> expands("models/*.pt"), expands("s3://bucket/models/"), expands("model.pt")
    (True, True, False)
    """
    if _has_magic(item) or (is_url(item) and item.endswith("/")):
        return True
    return not is_url(item) and os.path.isdir(item) and not _is_dcp_dir(item)


# --------------------------------------------------------------------------- one file


@dataclass(frozen=True)
class _Options:
    """What every task of one run shares (sent to processes and Dask workers)."""

    storage_options: Mapping[str, Any] | None = None
    limits: Limits | None = None
    retries: int = RETRIES
    backoff: float = BACKOFF_SECONDS
    allow_unknown: bool = False
    structural: bool = False
    full: bool = False
    fmt: str = "safetensors"
    shared: str = "dedupe"
    extra: dict[str, Any] = field(default_factory=dict)


def _scan(url: str, o: _Options, _target: str | None) -> tuple[str, int, dict[str, Any]]:
    from .scanning import scan as scan_one

    result = scan_one(url, limits=o.limits, storage_options=o.storage_options).to_dict()
    code = SCAN_CODES[result["verdict"]]
    code = EXIT_OK if code == EXIT_UNKNOWN and o.allow_unknown else code
    return result["verdict"], code, result


def _inspect(url: str, o: _Options, _target: str | None) -> tuple[str, int, dict[str, Any]]:
    from .inspection import inspect as inspect_one

    ins = inspect_one(url, limits=o.limits, storage_options=o.storage_options,
                      structural=o.structural)
    if o.full:
        return "ok", EXIT_OK, ins.to_dict()
    return "ok", EXIT_OK, {"format": ins.format, "file_size": ins.file_size,
                           "metadata": ins.metadata, "totals": ins.totals}


def _verify(url: str, o: _Options, _target: str | None) -> tuple[str, int, dict[str, Any]]:
    from .inspection import verify as verify_one

    report = verify_one(url, limits=o.limits, storage_options=o.storage_options)
    verdict, code = ("ok", EXIT_OK) if report.ok else ("damaged", EXIT_INVALID)
    return verdict, code, report.to_dict()


def _convert(url: str, o: _Options, target: str | None) -> tuple[str, int, dict[str, Any]]:
    if target is None:
        raise UnsupportedFeatureError(f"{url}: already {o.fmt}; nothing to convert")
    if _exists(target, o.storage_options):
        return "skipped", EXIT_OK, {"output": target}
    with _atomic_output(target) as staged:
        summary = _convert_one(url, staged, o)
    return "converted", EXIT_OK, {**summary, "output": target}


def _convert_one(url: str, target: str, o: _Options) -> dict[str, Any]:
    from .export.convert import convert as convert_one

    summary = convert_one(url, target, to=o.fmt, shared=o.shared,  # type: ignore[arg-type]
                          storage_options=o.storage_options, structural=o.structural)
    return {k: summary[k] for k in ("kind", "tensors", "aliases")}


def _exists(target: str, storage_options: StorageOptions) -> bool:
    if not is_url(target):
        return os.path.exists(target)
    fs, path = filesystem(target, storage_options)
    return bool(fs.exists(path))


@contextlib.contextmanager
def _atomic_output(target: str) -> Iterator[str]:
    """Where to write ``target``: a URL as it is (uploaded once written), a local path in
    a temporary folder beside it, renamed into place on success and removed on failure."""
    if is_url(target):
        yield target
        return
    folder = os.path.dirname(os.path.abspath(target))
    os.makedirs(folder, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".ptfile-", dir=folder)
    try:
        staged = os.path.join(staging, os.path.basename(target))  # same stem: the archive name
        yield staged
        os.replace(staged, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


_COMMANDS: Final[dict[str, Callable[[str, _Options, str | None],
                                     tuple[str, int, dict[str, Any]]]]] = {
    "scan": _scan, "inspect": _inspect, "verify": _verify, "convert": _convert}

#: Errors a retry never cures.
_PERMANENT: Final = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def _is_transient(exc: BaseException) -> bool:
    """A failure worth another attempt: connection trouble, a 5xx/429/408, a short body."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, RemoteError):
        return exc.status is None or exc.status >= 500 or exc.status in (408, 429)
    return isinstance(exc, (OSError, TimeoutError)) and not isinstance(exc, PtfileError)


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def run_one(command: str, url: str, options: _Options, target: str | None = None) -> Record:
    """One file's record: the command run with retries on transient errors; never raises
    for the file's sake (a task of the local pool or of Dask)."""
    record: Record = {"url": url, "command": command}
    start = time.perf_counter()
    for attempt in range(options.retries + 1):
        sources: list[Any] = []
        token = watched_sources.set(sources)
        try:
            verdict, code, result = _COMMANDS[command](url, options, target)
            record.update(verdict=verdict, exit_code=code, error=None, result=result)
            break
        except Exception as exc:  # noqa: BLE001 - one bad file never stops the run: its record
            record.update(verdict="error", exit_code=EXIT_ERROR, error=_error(exc), result=None)
            if attempt == options.retries or not _is_transient(exc):
                break
        finally:
            watched_sources.reset(token)
        time.sleep(options.backoff * 2**attempt)
    record.update(ok=record["exit_code"] == EXIT_OK, attempts=attempt + 1,
                  seconds=round(time.perf_counter() - start, 6),
                  bytes_fetched=sum(s.bytes_fetched for s in sources) if is_url(url) else None,
                  requests=sum(s.requests for s in sources) if is_url(url) else None)
    return record


# --------------------------------------------------------------------------- running


Job: TypeAlias = tuple[str, str, _Options, "str | None"]


#: Local work big enough to pay for starting processes (about a second on a busy machine):
#: this many files, or this many bytes in all.
PROCESS_MIN_FILES: Final = 500
PROCESS_MIN_BYTES: Final = 1 << 30


def _local_bytes(jobs: Sequence[Job]) -> int:
    total = 0
    for job in jobs:
        with contextlib.suppress(OSError):
            total += os.path.getsize(job[1])
    return total


def _pool_kind(pool: Pool, jobs: Sequence[Job], workers: int | None) -> str:
    """``auto``: nothing for one file or one worker; threads for URLs and for small local
    runs; processes for local runs of :data:`PROCESS_MIN_FILES` files or
    :data:`PROCESS_MIN_BYTES` bytes."""
    if pool != "auto":
        return pool
    if len(jobs) <= 1 or workers == 1:
        return "serial"
    if any(is_url(job[1]) for job in jobs):
        return "thread"
    big = len(jobs) >= PROCESS_MIN_FILES or _local_bytes(jobs) >= PROCESS_MIN_BYTES
    return "process" if big else "thread"


def _executor(kind: str, workers: int | None) -> cf.Executor:
    if kind == "thread":
        return cf.ThreadPoolExecutor(workers or THREADS, thread_name_prefix="ptfile-bulk")
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return cf.ProcessPoolExecutor(workers or os.cpu_count() or 1,
                                  mp_context=multiprocessing.get_context(method))


def _on_pool(jobs: Sequence[Job], kind: str, workers: int | None) -> Iterator[Record]:
    if kind == "serial":
        for job in jobs:
            yield run_one(*job)
        return
    with _executor(kind, workers) as pool:
        window = WINDOW_PER_WORKER * (getattr(pool, "_max_workers", None) or 1)
        pending = iter(jobs)
        running = {pool.submit(run_one, *job): job for job in _take(pending, window)}
        while running:
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in done:
                job = running.pop(future)
                yield _result_of(future, job)
            running.update({pool.submit(run_one, *job): job for job in _take(pending, len(done))})


def _take(jobs: Iterator[Job], n: int) -> list[Job]:
    return list(itertools.islice(jobs, n))


def _result_of(future: cf.Future[Record], job: Job) -> Record:
    """The future's record, or an error record when the pool itself failed (a process
    that died: its exception is the file's error)."""
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - the pool's failure is the file's record
        return _failed(job, exc)


def _failed(job: Job, exc: BaseException) -> Record:
    command, url = job[0], job[1]
    return {"url": url, "command": command, "verdict": "error", "exit_code": EXIT_ERROR,
            "error": _error(exc), "result": None, "ok": False, "attempts": 1, "seconds": 0.0,
            "bytes_fetched": None, "requests": None}


def require_dask() -> Any:
    """The ``distributed`` module, or an error naming the extra that installs it."""
    try:
        import distributed  # type: ignore[import-untyped,unused-ignore]  # the dask extra
    except ImportError:
        raise UnsupportedFeatureError("running on Dask needs dask[distributed]: "
                                      "pip install 'ptfile[dask]'") from None
    return distributed


def _on_dask(client: Any, jobs: Sequence[Job], retries: int) -> Iterator[Record]:
    distributed = require_dask()
    threads = sum(client.nthreads().values()) or 1
    run = uuid.uuid4().hex[:8]
    pending = iter(enumerate(jobs))
    by_key: dict[str, Job] = {}

    def submit(n: int) -> list[Any]:
        futures = []
        for i, job in itertools.islice(pending, n):
            future = client.submit(run_one, *job, pure=False, retries=retries,
                                   key=f"ptfile-{job[0]}-{run}-{i}")
            by_key[future.key] = job
            futures.append(future)
        return futures

    stream = distributed.as_completed(submit(DASK_WINDOW_PER_THREAD * threads))
    for future in stream:
        yield _dask_result(future, by_key.pop(future.key))
        future.release()
        for more in submit(1):
            stream.add(more)


#: Fetches of one finished task's record: a result held by a worker that then died is
#: computed again by the scheduler, and the next fetch waits for it.
_DASK_FETCHES: Final = 3


def _dask_result(future: Any, job: Job) -> Record:
    for attempt in range(_DASK_FETCHES):
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - the task failed (KilledWorker) or was lost
            if future.status == "error" or attempt == _DASK_FETCHES - 1:
                return _failed(job, exc)
            continue
        if isinstance(result, dict):
            return result
    return _failed(job, RuntimeError("no record came back"))


def _run(command: Command, inputs: Any, options: _Options, *, client: Any, workers: int | None,
         pool: Pool,
         targets: Callable[[list[str]], tuple[list[str], list[str | None]]] | None = None
         ) -> Iterator[Record]:
    urls = expand(inputs, options.storage_options)
    outputs: list[str | None] = [None] * len(urls)
    if targets is not None:
        urls, outputs = targets(urls)
    jobs = [(command, url, options, out) for url, out in zip(urls, outputs, strict=True)]
    if client is not None:
        yield from _on_dask(client, jobs, options.retries)
    else:
        yield from _on_pool(jobs, _pool_kind(pool, jobs, workers), workers)


# --------------------------------------------------------------------------- the front doors

_COMMON_DOC: Final = """
    Parameters
    ----------
    urls
        Paths, URLs, globs, directories and URL prefixes (:func:`expand`).
    client
        A ``distributed.Client``: one Dask task per file.  None: the local pool.
    workers
        Threads or processes of the local pool (None: :data:`THREADS` threads, or
        one process per core).
    pool
        ``auto`` (threads for URLs, processes for local files), ``thread``,
        ``process`` or ``serial``.
    storage_options
        fsspec's options for URL inputs (and outputs).
    limits
        Ceilings for each file.
    retries
        Attempts after the first on a transient I/O error (and Dask's task retries).

    Yields
    ------
    dict
        One record per file, as it finishes (see the module's docstring).

    Raises
    ------
    RemoteError
        A pattern or prefix cannot be listed (a file's own failures are records).
    UnsupportedFeatureError
        ``client`` without dask installed; fsspec or a backend missing for a URL.
"""


def _front_door(func: Callable[..., Iterator[Record]]) -> Callable[..., Iterator[Record]]:
    func.__doc__ = (func.__doc__ or "").replace("    (parameters)\n", _COMMON_DOC)
    return func


@_front_door
def scan(urls: Any, *, client: Any = None, workers: int | None = None, pool: Pool = "auto",
         storage_options: StorageOptions = None, limits: Limits | None = None,
         retries: int = RETRIES, allow_unknown: bool = False) -> Iterator[Record]:
    """Scan every file (:func:`ptfile.scan`): ``verdict`` is allowed, dangerous, unknown
    or error; ``allow_unknown`` makes unknown's code 0.
    (parameters)
    Examples
    --------
    >>> import os, tempfile, numpy as np, ptfile, ptfile.bulk
    >>> root = tempfile.mkdtemp()
    >>> ptfile.save({"w": np.ones(2, "float32")}, os.path.join(root, "a.pt"))
    >>> with open(os.path.join(root, "b.pt"), "wb") as fp:
    ...     _ = fp.write(b"\\x80\\x02cposix\\nsystem\\nX\\x02\\x00\\x00\\x00hi\\x85R.")
    >>> [(os.path.basename(r["url"]), r["verdict"], r["exit_code"])
    ...  for r in ptfile.bulk.ordered(ptfile.bulk.scan(root, pool="serial"))]
    [('a.pt', 'allowed', 0), ('b.pt', 'dangerous', 1)]
    """
    options = _Options(storage_options, limits, retries, allow_unknown=allow_unknown)
    return _run("scan", urls, options, client=client, workers=workers, pool=pool)


@_front_door
def inspect(urls: Any, *, client: Any = None, workers: int | None = None, pool: Pool = "auto",
            storage_options: StorageOptions = None, limits: Limits | None = None,
            retries: int = RETRIES, structural: bool = False,
            full: bool = False) -> Iterator[Record]:
    """Inspect every file (:func:`ptfile.inspect`): ``result`` holds its format, size,
    metadata and totals (``full``: the whole inspection, every tensor).
    (parameters)
    Examples
    --------
    >>> import os, tempfile, numpy as np, ptfile, ptfile.bulk
    >>> root = tempfile.mkdtemp()
    >>> ptfile.save({"w": np.ones(3, "float32")}, os.path.join(root, "a.pt"))
    >>> [r["result"]["totals"]["parameters"] for r in ptfile.bulk.inspect(root)]
    [3]
    """
    options = _Options(storage_options, limits, retries, structural=structural, full=full)
    return _run("inspect", urls, options, client=client, workers=workers, pool=pool)


@_front_door
def verify(urls: Any, *, client: Any = None, workers: int | None = None, pool: Pool = "auto",
           storage_options: StorageOptions = None, limits: Limits | None = None,
           retries: int = RETRIES) -> Iterator[Record]:
    """Verify every file (:func:`ptfile.inspection.verify`): ``verdict`` ok, damaged or
    error; ``result`` is the report.
    (parameters)
    Examples
    --------
    >>> import os, tempfile, numpy as np, ptfile, ptfile.bulk
    >>> root = tempfile.mkdtemp()
    >>> ptfile.save({"w": np.ones(3, "float32")}, os.path.join(root, "a.pt"))
    >>> [r["verdict"] for r in ptfile.bulk.verify(root)]
    ['ok']
    """
    options = _Options(storage_options, limits, retries)
    return _run("verify", urls, options, client=client, workers=workers, pool=pool)


@_front_door
def convert(urls: Any, out_prefix: str | None = None, fmt: str = "safetensors", *,
            client: Any = None, workers: int | None = None, pool: Pool = "auto",
            storage_options: StorageOptions = None, limits: Limits | None = None,
            retries: int = RETRIES, shared: str = "dedupe",
            structural: bool = False) -> Iterator[Record]:
    """Convert every file to ``fmt`` (``safetensors``, ``npz`` or ``pt``), beside it or
    under ``out_prefix`` (:func:`output_for`; inputs under ``out_prefix`` are left out:
    they are earlier outputs); an existing output is ``skipped``.
    (parameters)
    Examples
    --------
    >>> import os, tempfile, numpy as np, ptfile, ptfile.bulk
    >>> root = tempfile.mkdtemp()
    >>> ptfile.save({"w": np.ones(3, "float32")}, os.path.join(root, "a.pt"))
    >>> [r["verdict"] for r in ptfile.bulk.convert(root)]
    ['converted']
    >>> [r["verdict"] for r in ptfile.bulk.convert(root + "/*.pt")]   # a rerun
    ['skipped']
    """
    if fmt not in OUTPUT_SUFFIXES:
        raise UnsupportedFeatureError(f"cannot convert to {fmt!r}: use one of "
                                      f"{', '.join(OUTPUT_SUFFIXES)}")
    options = _Options(storage_options, limits, retries, structural=structural, fmt=fmt,
                       shared=shared)
    items = _items(urls)
    return _run("convert", items, options, client=client, workers=workers, pool=pool,
                targets=lambda found: _outputs(found, items, out_prefix, fmt))


def _items(inputs: Any) -> list[str]:
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    return [str(os.fspath(i)) for i in items]


def _base(item: str) -> str:
    """The folder (in :func:`_key` form) an input's files are relative to: the directory
    or prefix itself, a glob's folder before its first wildcard, a file's folder."""
    key = _key(item)
    if _has_magic(key):
        return key[:min(key.index(c) for c in "*?[" if c in key)].rpartition("/")[0]
    folder = os.path.isdir(item) if not is_url(item) else \
        item.endswith("/") or _suffix(item) not in CHECKPOINT_SUFFIXES
    return key.rstrip("/") if folder else os.path.dirname(key)


def _outputs(urls: list[str], items: list[str], out_prefix: str | None,
             fmt: str) -> tuple[list[str], list[str | None]]:
    """The inputs to convert (less those under ``out_prefix``: earlier outputs) and the
    output of each: under ``out_prefix``, at its path relative to the input that named it
    (the inputs' common folder when none does)."""
    if out_prefix is None:
        return urls, [output_for(url, fmt) for url in urls]
    inside = _key(out_prefix).rstrip("/") + "/"
    urls = [url for url in urls if not _key(url).startswith(inside)]
    bases = sorted({_base(item) for item in items}, key=len, reverse=True)
    common = _common_folder(urls)
    roots = [next((b for b in bases if _key(url).startswith(b + "/")), common) for url in urls]
    return urls, [output_for(url, fmt, out_prefix, root) for url, root in zip(urls, roots,
                                                                             strict=True)]


def _key(url: str) -> str:
    """A URL or path as a path-like key: ``s3://b/k`` → ``s3/b/k``."""
    scheme = url_scheme(url)
    return url.replace("://", "/", 1) if scheme else os.path.abspath(url)


def _common_folder(urls: Sequence[str]) -> str:
    keys = [_key(u) for u in urls]
    if not keys:
        return ""
    common = os.path.commonpath(keys) if len({k.startswith("/") for k in keys}) == 1 else ""
    return common if len(keys) > 1 or common != keys[0] else os.path.dirname(common)


def output_for(url: str, fmt: str, out_prefix: str | None = None, root: str = "") -> str | None:
    """Where ``url`` converted to ``fmt`` goes: beside it, or under ``out_prefix`` at its
    path relative to ``root`` (a folder of :func:`_key` form); None when that is the
    input itself.

    Examples
    --------
    >>> output_for("s3://b/zoo/bert/model.bin", "safetensors")
    's3://b/zoo/bert/model.safetensors'
    >>> output_for("s3://b/zoo/bert/model.bin", "safetensors", "out/", "s3/b/zoo")
    'out/bert/model.safetensors'
    """
    suffix = OUTPUT_SUFFIXES[fmt]
    stem, old = os.path.splitext(url)
    if out_prefix is None:
        return None if old.lower() == suffix else stem + suffix
    relative = os.path.relpath(os.path.splitext(_key(url))[0], root or "/") + suffix
    return out_prefix.rstrip("/") + "/" + relative.replace(os.sep, "/")


# --------------------------------------------------------------------------- results


def worst(codes: Iterable[int]) -> int:
    """The exit code that wins over several files (:data:`WORST_FIRST`, then 0).

    Examples
    --------
    >>> worst([0, 3, 2]), worst([2, 1]), worst([])
    (2, 1, 0)
    """
    return min(set(codes) - {EXIT_OK}, key=WORST_FIRST.index, default=EXIT_OK)


def ordered(records: Iterable[Record]) -> list[Record]:
    """The records in the inputs' order (sorted by URL), for a stable report."""
    return sorted(records, key=lambda r: str(r["url"]))


def summarize(records: Sequence[Record], seconds: float | None = None) -> Record:
    """The closing record: files, verdict counts, the aggregated exit code, bytes fetched
    and, given the run's ``seconds``, files per second.

    Examples
    --------
    >>> summarize([{"command": "scan", "verdict": "allowed", "exit_code": 0,
    ...             "bytes_fetched": 10}])["exit_code"]
    0
    """
    fetched = [r["bytes_fetched"] for r in records if r.get("bytes_fetched") is not None]
    doc: Record = {"summary": True, "command": records[0]["command"] if records else None,
                   "files": len(records), "verdicts": dict(Counter(r["verdict"] for r in records)),
                   "exit_code": worst(r["exit_code"] for r in records),
                   "bytes_fetched": sum(fetched) if fetched else None}
    if seconds is not None:
        doc.update(seconds=round(seconds, 3),
                   files_per_second=round(len(records) / seconds, 1) if seconds > 0 else None)
    return doc

