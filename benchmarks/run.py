"""ptfile against torch and the torch-free peers, row by row, as ratios measured in one run.

Usage::

    python benchmarks/run.py              # A 200 MB, A2 2 GiB, B 100,000 tensors
    python benchmarks/run.py --scale 0.1  # smaller files for a quick look
    python benchmarks/run.py --only B --repeat 3

Needs the test and bench extras (torch, safetensors, ptloader); ptfile itself
never imports torch.  The files, written by torch (and their safetensors twins
by the safetensors package) into a temporary folder that is removed at the end:

* **A**: 96 bf16/f16/f32 matrices of 1024x1024 and 1024x512, ~200 MB;
* **A2**: 64 bf16 matrices of 4096x4096, 2 GiB;
* **B**: 100,000 float32[16] tensors;
* ``A.safetensors`` and ``B.safetensors``: the same tensors.

Every measurement runs in a fresh child process (so its peak RSS is its own)
on a file warm in the page cache: each row's two operations run alternately,
``--repeat`` times each, and the row shows the median seconds, their spread
(min-max), the child's CPU seconds (user + system, of the timed part), its
peak RSS, and the ratio ptfile / other of the medians (with the spread of the
per-run ratios), then the ratio of the median CPU seconds (which a busy machine
disturbs less than the wall time).  Below 1 ptfile is faster; each row's target
is the wall-time ratio the issue asks for.  A "full load" reads the first element of every tensor (for
ptfile, torch and the peers alike), so lazy loaders pay for what they defer.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve()


class Row(NamedTuple):
    file: str       # A, A2 or B: the file the tasks run on (twins: same stem)
    operation: str
    ours: str       # a task of TASKS
    theirs: str
    label: str      # what "theirs" is
    target: float   # the ratio ours / theirs asked for (at most)


ROWS = [
    Row("A", "full load", "ptfile_load", "read_bytes", "read file into fresh memory", 1.0),
    Row("A", "full load", "ptfile_load", "torch_load", "torch.load", 1.0),
    Row("A", "full load", "ptfile_load", "st_load", "safetensors.numpy load_file", 0),
    Row("A", "full load", "ptfile_load", "ptloader_load", "ptloader.load", 0),
    Row("A2", "full load", "ptfile_load", "read_bytes", "read file into fresh memory", 1.0),
    Row("A2", "full load", "ptfile_load", "torch_load", "torch.load", 1.0),
    Row("A", "save", "ptfile_save", "torch_save", "torch.save", 0.9),
    Row("A", "save(fsync=True)", "ptfile_save_fsync", "ptfile_save", "ptfile save()", 0),
    Row("A", "save(fsync=True)", "ptfile_save_fsync", "torch_save_fsync", "torch.save + fsync", 0),
    Row("A2", "save", "ptfile_save", "torch_save", "torch.save", 0.9),
    Row("A2", "save(fsync=True)", "ptfile_save_fsync", "ptfile_save", "ptfile save()", 0),
    Row("A2", "save(fsync=True)", "ptfile_save_fsync", "torch_save_fsync", "torch.save + fsync",
        0),
    Row("B", "full load", "ptfile_load", "st_load", "safetensors.numpy load_file", 1.0),
    Row("B", "full load", "ptfile_load", "torch_load", "torch.load", 1 / 12),
    Row("B", "full load", "ptfile_load", "ptloader_load", "ptloader.load", 0),
    Row("B", "load(mmap=True)", "ptfile_load_mmap_touched", "ptfile_load", "ptfile load()", 1.1),
    Row("B", "open + info(k)", "ptfile_open_info", "st_open_shape",
        "safe_open + get_slice(k).get_shape()", 1.0),
    Row("B", "open + info(k)", "ptfile_open_info", "torch_meta_load", "torch map_location=meta",
        0),
    Row("A", "open", "ptfile_open", "st_open", "safetensors safe_open", 2.0),
    Row("A", "load(mmap=True)", "ptfile_load_mmap", "torch_load_mmap", "torch mmap=True", 0.2),
    Row("A", "... + numpy views", "ptfile_load_mmap_views", "torch_load_mmap",
        "torch mmap=True (load only)", 0.5),
]


# -- what the children run -------------------------------------------------------------------
def _first_elements(obj: dict[str, Any]) -> int:
    """Read the first byte of every tensor (ptfile tensors, torch tensors, numpy arrays)."""
    total = 0
    for t in obj.values():
        if hasattr(t, "raw_bytes"):  # ptfile
            total += t.raw_bytes()[t.storage_offset() * t.dtype.itemsize]
        elif hasattr(t, "untyped_storage"):  # torch
            total += t.untyped_storage()[t.storage_offset() * t.element_size()]
        else:  # numpy
            total += int(t.reshape(-1)[:1].view("u1")[0])
    return total


def _read_into_fresh_memory(path: str) -> Any:
    """One readinto of the whole file into fresh memory: an anonymous map (not
    ``numpy.empty``, whose huge pages can stall on a host that must compact memory
    for them)."""
    import mmap

    with open(path, "rb", buffering=0) as fp:
        out = mmap.mmap(-1, max(1, os.fstat(fp.fileno()).st_size))
        fp.readinto(out)
    return out


def _loads() -> dict[str, Callable[[str], Any]]:
    """Timed tasks that read ``path`` (the .pt file; ``st_*`` read its safetensors twin)."""
    def twin(path: str) -> str:
        return str(Path(path).with_suffix(".safetensors"))

    def ptfile_load(path: str) -> int:
        import ptfile
        return _first_elements(ptfile.load(path))

    def ptfile_load_mmap_touched(path: str) -> int:
        import ptfile
        return _first_elements(ptfile.load(path, mmap=True))

    def ptfile_load_mmap(path: str) -> int:
        import ptfile
        return len(ptfile.load(path, mmap=True))

    def ptfile_load_mmap_views(path: str) -> int:
        import numpy as np

        import ptfile
        return sum(np.asarray(t).ndim for t in ptfile.load(path, mmap=True).values())

    def ptfile_open(path: str) -> int:
        import ptfile
        with ptfile.open(path) as ck:
            return len(ck)

    def ptfile_open_info(path: str) -> int:
        import ptfile
        with ptfile.open(path) as ck:
            return sum(len(ck.info(k).shape) for k in ck)

    def torch_load(path: str) -> int:
        import torch
        return _first_elements(torch.load(path, weights_only=True))

    def torch_load_mmap(path: str) -> int:
        import torch
        return len(torch.load(path, weights_only=True, mmap=True))

    def torch_meta_load(path: str) -> int:
        import torch
        obj = torch.load(path, weights_only=True, map_location="meta")
        return sum(len(t.shape) for t in obj.values())

    def st_load(path: str) -> int:
        import ml_dtypes  # noqa: F401  (numpy learns bfloat16, as safetensors' numpy API needs)
        from safetensors.numpy import load_file
        return _first_elements(load_file(twin(path)))

    def st_open(path: str) -> int:
        import ml_dtypes  # noqa: F401
        from safetensors import safe_open
        with safe_open(twin(path), "np") as f:
            return len(f.keys())

    def st_open_shape(path: str) -> int:
        import ml_dtypes  # noqa: F401
        from safetensors import safe_open
        with safe_open(twin(path), "np") as f:
            return sum(len(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118

    def ptloader_load(path: str) -> int:
        import ptloader
        return _first_elements(ptloader.load(path))

    read_bytes = _read_into_fresh_memory
    return {name: fn for name, fn in locals().items() if callable(fn) and name != "twin"}


def _saves() -> dict[str, tuple[Callable[[str], Any], Callable[[Any, str], None]]]:
    """Tasks that load ``path`` untimed, then time saving it to a new file (removed after)."""
    def ptfile_read(path: str) -> Any:
        import ptfile
        return ptfile.load(path)

    def torch_read(path: str) -> Any:
        import torch
        return torch.load(path, weights_only=True)

    def ptfile_save(obj: Any, out: str) -> None:
        import ptfile
        ptfile.save(obj, out)

    def ptfile_save_fsync(obj: Any, out: str) -> None:
        import ptfile
        ptfile.save(obj, out, fsync=True)

    def torch_save(obj: Any, out: str) -> None:
        import torch
        torch.save(obj, out)

    def torch_save_fsync(obj: Any, out: str) -> None:
        import torch
        torch.save(obj, out)
        fd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    return {"ptfile_save": (ptfile_read, ptfile_save),
            "ptfile_save_fsync": (ptfile_read, ptfile_save_fsync),
            "torch_save": (torch_read, torch_save),
            "torch_save_fsync": (torch_read, torch_save_fsync)}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _import_ptfile() -> None:
    """Import ptfile whole, untimed as torch's import is: its public names and its readers
    are imported on first use (``import ptfile`` alone imports almost nothing), which a
    timed load would otherwise pay for (and, under ``PYTHONDONTWRITEBYTECODE``, compile)."""
    import ptfile
    import ptfile.formats
    import ptfile.reader  # open's file reader: api.open imports it on first use

    for name in ("load", "open", "save", "scan"):
        getattr(ptfile, name)
    for table in ("READERS", "OPENERS"):  # the readers (OPENERS: since the one table)
        getattr(ptfile.formats, table, None)


def _child(task: str, path: str) -> None:
    """Run one task, print its seconds, CPU seconds and peak RSS as one JSON line."""
    saves = _saves()
    if task in saves:
        read, write = saves[task]
        obj, out = read(path), path + ".out.pt"
        _import_ptfile()
        cpu, start = _cpu(), time.perf_counter()
        write(obj, out)
        seconds, cpu = time.perf_counter() - start, _cpu() - cpu
        os.unlink(out)
    else:
        fn = _loads()[task]
        if task.startswith(("torch", "ptloader")):
            import torch  # noqa: F401  (imported untimed: its import is not the load)
        import ml_dtypes  # noqa: F401
        import numpy  # noqa: F401

        _import_ptfile()
        cpu, start = _cpu(), time.perf_counter()
        fn(path)
        seconds, cpu = time.perf_counter() - start, _cpu() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "cpu": cpu, "rss_mib": rss}))


# -- the files --------------------------------------------------------------------------------
def _make(folder: str, scale: float) -> None:
    """Write A, A2 and B with torch, and the safetensors twins of A and B (one file at a time)."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    root = Path(folder)
    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    rows = max(1, int(1024 * scale ** 0.5))
    a = {f"layers.{i}.weight": torch.randn(rows, (1024, 512)[i // 3 % 2]).to(dtypes[i % 3])
         for i in range(96)}
    torch.save(a, root / "A.pt")
    save_file(a, str(root / "A.safetensors"))
    del a
    side = max(1, int(4096 * scale ** 0.5))
    base = torch.randn(side, side).to(torch.bfloat16)
    a2 = {f"layers.{i}.weight": torch.roll(base, i, 0) for i in range(64)}  # 64 own storages
    del base
    torch.save(a2, root / "A2.pt")
    del a2
    n = max(1, int(100_000 * scale))
    b = {f"model.layers.{i}.weight": torch.randn(16) for i in range(n)}
    torch.save(b, root / "B.pt")
    save_file(b, str(root / "B.safetensors"))


def make_files(folder: Path, scale: float) -> dict[str, Path]:
    """Write the files in a child process (peak RSS is inherited by later children)."""
    subprocess.run([sys.executable, str(HERE), "--make", str(folder), str(scale)], check=True)
    return {name: folder / f"{name}.pt" for name in ("A", "A2", "B")}


# -- measuring and printing -------------------------------------------------------------------
def run_child(task: str, path: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, str(HERE), "--child", task, str(path)],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{task} on {path.name} failed:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def measure_row(row: Row, files: dict[str, Path], repeat: int,
                cache: dict[tuple[str, str], list[dict[str, float]]]) -> None:
    """Run the row's two tasks alternately until each has ``repeat`` runs (cached per file)."""
    for _ in range(repeat):
        for task in (row.ours, row.theirs):
            runs = cache.setdefault((row.file, task), [])
            if len(runs) < repeat:
                runs.append(run_child(task, files[row.file]))


def _spread(values: Iterable[float], digits: int) -> str:
    v = list(values)
    return f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}-{max(v):.{digits}f}]"


