"""ptfile vs torch, side by side, in one run: time and peak RSS as ratios.

Usage::

    python benchmarks/run.py              # A: ~2 GiB state dict, B: 100,000 tiny tensors
    python benchmarks/run.py --scale 0.1  # smaller A/B for a quick look

Every measurement runs in a fresh child process (so peak RSS is its own) on the
same file, warm in the page cache for both libraries.  Needs torch (the test
extras) for the torch columns; ptfile itself never imports torch.

(A) ~300 bf16/fp16/fp32 matrices, ~2 GiB: ``load(mmap=True)`` vs torch's (and
    with a numpy view of every tensor made, which reads the local headers torch
    reads during its load),
    ``load(mmap=False)`` vs reading the file into fresh memory, ``save`` vs
    torch.save and vs writing the same bytes plus their CRC-32.
(B) 100,000 tiny tensors: ``load`` and ``save`` vs torch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _touch_all(obj: Any) -> int:
    """Count tensors; for a fair 'load' both libraries must build every tensor object."""
    if isinstance(obj, dict):
        return sum(_touch_all(v) for v in obj.values())
    return 1


def _child_task(task: str, path: str) -> Callable[[], Any]:
    if task.startswith("torch"):
        import torch
    import ptfile

    tmp_out = path + ".out"

    def torch_save() -> None:
        obj = torch.load(path, weights_only=True)
        start = time.perf_counter()
        torch.save(obj, tmp_out)
        _report(time.perf_counter() - start)

    def ptfile_save() -> None:
        obj = ptfile.load(path)
        start = time.perf_counter()
        ptfile.save(obj, tmp_out)
        _report(time.perf_counter() - start)

    def raw_write_crc() -> None:
        data = Path(path).read_bytes()
        start = time.perf_counter()
        with open(tmp_out, "wb") as fp:
            step = 64 << 20
            for i in range(0, len(data), step):
                chunk = memoryview(data)[i:i + step]
                zlib.crc32(chunk)
                fp.write(chunk)
            fp.flush()
            os.fsync(fp.fileno())
        _report(time.perf_counter() - start)

    tasks: dict[str, Callable[[], Any]] = {
        "torch_load": lambda: torch.load(path, weights_only=True),
        "torch_load_mmap": lambda: torch.load(path, weights_only=True, mmap=True),
        "ptfile_load": lambda: ptfile.load(path),
        "ptfile_load_mmap": lambda: ptfile.load(path, mmap=True),
        "ptfile_load_mmap_views": lambda: _array_views(ptfile.load(path, mmap=True)),
        "read_bytes": lambda: _read_into_fresh_memory(path),
        "ptfile_open_list": lambda: _open_and_list(path),
        "torch_fake_load": lambda: _torch_fake_load(path),
        "torch_meta_load": lambda: torch.load(path, weights_only=True, map_location="meta"),
    }
    timed = {"torch_save": torch_save, "ptfile_save": ptfile_save, "raw_write_crc": raw_write_crc}
    if task in timed:
        return timed[task]

    def run() -> None:
        start = time.perf_counter()
        obj = tasks[task]()
        if isinstance(obj, dict):
            _touch_all(obj)
        _report(time.perf_counter() - start)
    return run


def _array_views(obj: dict[str, Any]) -> int:
    """A numpy view of every tensor: with mmap=True, ptfile reads each storage's local
    header on first use, where torch reads them all during its load."""
    import numpy as np

    return sum(np.asarray(t).ndim for t in obj.values())


def _open_and_list(path: str) -> int:
    """ptfile.open + every tensor's dtype, shape, stride, storage key and file offset."""
    import ptfile

    with ptfile.open(path) as ck:
        return sum(len(info.shape) + (info.data_offset or 0) for info in ck.infos())


