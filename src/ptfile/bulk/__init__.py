"""Thousands of checkpoints: scan, inspect, verify and convert in bulk, locally or on Dask.

``inputs``     :func:`expand`: which files the inputs name; where each converted file goes.
``tasks``      :func:`run_one`: one file's work, retries, its record; the exit codes.
``execution``  The local pool (threads or processes) and Dask: streaming, bounded windows.

Inputs
------
:func:`expand` turns inputs into a sorted, deduplicated list of files:

* a **glob** (``*``, ``?``, ``[``; ``**`` crosses folders), local or any fsspec
  URL (``s3://bucket/models/**/*.bin``, ``hf://user/repo/*.bin``): every file it
  matches, whatever its name (the pattern is the caller's choice);
* a **directory**, local, or a URL **prefix** (a URL ending in ``/``, or one
  without a checkpoint suffix that fsspec says is a directory; never probed for
  ``http(s)://``): walked recursively as torch sees it
  (:func:`ptfile.formats.walk.walk_tree`): every regular file, dot-folders and links
  included, kept when its suffix is one of :data:`CHECKPOINT_SUFFIXES` or one of torch's
  loaders reads its first bytes (ZIP, legacy stream, tar, a pickle that reaches code),
  skipped otherwise (:func:`walk` lists them); ``exclude`` globs leave paths out;
* a checkpoint folder (a DCP folder of either writer, a sharded model, a trainer
  folder) is one input; :func:`scan` also walks its strays and subfolders, each an
  input of its own, while :func:`inspect`, :func:`verify` and :func:`convert` do not
  enter it;
* anything else (a file, a URL, a path that does not exist) is itself: a
  missing file gives an error record, not silence.

Results
-------
Each function yields one **record** per file, as it finishes (unordered;
:func:`ordered` sorts them): a JSON-able dict with ``path`` (the file or URL), ``command``,
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
Each record's ``verdict`` (``scan``: allowed, dangerous, unknown; ``verify``: ok,
damaged; ``inspect``: ok; ``convert``: converted, skipped; any: ``error``) and its
``exit_code`` are :mod:`ptfile.outcomes`' (:func:`ptfile.outcomes.exit_code`, the
table there); over many files the worst code wins (:func:`worst`, from
:mod:`ptfile.outcomes`): a failed check (1: dangerous, damaged) before an error (2)
before unknown globals (3) before 0 — the order ``ptfile scan`` has always used
over several files.

Execution
---------
* ``client=`` a ``distributed.Client``: each file is one task
  (``client.submit(..., pure=False, retries=...)``), at most
  :data:`DASK_WINDOW_PER_THREAD` tasks per worker thread in flight, results
  streamed back as they finish (``as_completed``).  A task holds one file's
  metadata (scan, inspect: range reads, a cache of at most 16 MiB), one record
  at a time (verify) or one file's tensors (convert), all under ``limits``.  A
  worker that dies loses nothing: the scheduler runs its tasks again elsewhere.
  Dask is imported only then (ptfile's ``dask`` extra).
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
conversion resumes where it stopped.  A ``converted`` record's ``result`` has the
conversion's ``kind``, ``tensors``, ``aliases``, ``dropped`` and ``changed``
(:mod:`ptfile.export.convert`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from .._io.remote import StorageOptions
from ..errors import UnsupportedFeatureError
from ..limits import Limits
from ..outcomes import (
    EXIT_ERROR,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_UNKNOWN,
    EXIT_UNSAFE,
    RETRIES,
    SCAN_CODES,
    WORST_FIRST,
    worst,
)

if TYPE_CHECKING:
    from ..scanning.allowing import AllowList
from .execution import (
    PROCESS_MIN_BYTES,
    PROCESS_MIN_FILES,
    THREADS,
    Pool,
    local_cluster,
    require_dask,
    run,
)
from .inputs import (
    CHECKPOINT_SUFFIXES,
    OUTPUT_SUFFIXES,
    Expansion,
    as_items,
    expand,
    expands,
    output_for,
    outputs,
    walk,
)
from .tasks import Options, Record, run_one

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "EXIT_ERROR",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_UNKNOWN",
    "EXIT_UNSAFE",
    "PROCESS_MIN_BYTES",
    "PROCESS_MIN_FILES",
    "RETRIES",
    "SCAN_CODES",
    "THREADS",
    "WORST_FIRST",
    "Expansion",
    "Record",
    "convert",
    "expand",
    "expands",
    "inspect",
    "local_cluster",
    "ordered",
    "output_for",
    "require_dask",
    "run_one",
    "scan",
    "summarize",
    "verify",
    "walk",
    "worst",
]

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
    exclude
        Globs of paths the walks leave out (``.git``, ``data/*``).

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
         retries: int = RETRIES, allow_unknown: bool = False,
         exclude: Sequence[str] = (), allow: AllowList | None = None
         ) -> Iterator[Record]:
    """Scan every file (:func:`ptfile.scan`): ``verdict`` is allowed, dangerous, unknown
    or error; ``allow_unknown`` makes unknown's code 0; ``allow``
    (:class:`ptfile.scanning.allowing.AllowList`) counts the unknown globals it names as
    allowed (never a dangerous one).
    (parameters)
    Examples
    --------
    >>> import os, tempfile, numpy as np, ptfile, ptfile.bulk
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = tmp.name
    >>> ptfile.save({"w": np.ones(2, "float32")}, os.path.join(root, "a.pt"))
    >>> with open(os.path.join(root, "b.pt"), "wb") as fp:
    ...     _ = fp.write(b"\\x80\\x02cposix\\nsystem\\nX\\x02\\x00\\x00\\x00hi\\x85R.")
    >>> [(os.path.basename(r["path"]), r["verdict"], r["exit_code"])
    ...  for r in ptfile.bulk.ordered(ptfile.bulk.scan(root, pool="serial"))]
    [('a.pt', 'allowed', 0), ('b.pt', 'dangerous', 1)]
    >>> tmp.cleanup()
    """
    options = Options(storage_options, limits, retries, allow_unknown=allow_unknown,
                      exclude=tuple(exclude), allow=allow)
    return run("scan", urls, options, client=client, workers=workers, pool=pool)


@_front_door
def inspect(urls: Any, *, client: Any = None, workers: int | None = None, pool: Pool = "auto",
            storage_options: StorageOptions = None, limits: Limits | None = None,
            retries: int = RETRIES, structural: bool = False,
            full: bool = False, exclude: Sequence[str] = ()) -> Iterator[Record]:
    """Inspect every file (:func:`ptfile.inspect`): ``result`` holds its format, size,
    metadata and totals (``full``: the whole inspection, every tensor).
    (parameters)
    Examples
    --------
    >>> import os, tempfile, numpy as np, ptfile, ptfile.bulk
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = tmp.name
    >>> ptfile.save({"w": np.ones(3, "float32")}, os.path.join(root, "a.pt"))
    >>> [r["result"]["totals"]["parameters"] for r in ptfile.bulk.inspect(root)]
    [3]
    >>> tmp.cleanup()
    """
    options = Options(storage_options, limits, retries, structural=structural, full=full,
                      exclude=tuple(exclude))
    return run("inspect", urls, options, client=client, workers=workers, pool=pool)


@_front_door
def verify(urls: Any, *, client: Any = None, workers: int | None = None, pool: Pool = "auto",
           storage_options: StorageOptions = None, limits: Limits | None = None,
           retries: int = RETRIES, exclude: Sequence[str] = ()) -> Iterator[Record]:
    """Verify every file (:func:`ptfile.inspection.verify`): ``verdict`` ok, damaged or
    error; ``result`` is the report.
    (parameters)
    Examples
    --------
    >>> import os, tempfile, numpy as np, ptfile, ptfile.bulk
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = tmp.name
    >>> ptfile.save({"w": np.ones(3, "float32")}, os.path.join(root, "a.pt"))
    >>> [r["verdict"] for r in ptfile.bulk.verify(root)]
    ['ok']
    >>> tmp.cleanup()
    """
    options = Options(storage_options, limits, retries, exclude=tuple(exclude))
    return run("verify", urls, options, client=client, workers=workers, pool=pool)


@_front_door
def convert(urls: Any, out_prefix: str | None = None, fmt: str = "safetensors", *,
            client: Any = None, workers: int | None = None, pool: Pool = "auto",
            storage_options: StorageOptions = None, limits: Limits | None = None,
            retries: int = RETRIES, shared: str = "dedupe",
            structural: bool = False, npz_upcast: bool = False,
            exclude: Sequence[str] = ()) -> Iterator[Record]:
    """Convert every file to ``fmt`` (``safetensors``, ``npz`` or ``pt``), beside it or
    under ``out_prefix`` (:func:`output_for`; inputs under ``out_prefix`` are left out:
    they are earlier outputs); an existing output is ``skipped``.
    (parameters)
    Examples
    --------
    >>> import os, tempfile, numpy as np, ptfile, ptfile.bulk
    >>> tmp = tempfile.TemporaryDirectory()
    >>> root = tmp.name
    >>> ptfile.save({"w": np.ones(3, "float32")}, os.path.join(root, "a.pt"))
    >>> [r["verdict"] for r in ptfile.bulk.convert(root)]
    ['converted']
    >>> [r["verdict"] for r in ptfile.bulk.convert(root + "/*.pt")]   # a rerun
    ['skipped']
    >>> tmp.cleanup()
    """
    if fmt not in OUTPUT_SUFFIXES:
        raise UnsupportedFeatureError(f"cannot convert to {fmt!r}: use one of "
                                      f"{', '.join(OUTPUT_SUFFIXES)}")
    options = Options(storage_options, limits, retries, structural=structural, fmt=fmt,
                       shared=shared, extra={"npz_upcast": npz_upcast},
                       exclude=tuple(exclude))
    items = as_items(urls)
    return run("convert", items, options, client=client, workers=workers, pool=pool,
                targets=lambda found: outputs(found, items, out_prefix, fmt))


# --------------------------------------------------------------------------- results


def ordered(records: Iterable[Record]) -> list[Record]:
    """The records in the inputs' order (sorted by URL), for a stable report."""
    return sorted(records, key=lambda r: str(r["path"]))


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


