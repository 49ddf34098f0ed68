"""Start-up time of the command line, side by side with the torch-free scanners.

Usage::

    python benchmarks/startup.py [--runs 15]     # picklescan and modelscan: the bench extra

Each row is a fresh process, run ``--runs`` times after one warm-up, on one small
checkpoint written here (``torch.save`` of a 2-tensor state dict when torch is
installed, else ``ptfile.save``): ``import ptfile``; ``ptfile --help``;
``ptfile scan`` of the file; ``picklescan -p`` and ``modelscan -p`` of the same
file.  It prints the median, min and max wall time of each and the ratios the
targets are stated in (issue 25): ``ptfile --help`` and ``ptfile scan`` at most
2x picklescan's time, and faster than modelscan.  A scanner that is not
installed is left out.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _timed(cmd: list[str], runs: int) -> list[float]:
    subprocess.run(cmd, capture_output=True, check=False)  # warm-up: page cache, pyc
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False)
        out.append(time.perf_counter() - start)
    return out


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
        medians = {}
        print(f"{'command':<16} {'median':>8} {'min':>8} {'max':>8}   ({args.runs} runs)")
        for name, cmd in rows.items():
            times = _timed(cmd, args.runs)
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
