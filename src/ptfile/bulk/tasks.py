"""One file's work: the command, retries on transient errors, and its record."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from .._io.atomic import atomic_path
from .._io.paths import is_url
from .._io.remote import StorageOptions, filesystem, watched_sources
from ..errors import PtfileError, RemoteError, UnsupportedFeatureError
from ..limits import Limits
from ..outcomes import BACKOFF_SECONDS, ERROR, EXIT_OK, RETRIES, exit_code

if TYPE_CHECKING:
    from ..scanning.allowing import AllowList

__all__ = ["Options", "Record", "error_of", "run_one"]

# The exit-code table, each verdict's code and the retry policy have one home:
# ptfile.outcomes (exit_code); ptfile.bulk re-exports them from there.

Record: TypeAlias = dict[str, Any]


@dataclass(frozen=True)
class Options:
    """What every task of one run shares (sent to processes and Dask workers)."""

    storage_options: Mapping[str, Any] | None = None
    limits: Limits | None = None
    retries: int = RETRIES
    backoff: float = BACKOFF_SECONDS
    allow_unknown: bool = False
    #: scan: the unknown globals to count as allowed (:mod:`ptfile.scanning.allowing`).
    allow: AllowList | None = None
    structural: bool = False
    full: bool = False
    fmt: str = "safetensors"
    shared: str = "dedupe"
    extra: dict[str, Any] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()


def _scan(url: str, o: Options, _target: str | None) -> tuple[str, dict[str, Any]]:
    from ..scanning import scan as scan_one

    # A checkpoint folder's strays and subfolders are inputs of their own in a bulk scan
    # (the walk listed them): the folder's record is its checkpoint's.
    found = scan_one(url, limits=o.limits, storage_options=o.storage_options, whole=False)
    result = (o.allow.apply(found) if o.allow else found).to_dict()
    return result["verdict"], result


def _inspect(url: str, o: Options, _target: str | None) -> tuple[str, dict[str, Any]]:
    from ..inspection import inspect as inspect_one

    ins = inspect_one(url, limits=o.limits, storage_options=o.storage_options,
                      structural=o.structural)
    if o.full:
        return "ok", ins.to_dict()
    return "ok", {"format": ins.format, "file_size": ins.file_size,
                           "metadata": ins.metadata, "totals": ins.totals}


def _verify(url: str, o: Options, _target: str | None) -> tuple[str, dict[str, Any]]:
    from ..inspection import verify as verify_one

    report = verify_one(url, limits=o.limits, storage_options=o.storage_options)
    return "ok" if report.ok else "damaged", report.to_dict()


def _convert(url: str, o: Options, target: str | None) -> tuple[str, dict[str, Any]]:
    if target is None:
        raise UnsupportedFeatureError(f"{url}: already {o.fmt}; nothing to convert")
    if _exists(target, o.storage_options):
        return "skipped", {"output": target}
    with _atomic_output(target) as staged:
        summary = _convert_one(url, staged, o)
    return "converted", {**summary, "output": target}


def _convert_one(url: str, target: str, o: Options) -> dict[str, Any]:
    from ..export.convert import convert as convert_one

    summary = convert_one(url, target, to=o.fmt, shared=o.shared,  # type: ignore[arg-type]
                          storage_options=o.storage_options, structural=o.structural,
                          npz_upcast=bool(o.extra.get("npz_upcast")))
    return {k: summary[k] for k in ("kind", "tensors", "aliases", "dropped", "changed")}


def _exists(target: str, storage_options: StorageOptions) -> bool:
    if not is_url(target):
        return os.path.exists(target)
    fs, path = filesystem(target, storage_options)
    return bool(fs.exists(path))


@contextlib.contextmanager
def _atomic_output(target: str) -> Iterator[str]:
    """Where to write ``target``: a URL as it is (uploaded once written), a local path in
    a temporary folder beside it (its folders made first), renamed into place on success
    and removed on failure."""
    if is_url(target):
        yield target
        return
    with atomic_path(target, same_name=True) as staged:  # same stem: the archive name
        yield staged


COMMANDS: Final[dict[str, Callable[[str, Options, str | None],
                                     tuple[str, dict[str, Any]]]]] = {
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


def error_of(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def run_one(command: str, url: str, options: Options, target: str | None = None) -> Record:
    """One file's record: the command run with retries on transient errors; never raises
    for the file's sake (a task of the local pool or of Dask)."""
    record: Record = {"path": url, "command": command}

    def code(verdict: str) -> int:
        return exit_code(command, verdict, allow_unknown=options.allow_unknown)

    start = time.perf_counter()
    for attempt in range(options.retries + 1):
        sources: list[Any] = []
        token = watched_sources.set(sources)
        try:
            verdict, result = COMMANDS[command](url, options, target)
            record.update(verdict=verdict, exit_code=code(verdict), error=None, result=result)
            break
        except Exception as exc:  # noqa: BLE001 - one bad file never stops the run: its record
            record.update(verdict=ERROR, exit_code=code(ERROR), error=error_of(exc), result=None)
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

