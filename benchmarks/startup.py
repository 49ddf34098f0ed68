"""Start-up time of the command line, side by side with the torch-free scanners.

Usage::

    python benchmarks/startup.py [--runs 15]     # picklescan and modelscan: the bench extra

Each row is a fresh process, run ``--runs`` times after one warm-up, on one small
checkpoint written here (``torch.save`` of a 2-tensor state dict when torch is
installed, else ``ptfile.save``): ``import ptfile``; ``ptfile --help``;
``ptfile scan`` of the file; ``picklescan -p`` and ``modelscan -p`` of the same
file.  The rows take turns (one run of each per round), so a machine whose load
changes during the run slows every row alike.  Every process may write and read
bytecode caches, in a temporary ``PYTHONPYCACHEPREFIX`` (as an installed package has
them; with ``PYTHONDONTWRITEBYTECODE`` set, an editable checkout would compile every
module on every run, the installed scanners none).  It prints the median, min and max
wall time of each and the ratios the targets are stated in (issue 25): ``ptfile --help``
and ``ptfile scan`` at most 2x picklescan's time, and faster than modelscan.  A scanner
that is not installed is left out.

Measured (Python 3.11, picklescan 1.0.5, modelscan 0.8.8, 15 runs; a 2-core machine
shared with other work, so the spread is wide and three runs are given: medians, then
min-max)::

    command          run 1                 run 2                 run 3
    import ptfile    0.026 (0.024-0.050)   0.024 (0.021-0.027)   0.024 (0.020-0.033)
    ptfile --help    0.037 (0.034-0.060)   0.036 (0.033-0.050)   0.034 (0.031-0.044)
    ptfile scan      0.109 (0.097-0.182)   0.098 (0.095-0.141)   0.098 (0.088-0.131)
    picklescan -p    0.083 (0.075-0.139)   0.075 (0.069-0.085)   0.074 (0.067-0.081)
    modelscan -p     0.197 (0.167-0.315)   0.215 (0.185-0.245)   0.218 (0.150-0.258)
    scan/picklescan  1.31                  1.30                  1.33
    scan/modelscan   0.55                  0.45                  0.45

Before the scan path dropped numpy (the archive's and the formats' faces made lazy),
the same run gave ``ptfile scan`` 0.211 (0.181-0.264): 2.65x picklescan, 1.05x
modelscan.  Without bytecode caches (``PYTHONDONTWRITEBYTECODE=1``, every module
compiled on every run) ``ptfile scan`` takes 0.174 s against picklescan's 0.078 and
modelscan's 0.225 (medians of 15).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _timed(rows: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Each command's wall times, the commands taking turns, after one warm-up each
    (page cache, bytecode)."""
    for cmd in rows.values():
        subprocess.run(cmd, capture_output=True, check=False, env=env)
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(runs):
        for name, cmd in rows.items():
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=False, env=env)
            times[name].append(time.perf_counter() - start)
    return times


def _checkpoint(folder: Path) -> Path:
    path = folder / "small.pt"
    try:
        import torch

        torch.save({"w": torch.ones(4, 4), "b": torch.zeros(4)}, path)
    except ImportError:
        import numpy as np

        import ptfile

        ptfile.save({"w": np.ones((4, 4), "float32"), "b": np.zeros(4, "float32")}, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    bindir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        small = str(_checkpoint(Path(tmp)))
        rows = {
            "import ptfile": [sys.executable, "-c", "import ptfile"],
            "ptfile --help": [str(bindir / "ptfile"), "--help"],
            "ptfile scan": [str(bindir / "ptfile"), "scan", small],
        }
        for name, cmd in (("picklescan", ["-p", small]), ("modelscan", ["-p", small])):
            exe = shutil.which(name, path=str(bindir)) or shutil.which(name)
            if exe:
                rows[f"{name} -p"] = [exe, *cmd]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        medians = {}
        print(f"{'command':<16} {'median':>8} {'min':>8} {'max':>8}   ({args.runs} runs)")
        for name, times in _timed(rows, args.runs, env).items():
            medians[name] = statistics.median(times)
            print(f"{name:<16} {medians[name]:8.3f} {min(times):8.3f} {max(times):8.3f}")
    base = medians.get("picklescan -p")
    other = medians.get("modelscan -p")
    for name in ("ptfile --help", "ptfile scan"):
        if base:
            print(f"{name} / picklescan: {medians[name] / base:.2f} (target <= 2)")
        if other:
            print(f"{name} / modelscan:  {medians[name] / other:.2f} (target < 1)")


if __name__ == "__main__":
    main()
