"""The command line over many files: ``ptfile scan|inspect|verify|convert`` in bulk.

A command runs in bulk when:

* ``--jsonl`` (``--format jsonl``), or a bulk option (``--workers``, ``--dask``,
  ``--scheduler``, ``--out-prefix``) is given, or
* an input is a glob, a directory or a URL prefix (ending in ``/``, or a URL
  without a checkpoint suffix that lists as a folder, ``hf://user/repo``):
  whatever it matches, even one file, so scripts get one shape; a folder that is one
  checkpoint (a DCP folder of either writer, a sharded model folder:
  :func:`ptfile.formats.detection.detect_input` decides) is one input, as for
  ``ptfile.open``; or
* ``inspect``/``verify`` get more than one input, ``convert`` gets one input
  or more than two (``convert IN OUT`` is one conversion, as before).

What a bulk run prints (:func:`output_format`):

===============================================  ========================================
given                                            prints
===============================================  ========================================
``--format text``                                a table for a person (:mod:`.report`):
                                                 each file's path, verdict and a short
                                                 reason, the totals, then the files that
                                                 need attention
``--format jsonl``, ``--jsonl``, ``--json``      JSON Lines: one record per file as each
(scan: ``--format json``)                        finishes, then a summary
                                                 (``"summary": true``)
``--format sarif`` (scan)                        one SARIF 2.1.0 log
none of these                                    the table when stdout is a terminal, else
                                                 JSON Lines (a pipe, a file: what a script
                                                 reads)
===============================================  ========================================

``scan`` over several named files keeps its report of one block per file (and
``--json``'s list); ``--jsonl`` makes it JSON Lines.  One file is reported
exactly as before.  The exit code is the worst one over the files
(:func:`ptfile.outcomes.worst`: a failed check, then an error, then unknown
globals), whatever is printed.  ``--dask`` starts a LocalCluster on 127.0.0.1
(``--workers`` processes, no dashboard); ``--scheduler tcp://host:port`` joins a
running cluster.  The progress bar (files done) goes to stderr on a terminal, or
always with ``--progress``; it needs tqdm.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final, TextIO

from .._io.paths import is_url
from .._io.progress import progress_bar
from ..errors import PtfileError
from ..formats.inputs import Input, InputKind
from ..outcomes import RETRIES
from .report import TextReport

if TYPE_CHECKING:
    from .. import bulk

__all__ = ["BULK_COMMANDS", "BULK_FORMATS", "add_arguments", "is_bulk", "output_format", "run",
           "single"]

#: The commands that take many inputs.
BULK_COMMANDS: Final = frozenset({"scan", "inspect", "verify", "convert"})
#: Each command's positional that holds its inputs.
_INPUTS: Final = {"scan": "files", "inspect": "file", "verify": "file", "convert": "input"}


#: ``--format`` of the bulk commands but scan (whose ``--format`` also has json and sarif).
BULK_FORMATS: Final = ("text", "jsonl")


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    """The bulk options of ``command``."""
    g = p.add_argument_group("many files (globs, directories, s3://bucket/prefix/)")
    if command != "scan":
        g.add_argument("--format", choices=BULK_FORMATS, default=None,
                       help="in bulk (folders, globs, several files): text, a table of "
                            "every file, the totals and the files that need attention (the "
                            "default when stdout is a terminal), or jsonl, JSON Lines: one "
                            "record per file, then a summary (the default otherwise)")
    g.add_argument("--jsonl", action="store_true",
                   help="JSON Lines, as --format jsonl: one record per file as it finishes, "
                        "then a summary record")
    g.add_argument("--workers", type=int, metavar="N",
                   help="threads (URLs) or processes (local files) at once; on --dask, "
                        "worker processes")
    g.add_argument("--dask", action="store_true",
                   help="run on a Dask LocalCluster on this machine (needs ptfile's dask extra: pip install 'dask[distributed]')")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="run on the Dask cluster at ADDRESS (tcp://host:port)")
    g.add_argument("--retries", type=int, default=RETRIES, metavar="N",
                   help=f"attempts after the first on transient I/O errors (default "
                        f"{RETRIES})")
    g.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="leave out of folder walks the files and folders whose path (relative "
                        "to the folder named) or name matches GLOB (repeatable: --exclude .git "
                        "--exclude 'data/*')")
    g.add_argument("--list-skipped", action="store_true",
                   help="list the files a folder walk skipped (no loader of torch's reads "
                        "them): in the text report, and in the JSON summary (skipped_files)")
    g.add_argument("--progress", action="store_true",
                   help="show the progress bar even when stderr is not a terminal")
    if command == "convert":
        g.add_argument("--out-prefix", metavar="FOLDER",
                       help="write outputs under FOLDER, at the inputs' relative paths "
                            "(default: beside each input)")


def _inputs(args: argparse.Namespace) -> list[str]:
    value = getattr(args, _INPUTS[args.command])
    return list(value) if isinstance(value, list) else [value]


def record_of(args: argparse.Namespace, item: str) -> Input:
    """The record of the input ``item`` (:func:`~ptfile.formats.inputs.resolve_input`),
    decided once per command line: deciding whether a run is in bulk and running it ask
    the same record, so a folder URL is listed once."""
    from ..formats.inputs import resolve_input

    cache: dict[str, Input] = vars(args).setdefault("_records", {})
    found = cache.get(item)
    if found is None:
        found = cache[item] = resolve_input(item, dict(args.storage_options) or None)
    return found


def _names_many(args: argparse.Namespace, item: str) -> bool:
    """Whether ``item`` stands for many files: a glob, a URL prefix ending in ``/``, a
    folder of many files (its record's kind)."""
    from ..bulk.inputs import has_magic

    if has_magic(item) or (is_url(item) and item.endswith("/")):
        return True
    return record_of(args, item).kind is InputKind.FOLDER


def is_bulk(args: argparse.Namespace) -> bool:
    """Whether the command line asks for a bulk run (see the module docstring)."""
    if args.command not in BULK_COMMANDS:
        return False
    inputs = _inputs(args)
    if args.jsonl or args.format == "jsonl" or args.workers is not None or args.dask \
            or args.scheduler or getattr(args, "out_prefix", None) is not None:
        return True
    if args.command == "convert":
        return len(inputs) != 2
    if any(_names_many(args, item) for item in inputs):
        return True
    return args.command != "scan" and len(inputs) > 1


def output_format(args: argparse.Namespace, out: TextIO) -> str:
    """What a bulk run prints: ``text``, ``jsonl`` or ``sarif`` (the module docstring).

    Examples
    --------
    >>> import io
    >>> output_format(argparse.Namespace(format=None, jsonl=False), io.StringIO())
    'jsonl'
    """
    if args.jsonl or getattr(args, "json", False) or args.format in ("json", "jsonl"):
        return "jsonl"
    if args.format is not None:
        return str(args.format)
    return "text" if out.isatty() else "jsonl"


def single(args: argparse.Namespace) -> None:
    """Set the one-file arguments the commands read (``args.file``; ``args.input`` and
    ``args.output``) from the inputs, for a run that is not in bulk."""
    if args.command in ("inspect", "verify"):
        args.file = args.file[0]
    elif args.command == "convert":
        args.input, args.output = args.input
        if _names_many(args, args.input):  # a glob, or a folder that is no one checkpoint
            raise PtfileError(f"{args.input} names many files: convert them with "
                              f"--out-prefix {args.output}")


@contextlib.contextmanager
def _client(args: argparse.Namespace, remote: bool) -> Iterator[Any]:
    """The Dask client the arguments ask for (None: the local pool)."""
    from .. import bulk
    if not (args.dask or args.scheduler):
        yield None
        return
    distributed = bulk.require_dask()
    if args.scheduler:
        with distributed.Client(args.scheduler) as client:
            yield client
        return
    # Remote work waits on the network: a few threads per process keep the requests flowing.
    with bulk.local_cluster(args.workers or os.cpu_count() or 1, 4 if remote else 1) as cluster, \
            distributed.Client(cluster) as client:
        yield client


def _records(args: argparse.Namespace, urls: bulk.Expansion,
             client: Any) -> Iterator[bulk.Record]:
    from .. import bulk
    common = {"client": client, "workers": None if client else args.workers,
              "storage_options": dict(args.storage_options) or None, "retries": args.retries,
              "exclude": args.exclude}
    if args.command == "scan":
        return bulk.scan(urls, allow_unknown=args.allow_unknown, allow=args.allow_list, **common)
    if args.command == "inspect":
        return bulk.inspect(urls, structural=args.structural, **common)
    if args.command == "verify":
        return bulk.verify(urls, **common)
    # The inputs as given, not their expansion: each file's output keeps its path relative
    # to the folder or glob that named it (teamN/runNN/model.pt under --out-prefix).
    return bulk.convert(_inputs(args), args.out_prefix, args.to or "safetensors", shared=args.shared,
                        structural=args.structural, npz_upcast=args.npz_upcast, **common)


def _write(doc: bulk.Record, out: TextIO) -> None:
    out.write(json.dumps(doc, default=str) + "\n")
    out.flush()


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run the command over every file its inputs name; print a table, JSON Lines or a
    SARIF log (:func:`output_format`); return the worst exit code.

    Raises
    ------
    PtfileError
        No file matches, or an input cannot be listed.
    """
    from .. import bulk
    from .._io.paths import is_url
    options = dict(args.storage_options) or None
    found = bulk.walk(_inputs(args), options, exclude=args.exclude,
                      inside=args.command == "scan")
    urls = found.files
    if not urls:
        raise PtfileError(f"no files match {' '.join(_inputs(args))}"
                          + (f" ({len(found.skipped)} skipped: no loader of torch's reads "
                             "them; --list-skipped lists them)" if found.skipped else ""))
    start = time.perf_counter()
    done: list[bulk.Record] = []
    fmt = output_format(args, out)
    text = TextReport(args.command) if fmt == "text" else None
    scanned: list[dict[str, Any]] = []  # SARIF: one log at the end
    with _client(args, any(map(is_url, urls))) as client, \
            progress_bar(len(urls), args.command, not getattr(args, "no_progress", False),
                         unit="file", force=args.progress) as step:
        for record in _records(args, found, client):
            if fmt == "sarif":
                scanned.append(record["result"] or {"path": record["path"],
                                                    "error": record["error"]})
            elif text is not None:
                text.add(record)
            else:
                _write(record, out)
            done.append({k: record[k] for k in ("command", "verdict", "exit_code",
                                                "bytes_fetched")})
            step(1)
    summary = bulk.summarize(done, time.perf_counter() - start)
    summary.update(_walked(found, args.list_skipped))
    if fmt == "sarif":
        _write_sarif(args, scanned, int(summary["exit_code"]), out)
    elif text is not None:
        text.write(summary, out)
    else:
        _write(summary, out)
    return int(summary["exit_code"])


def _walked(found: bulk.Expansion, listed: bool) -> dict[str, Any]:
    """What the walk adds to the summary: the skipped files (counted; listed on request),
    the files reached through links out of their folder, the folders reached again."""
    doc: dict[str, Any] = {"skipped": len(found.skipped)}
    if listed:
        doc["skipped_files"] = found.skipped
    if found.outside:
        doc["outside"] = found.outside
    if found.repeated:
        doc["repeated"] = found.repeated
    return doc


def _write_sarif(args: argparse.Namespace, scanned: list[dict[str, Any]], code: int,
                 out: TextIO) -> None:
    from .. import __version__, bulk
    from ..scanning.sarif import to_sarif

    log = to_sarif(bulk.ordered(scanned), version=__version__, verbose=args.verbose,
                   exit_code=code)
    out.write(json.dumps(log, indent=2, default=str) + "\n")
