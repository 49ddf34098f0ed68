"""Write seed files for the harness: every format ptfile reads, plus the hostile corpus.

Usage: ``python fuzz/make_seeds.py fuzz/seeds`` (torch is needed for the legacy,
TorchScript and whole-model seeds).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "tests" / "support")]


def main(folder: str) -> None:
    from hostile import corpus  # test helpers: importable once sys.path is set
    from test_fuzz import SAMPLES

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in SAMPLES.items():
        (out / f"{name}.pt").write_bytes(data)
    for case in corpus(Path("/nonexistent")):
        (out / f"hostile-{case.name}.pt").write_bytes(case.data)


if __name__ == "__main__":
    main(sys.argv[1])
