"""Remote checkpoints over loopback HTTP: ptfile's range reads against torch and a download.

Usage::

    python benchmarks/remote.py               # A: ~2 GiB, B: 100,000 tiny tensors
    python benchmarks/remote.py --scale 0.25  # smaller A/B

A and B are ``benchmarks/run.py``'s files A2 and B, served by the tests' loopback range
server (``tests/support/rangeserver.py``), which counts GET requests and body
bytes.  For ``inspect``, ``scan``, ``open`` + the first tensor and a full
``load``, each row gives ptfile's seconds (best of ``--repeat``), requests and
MiB fetched, then the same for ``torch.load(fsspec.open(url))`` (torch reads the
file through fsspec's file object) and for downloading the file first
(``fsspec`` ``get``) and loading it locally with ptfile.  The size look-up
(HEAD) is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))
sys.path.insert(0, str(HERE))

from run import make_files  # noqa: E402

from rangeserver import RangeServer  # noqa: E402 - the tests' server, by path


def _ptfile_ops(url: str) -> dict[str, Callable[[], Any]]:
    import ptfile

    def open_first() -> Any:
        with ptfile.open(url) as ck:
            return ck.get_tensor(next(iter(ck)))

    return {"inspect": lambda: ptfile.inspect(url), "scan": lambda: ptfile.scan(url),
            "open + first tensor": open_first, "load": lambda: ptfile.load(url)}


def _torch_ops(url: str) -> dict[str, Callable[[], Any]]:
    import fsspec
    import torch

    def through_fsspec(**kwargs: Any) -> Any:
        with fsspec.open(url, "rb") as fp:
            return torch.load(fp, weights_only=True, **kwargs)

    meta = lambda: through_fsspec(map_location="meta")  # noqa: E731 - a table of calls
    return {"inspect": meta, "scan": meta, "open + first tensor": through_fsspec,
            "load": through_fsspec}


def _download_ops(url: str, folder: str) -> dict[str, Callable[[], Any]]:
    import fsspec

    import ptfile

    def download_then(fn: Callable[[str], Any]) -> Callable[[], Any]:
        def run() -> Any:
            local = f"{folder}/download.pt"
            fsspec.filesystem("http").get_file(url, local)
            return fn(local)
        return run

    return {"inspect": download_then(ptfile.inspect), "scan": download_then(ptfile.scan),
            "open + first tensor": download_then(lambda p: ptfile.load(p, mmap=True)),
            "load": download_then(ptfile.load)}


def _measure(server: RangeServer, name: str, fn: Callable[[], Any],
             repeat: int) -> tuple[float, float, int, float]:
    times = []
    for _ in range(repeat):
        server.reset()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    requests = server.stats.requests[name]
    mib = server.stats.body_bytes[name] / 2**20
    return min(times), statistics.median(times), requests, mib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="size factor for A and B")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "served"
        folder.mkdir()
        made = make_files(folder, args.scale)
        files = {"A": made["A2"], "B": made["B"]}  # A: run.py's 2 GiB A2
        with RangeServer(folder) as server:
            print(f"{'file':4} {'operation':20} {'ptfile s (min/med)':>19} {'req':>5} "
                  f"{'MiB':>8}   {'torch+fsspec s':>14} {'MiB':>8}   {'download s':>10} "
                  f"{'MiB':>8}")
            for label, path in files.items():
                url = server.url(path.name)
                ours, torch_ops = _ptfile_ops(url), _torch_ops(url)
                download = _download_ops(url, tmp)
                for op in ours:
                    a = _measure(server, path.name, ours[op], args.repeat)
                    b = _measure(server, path.name, torch_ops[op], 1)
                    c = _measure(server, path.name, download[op], 1)
                    print(f"{label:4} {op:20} {a[0]:9.3f}/{a[1]:<9.3f} {a[2]:5d} {a[3]:8.2f}"
                          f"   {b[0]:14.3f} {b[3]:8.1f}   {c[0]:10.3f} {c[3]:8.1f}",
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
