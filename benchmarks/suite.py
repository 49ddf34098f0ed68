"""How long ``make test`` takes on a fresh clone, and how much memory it holds at once.

``python benchmarks/suite.py [--runs N] [--target check|test] [--python python3]`` clones
this repository's HEAD into a temporary folder N times (default 1), runs ``make TARGET`` there
(which creates ``.venv``, installs the extras and runs the suite: docs/development.md), and
prints for each run its wall time, the time pytest reports and the peak of the memory held by
the whole process tree at once, then the minimum, median and maximum over the runs.

Memory is the proportional set size (PSS, ``/proc/PID/smaps_rollup``) summed over ``make``
and every process below it, sampled every half second: a page shared by several processes
(torch's libraries, mapped by each worker and child) counts once in the sum, split between
them, where summing RSS would count it in each.  Linux only.  The clone is removed after each
run; nothing is written in this checkout.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fp:
                    parent = int(fp.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(parent, []).append(int(entry))
    return kids


def _tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fp:
            for line in fp:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_once(target: str, python: str) -> tuple[float, float | None, float, str]:
    """One fresh clone, ``make target``: (wall s, pytest's s, peak PSS GiB, output tail)."""
    folder = Path(tempfile.mkdtemp(prefix="ptfile-suite-"))
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(folder / "repo")], check=True)
        log = folder / "make.log"
        began = time.perf_counter()
        with open(log, "wb") as out:
            proc = subprocess.Popen(["make", target, f"PYTHON={python}"], cwd=folder / "repo",
                                    stdout=out, stderr=subprocess.STDOUT)
            peak = 0
            while proc.poll() is None:
                peak = max(peak, sum(_pss_kib(pid) for pid in _tree(proc.pid)))
                time.sleep(0.5)
        wall = time.perf_counter() - began
        text = log.read_text(errors="replace")
        if proc.returncode:
            raise SystemExit(f"make {target} failed ({proc.returncode}):\n{text[-3000:]}")
        found = re.findall(r" in ([0-9.]+)s(?: \(|$)", text, re.MULTILINE)
        return wall, float(found[-1]) if found else None, peak / 2**20, text[-300:]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _spread(values: list[float]) -> str:
    return (f"min {min(values):.0f}  median {statistics.median(values):.0f}  "
            f"max {max(values):.0f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--target", default="test", choices=("test", "check"))
    parser.add_argument("--python", default="python3", help="the interpreter make's venv uses")
    args = parser.parse_args(argv)
    walls, pytests, peaks = [], [], []
    for i in range(args.runs):
        wall, in_pytest, peak, _ = run_once(args.target, args.python)
        walls.append(wall)
        peaks.append(peak)
        if in_pytest is not None:
            pytests.append(in_pytest)
        print(f"run {i + 1}: make {args.target} {wall:.0f} s (pytest {in_pytest} s), "
              f"peak PSS {peak:.2f} GiB", flush=True)
    print(f"wall s: {_spread(walls)}")
    if pytests:
        print(f"pytest s: {_spread(pytests)}")
    print(f"peak PSS GiB: min {min(peaks):.2f}  median {statistics.median(peaks):.2f}  "
          f"max {max(peaks):.2f}")


if __name__ == "__main__":
    sys.exit(main())