def _seconds(runs: list[dict[str, float]]) -> str:
    digits = 4 if statistics.median(r["seconds"] for r in runs) < 0.1 else 3
    cpu = statistics.median(r["cpu"] for r in runs)
    rss = max(r["rss_mib"] for r in runs)
    return f"{_spread((r['seconds'] for r in runs), digits):>22} {cpu:7.3f} {rss:7.0f}"


def format_row(row: Row, ours: list[dict[str, float]], theirs: list[dict[str, float]]) -> str:
    ratios = [a["seconds"] / b["seconds"] for a, b in zip(ours, theirs, strict=False)]
    median = (statistics.median(r["seconds"] for r in ours)
              / statistics.median(r["seconds"] for r in theirs))
    spread = f"{median:.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
    cpu = (statistics.median(r["cpu"] for r in ours)
           / max(1e-9, statistics.median(r["cpu"] for r in theirs)))
    target = f"<= {row.target:.3g}" if row.target else "(shown)"
    met = "" if not row.target else ("met" if median <= row.target else "MISSED")
    return (f"{row.file:3} {row.operation:18} {_seconds(ours)}   {row.label:37} "
            f"{_seconds(theirs)}   {spread:>21} {cpu:6.3f} {target:>8} {met}")


HEADER = (f"{'':3} {'operation':18} {'ptfile s median [min-max]':>22} {'CPU s':>7} "
          f"{'RSS MiB':>7}   {'vs':37} {'other s median [min-max]':>22} {'CPU s':>7} "
          f"{'RSS MiB':>7}   {'ptfile/other':>21} {'CPU':>6} {'target':>8}")


