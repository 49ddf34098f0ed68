"""Child process of test_hostile: load and scan every file of a folder, one JSON line each.

Run as ``python run_hostile.py FOLDER``; the parent sets memory limits.  A
result line is printed (and flushed) before the next case starts, so a crash
names its case: the last ``start`` line without a result.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import ptfile


def _outcome(action: object) -> tuple[str, bool]:
    """The outcome's class name, and whether a MemoryError hides in its chain."""
    try:
        action()  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - every class is reported: the parent checks it
        chained, memory = exc, False
        while chained is not None:
            memory = memory or isinstance(chained, MemoryError)
            chained = chained.__cause__ or chained.__context__
        return type(exc).__name__ + (f":{exc.limit}" if hasattr(exc, "limit") else ""), memory
    return "ok", False


def main(folder: str) -> None:
    for path in sorted(Path(folder).glob("*.pt")):
        print(json.dumps({"start": path.stem}), flush=True)
        row: dict[str, object] = {"case": path.stem}
        began = time.perf_counter()
        for key, action in (
            ("strict", lambda path=path: ptfile.load(path)),
            ("structural", lambda path=path: ptfile.load(path, structural=True)),
        ):
            row[key], row[f"{key}_memory"] = _outcome(action)
        try:
            result = ptfile.scan(path)
            row["scan"] = {"dangerous": result.is_dangerous, "clean": result.is_clean,
                           "json": json.dumps(result.to_dict()) != ""}
        except Exception as exc:  # noqa: BLE001 - the scanner must not fail on any input
            row["scan"] = {"error": f"{type(exc).__name__}: {exc}"}
        row["seconds"] = time.perf_counter() - began
        row["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
