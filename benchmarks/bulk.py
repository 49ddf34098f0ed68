"""Scanning 1,000 checkpoints in a bucket: ptfile.bulk sequentially, on the local pool and on
Dask, against downloading every file and scanning it with picklescan.

Usage::

    python benchmarks/bulk.py                   # 1,000 files of ~256 KiB on loopback S3
    python benchmarks/bulk.py --files 200 --elems 4096

The files are ``tests/support/bulk_corpus.py``'s mix (clean ``ptfile.save``/``torch.save``
ZIPs, legacy streams, dangerous ZIPs and pickles, damaged files, files that are no
checkpoint), ``--elems`` float32 values per tensor, uploaded to moto's S3 server on
127.0.0.1.  Each row gives the wall time, files per second and bytes fetched per
file: ptfile counts its own range reads (each record's ``bytes_fetched``; the size
look-ups are not counted), the download row the bytes written to disk.  The
picklescan row is the download plus picklescan's ``scan_file_path`` on every file,
one after the other, as a one-process audit does it.  The Dask row runs a
LocalCluster of ``--dask-workers`` processes (4 threads each) on loopback; its time
includes no cluster start-up.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

from bulk_corpus import corpus  # noqa: E402 - the tests' corpus, by path


def _server(files: dict[str, bytes]) -> tuple[Any, dict[str, Any], Any]:
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"},
               "key": "testing", "secret": "testing"}
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("zoo")
    fs.pipe({f"zoo/models/{name}": data for name, data in files.items()})
    return server, options, fs


def _row(name: str, seconds: float, n: int, fetched: float | None) -> None:
    per_file = "-" if fetched is None else f"{fetched / n / 1024:10.1f}"
    print(f"{name:34} {seconds:8.2f} {n / seconds:10.1f} {per_file:>12}", flush=True)


def _ptfile(records: Iterator[dict[str, Any]]) -> tuple[float, int, int]:
    start = time.perf_counter()
    done = list(records)
    return time.perf_counter() - start, len(done), sum(r["bytes_fetched"] or 0 for r in done)


def _download_and_picklescan(fs: Any, folder: str) -> tuple[float, float, int, int]:
    from picklescan.scanner import scan_file_path

    start = time.perf_counter()
    fs.get("zoo/models/", folder + "/", recursive=True)
    downloaded = time.perf_counter() - start
    paths = [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files]
    for path in paths:
        try:
            scan_file_path(path)
        except Exception:  # noqa: BLE001,S112 - picklescan raises on damaged files; go on
            continue
    total = time.perf_counter() - start
    return downloaded, total, len(paths), sum(os.path.getsize(p) for p in paths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000, help="checkpoints in the bucket")
    parser.add_argument("--elems", type=int, default=65536, help="float32 values per tensor")
    parser.add_argument("--workers", type=int, default=16, help="threads of the local pool")
    parser.add_argument("--dask-workers", type=int, default=2, help="Dask worker processes")
    args = parser.parse_args(argv)

    import distributed

    from ptfile import bulk

    files = corpus(args.files, elems=args.elems)
    size = sum(map(len, files.values()))
    server, options, fs = _server(files)
    url = "s3://zoo/models/"
    print(f"{len(files)} files, {size / 2**20:.1f} MiB on loopback S3 (moto)\n")
    print(f"{'run':34} {'seconds':>8} {'files/s':>10} {'KiB/file':>12}")
    try:
        runs: dict[str, Callable[[], Iterator[dict[str, Any]]]] = {
            "ptfile scan, sequential": lambda: bulk.scan(url, pool="serial",
                                                         storage_options=options),
            f"ptfile scan, {args.workers} threads": lambda: bulk.scan(
                url, workers=args.workers, storage_options=options),
        }
        for name, run in runs.items():
            _row(name, *_ptfile(run()))
        with bulk.local_cluster(args.dask_workers, 4) as cluster, \
                distributed.Client(cluster) as client:
            list(bulk.scan(url + "d00/*-clean.pt", client=client, storage_options=options))
            _row(f"ptfile scan, Dask {args.dask_workers}x4", *_ptfile(bulk.scan(
                url, client=client, storage_options=options)))
        with tempfile.TemporaryDirectory() as tmp:
            downloaded, total, n, nbytes = _download_and_picklescan(fs, tmp)
            _row("download (fsspec get)", downloaded, n, nbytes)
            _row("download + picklescan", total, n, nbytes)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
