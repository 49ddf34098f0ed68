"""Running many files: a local pool of threads or processes, or a Dask cluster."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import itertools
import multiprocessing
import os
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Final, Literal, TypeAlias

from .._io.paths import is_url
from ..errors import PtfileError, UnsupportedFeatureError
from ..outcomes import EXIT_ERROR
from .inputs import expand
from .tasks import Options, Record, error_of, run_one

__all__ = ["PROCESS_MIN_BYTES", "PROCESS_MIN_FILES", "THREADS", "Pool", "local_cluster",
           "require_dask", "run"]

#: Threads of the local pool for URLs.
THREADS: Final = 16
#: Local-pool tasks in flight per worker, and Dask tasks per worker thread: enough to keep
#: everyone busy, few enough that millions of inputs never become millions of futures.
WINDOW_PER_WORKER: Final = 4
DASK_WINDOW_PER_THREAD: Final = 8


Command: TypeAlias = Literal["scan", "inspect", "verify", "convert"]
Pool: TypeAlias = Literal["auto", "thread", "process", "serial"]


Job: TypeAlias = tuple[str, str, Options, "str | None"]


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


def _on_pool(jobs: Sequence[Job], kind: str, workers: int | None,
             work: Callable[..., Record] = run_one) -> Iterator[Record]:
    """Every job's record, on a pool of ``kind``.  A worker process that dies (killed for
    memory, a crash in a native library) breaks a process pool and fails every future in
    flight: those jobs are run again on a fresh pool, each one alone, so the one that
    breaks it by itself gets the error record and the others their own results."""
    if kind == "serial":
        for job in jobs:
            yield work(*job)
        return
    pending: Iterator[Job] = iter(jobs)
    suspects: list[Job] | None = []
    while suspects is not None:
        suspects = yield from _pool_round(pending, suspects, kind, workers, work)


def _pool_round(pending: Iterator[Job], suspects: list[Job], kind: str, workers: int | None,
                work: Callable[..., Record]) -> Generator[Record, None, list[Job] | None]:
    """One pool's life: the suspects alone, then the pending jobs in a window.  Returns the
    jobs to run again when the pool broke (a list), or None when every job has its record."""
    with _executor(kind, workers) as pool:
        for i, job in enumerate(suspects):
            alone = _submit(pool, work, job)
            cf.wait([alone])
            yield _result_of(alone, job)
            if isinstance(alone.exception(), cf.BrokenExecutor):
                return suspects[i + 1:]
        window = WINDOW_PER_WORKER * (getattr(pool, "_max_workers", None) or 1)
        running = {_submit(pool, work, job): job for job in _take(pending, window)}
        while running:
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            if any(isinstance(f.exception(), cf.BrokenExecutor) for f in done):
                cf.wait(running)  # a broken pool fails the rest at once
                again = []
                for future, job in running.items():
                    if isinstance(future.exception(), cf.BrokenExecutor):
                        again.append(job)
                    else:
                        yield _result_of(future, job)
                return again
            for future in done:
                yield _result_of(future, running.pop(future))
            running.update({_submit(pool, work, job): job for job in _take(pending, len(done))})
    return None


def _submit(pool: cf.Executor, work: Callable[..., Record], job: Job) -> cf.Future[Record]:
    """The job's future.  A pool can break between one future's end and the next submit
    (a worker dies while its neighbour's result is read): ``submit`` then raises at once, and
    the job gets a future failed with that error, to be run again like the others in flight."""
    try:
        return pool.submit(work, *job)
    except cf.BrokenExecutor as exc:
        future: cf.Future[Record] = cf.Future()
        future.set_exception(exc)
        return future


def _take(jobs: Iterator[Job], n: int) -> list[Job]:
    return list(itertools.islice(jobs, n))


def _result_of(future: cf.Future[Record], job: Job) -> Record:
    """The future's record, or an error record when the pool itself failed (a process
    that died: its exception is the file's error)."""
    try:
        return future.result()
    except Exception as exc:  # noqa: BLE001 - the pool's failure is the file's record
        return failed(job, exc)


def failed(job: Job, exc: BaseException) -> Record:
    command, url = job[0], job[1]
    return {"path": url, "command": command, "verdict": "error", "exit_code": EXIT_ERROR,
            "error": error_of(exc), "result": None, "ok": False, "attempts": 1, "seconds": 0.0,
            "bytes_fetched": None, "requests": None}


def require_dask() -> Any:
    """The ``distributed`` module, or an error naming the extra that installs it."""
    try:
        import distributed  # type: ignore[import-untyped,unused-ignore]  # the dask extra
    except ImportError:
        raise UnsupportedFeatureError("running on Dask needs dask[distributed]: "
                                      "pip install 'dask[distributed]' (ptfile's dask extra)") from None
    return distributed


def local_cluster(n_workers: int, threads_per_worker: int = 1) -> Any:
    """A Dask LocalCluster of worker processes on this machine: the scheduler, the nannies,
    the workers and the scheduler's HTTP endpoint (health and metrics; no dashboard) all
    listen on 127.0.0.1 only, on free ports.

    Raises
    ------
    UnsupportedFeatureError
        dask[distributed] is not installed.
    """
    distributed = require_dask()
    return distributed.LocalCluster(
        n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
        host="127.0.0.1", dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})  # not 8787, maybe taken


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
                return failed(job, exc)
            continue
        if isinstance(result, dict):
            return result
    return failed(job, RuntimeError("no record came back"))


def _without_clashes(jobs: Sequence[Job]) -> tuple[list[Job], list[Record]]:
    """The jobs whose output no other job writes, and an error record for each of the
    others: two inputs that would convert to one path (``run1/model.pt`` and
    ``run1/model.bin`` both to ``run1/model.safetensors``) are both refused, so neither
    output silently replaces the other and the run says so."""
    claimed: dict[str, list[str]] = {}
    for job in jobs:
        if job[3] is not None:
            claimed.setdefault(os.path.abspath(job[3]) if not is_url(job[3]) else job[3],
                               []).append(job[1])
    keep: list[Job] = []
    clashes: list[Record] = []
    for job in jobs:
        key = job[3] if job[3] is None or is_url(job[3]) else os.path.abspath(job[3])
        others = [] if key is None else [u for u in claimed[key] if u != job[1]]
        if not others:
            keep.append(job)
            continue
        clashes.append(failed(job, PtfileError(
            f"{job[1]}: not converted: {', '.join(others)} would be written to the same "
            f"output {job[3]}; convert them one at a time (ptfile convert IN OUT) or move "
            f"one aside")))
    return keep, clashes


def run(command: Command, inputs: Any, options: Options, *, client: Any, workers: int | None,
         pool: Pool,
         targets: Callable[[list[str]], tuple[list[str], list[str | None]]] | None = None
         ) -> Iterator[Record]:
    urls = expand(inputs, options.storage_options, exclude=options.exclude,
                  inside=command == "scan")  # scan: the strays in checkpoint folders too
    outputs: list[str | None] = [None] * len(urls)
    if targets is not None:
        urls, outputs = targets(urls)
    jobs, clashes = _without_clashes(
        [(command, url, options, out) for url, out in zip(urls, outputs, strict=True)])
    yield from clashes
    if client is not None:
        yield from _on_dask(client, jobs, options.retries)
    else:
        yield from _on_pool(jobs, _pool_kind(pool, jobs, workers), workers)

