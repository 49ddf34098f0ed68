"""``ptfile scan DIR`` on a repository of thousands of files, beside picklescan and modelscan.

Usage::

    python benchmarks/walk.py [--files 5000] [--repeat 3]   # needs the bench extra

A tree is generated here: ``--files`` files that are not checkpoints (Python sources,
Markdown, JSON, CSV, small binaries, a ``.git`` folder of zlib-compressed objects), spread
over nested folders, and 20 checkpoints torch writes (state dicts, a legacy file) among
them, two in a dot-folder.  Each scanner's command line scans the whole tree
(``ptfile scan DIR --format jsonl``, ``picklescan -p DIR``, ``modelscan -p DIR``), each in
its own process, ``--repeat`` times; the row gives the median wall time, the spread (fastest
to slowest) and the files of the tree per second at the median.  ptfile reads every file's
first bytes (the walk is torch's: content decides) and scans the checkpoints; picklescan and
modelscan pick files by their suffixes.
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
import zlib
from pathlib import Path

SCANNERS = {
    "ptfile": lambda root: [sys.executable, "-m", "ptfile", "scan", str(root), "--format",
                            "jsonl"],
    "picklescan": lambda root: [str(Path(sys.executable).parent / "picklescan"), "-p",
                                str(root)],
    "modelscan": lambda root: [str(Path(sys.executable).parent / "modelscan"), "-p",
                               str(root)],
}


def make_tree(root: Path, files: int) -> int:
    """Write the tree; return how many files it holds."""
    import torch

    kinds = [(".py", b"import os\n\ndef f(x):\n    return x + 1\n" * 20),
             (".md", b"# Title\n\nSome prose about the project.\n" * 30),
             (".json", b'{"a": [1, 2, 3], "b": {"c": "d"}}\n' * 10),
             (".csv", b"a,b,c\n1,2,3\n" * 50), (".png", b"\x89PNG\r\n\x1a\n" + bytes(600))]
    for i in range(files):
        folder = root / f"pkg{i % 40:02d}" / f"mod{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        if i % 10 == 0:
            git = root / ".git" / "objects" / f"{i % 256:02x}"
            git.mkdir(parents=True, exist_ok=True)
            (git / f"obj{i:05d}").write_bytes(zlib.compress(b"blob 100\0" + bytes(100)))
            continue
        suffix, data = kinds[i % len(kinds)]
        (folder / f"f{i:05d}{suffix}").write_bytes(data)
    for i in range(20):
        folder = root / (".cache" if i < 2 else f"pkg{i:02d}") / "weights"
        folder.mkdir(parents=True, exist_ok=True)
        state = {"w": torch.randn(64, 64), "b": torch.zeros(64)}
        torch.save(state, folder / f"model{i}.pt", _use_new_zipfile_serialization=i % 5 != 0)
    return sum(len(names) for _, _, names in os.walk(root))


def timed(command: list[str], repeat: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=env, check=False)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ptfile-walk-"))
    try:
        total = make_tree(root, args.files)
        print(f"{total} files ({args.files} not checkpoints, 20 checkpoints), "
              f"{args.repeat} runs each")
        print(f"{'scanner':12} {'median s':>9} {'spread s':>13} {'files/s':>9}")
        for name, command in SCANNERS.items():
            times = timed(command(root), args.repeat)
            median = statistics.median(times)
            print(f"{name:12} {median:9.2f} {min(times):6.2f}-{max(times):<6.2f} "
                  f"{total / median:9.0f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