def _torch_fake_load(path: str) -> Any:
    """torch's metadata-only load: FakeTensorMode (fake tensors know their _checkpoint_offset)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.load(path, weights_only=True)


def _read_into_fresh_memory(path: str) -> Any:
    """The baseline for load(mmap=False): one readinto of the whole file into fresh
    (not zero-filled) memory."""
    import numpy as np

    with open(path, "rb", buffering=0) as fp:
        out = np.empty(os.fstat(fp.fileno()).st_size, np.uint8)
        fp.readinto(out.data)
    return out


def _report(seconds: float) -> None:
    print(json.dumps({"seconds": seconds, "rss_mib": _rss_mib()}))


def measure(task: str, path: Path, repeat: int) -> dict[str, float]:
    best: dict[str, float] | None = None
    for _ in range(repeat):
        out = subprocess.run([sys.executable, str(HERE), "--child", task, str(path)],
                             capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if best is None or result["seconds"] < best["seconds"]:
            best = result
    assert best is not None
    return best


def _make_files(folder: str, scale: float) -> None:
    import torch

    torch.manual_seed(0)
    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    # 300 square matrices averaging 8/3 bytes per element: ~2 GiB at scale 1.
    side = max(1, int(1640 * scale ** 0.5))
    a = {f"layers.{i}.weight": torch.randn(side, side).to(dtypes[i % 3]) for i in range(300)}
    torch.save(a, Path(folder) / "A.pt")
    del a
    n = max(1, int(100_000 * scale))
    torch.save({f"model.layers.{i}.weight": torch.randn(4) for i in range(n)},
               Path(folder) / "B.pt")


def make_files(folder: Path, scale: float) -> tuple[Path, Path]:
    """Write A and B with torch in a child process (peak RSS is inherited by later children)."""
    subprocess.run([sys.executable, str(HERE), "--make", str(folder), str(scale)], check=True)
    return folder / "A.pt", folder / "B.pt"


ROWS = [
    ("A", "load(mmap=True)", "ptfile_load_mmap", "torch_load_mmap", "torch"),
    ("A", "... + numpy views", "ptfile_load_mmap_views", "torch_load_mmap", "torch (load only)"),
    ("A", "load(mmap=False)", "ptfile_load", "read_bytes", "read file into memory"),
    ("A", "load(mmap=False)", "ptfile_load", "torch_load", "torch"),
    ("A", "save", "ptfile_save", "torch_save", "torch"),
    ("A", "save", "ptfile_save", "raw_write_crc", "write bytes + CRC32"),
    ("B", "load", "ptfile_load", "torch_load", "torch"),
    ("B", "save", "ptfile_save", "torch_save", "torch"),
    ("B", "open + metadata", "ptfile_open_list", "torch_meta_load", "torch map_location=meta"),
    ("B", "open + metadata", "ptfile_open_list", "torch_fake_load", "torch FakeTensorMode"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="size factor for A and B")
    parser.add_argument("--repeat", type=int, default=2, help="runs per measurement (best kept)")
    parser.add_argument("--only", default="", metavar="TEXT",
                        help="run only the rows whose operation contains TEXT (e.g. 'open')")
    parser.add_argument("--child", nargs=2, metavar=("TASK", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--make", nargs=2, metavar=("FOLDER", "SCALE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.make:
        _make_files(args.make[0], float(args.make[1]))
        return 0
    if args.child:
        _child_task(*args.child)()
        return 0
    with tempfile.TemporaryDirectory(dir=os.environ.get("PTFILE_BENCH_DIR")) as tmp:
        files = dict(zip("AB", make_files(Path(tmp), args.scale), strict=True))
        sizes = {k: v.stat().st_size / 2**20 for k, v in files.items()}
        print(f"A: {sizes['A']:.0f} MiB, 300 tensors;  B: {sizes['B']:.1f} MiB, "
              f"{max(1, int(100_000 * args.scale))} tensors\n")
        print(f"{'file':4} {'operation':18} {'ptfile s':>9} {'RSS MiB':>8}   {'vs':24} "
              f"{'other s':>8} {'RSS MiB':>8} {'speed-up':>9}")
        cache: dict[tuple[str, str], dict[str, float]] = {}
        for file, op, ours, theirs, label in ROWS:
            if args.only not in op:
                continue
            for task in (ours, theirs):
                if (file, task) not in cache:
                    cache[file, task] = measure(task, files[file], args.repeat)
            a, b = cache[file, ours], cache[file, theirs]
            print(f"{file:4} {op:18} {a['seconds']:9.3f} {a['rss_mib']:8.0f}   {label:24} "
                  f"{b['seconds']:8.3f} {b['rss_mib']:8.0f} {b['seconds'] / a['seconds']:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