def _describe(files: dict[str, Path], scale: float) -> str:
    sizes = {k: v.stat().st_size / 1e6 for k, v in files.items()}
    n = max(1, int(100_000 * scale))
    return (f"A: {sizes['A']:.0f} MB, 96 tensors;  A2: {sizes['A2']:.0f} MB, 64 tensors;  "
            f"B: {sizes['B']:.1f} MB, {n} tensors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="size factor for A, A2 and B")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per measurement, each in a fresh process (median shown)")
    parser.add_argument("--only", default="", metavar="TEXT",
                        help="run only the rows whose file + operation contains TEXT "
                             "(e.g. 'open', 'A2', 'B full')")
    parser.add_argument("--child", nargs=2, metavar=("TASK", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--make", nargs=2, metavar=("FOLDER", "SCALE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.make:
        _make(args.make[0], float(args.make[1]))
        return 0
    if args.child:
        _child(*args.child)
        return 0
    rows = [row for row in ROWS if args.only in f"{row.file} {row.operation}"]
    with tempfile.TemporaryDirectory(dir=os.environ.get("PTFILE_BENCH_DIR")) as tmp:
        files = make_files(Path(tmp), args.scale)
        print(_describe(files, args.scale), f";  --repeat {args.repeat}\n")
        print(HEADER)
        cache: dict[tuple[str, str], list[dict[str, float]]] = {}
        for row in rows:
            measure_row(row, files, args.repeat, cache)
            print(format_row(row, cache[row.file, row.ours], cache[row.file, row.theirs]),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
