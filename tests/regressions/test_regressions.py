"""One test per regression file (``<issue>-<slug>.bin``): its expected outcome, pinned.

Files come from the hostile corpus and the atheris harness (``fuzz/README.md``
lists what each one did before its fix).  Each is loaded in a child process, so
that a regression to a crash fails one test instead of the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

#: file → (outcome of ptfile.load, whether ptfile.scan must call it dangerous)
EXPECTED = {
    "4-deep-tuple-key.bin": ("LimitExceededError", True),
    "4-hash-flood-ints.bin": ("LimitExceededError", True),
    "4-build-ordereddict-defaults.bin": ("UnsafeGlobalError", True),
    "4-build-storage-type.bin": ("UnsafeGlobalError", True),
    "4-archive-in-comment.bin": ("*", True),
}

_CHILD = """
import json, sys, ptfile
from ptfile.allowlist.rebuild import SAFE_GLOBALS
path = sys.argv[1]
try:
    ptfile.load(path)
    outcome = "ok"
except ptfile.PtfileError as exc:
    outcome = type(exc).__name__
intact = SAFE_GLOBALS["collections", "OrderedDict"].__defaults__ == ((),) and \\
    SAFE_GLOBALS["torch", "FloatStorage"].name == "FloatStorage"
print(json.dumps({"load": outcome, "dangerous": ptfile.scan(path).is_dangerous, "intact": intact}))
"""


def test_regressions_every_file_has_an_expectation() -> None:
    assert sorted(p.name for p in HERE.glob("*.bin")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_issue_4_regression(name: str) -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(HERE / name)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    load, dangerous = EXPECTED[name]
    assert load in ("*", got["load"]), got
    assert got["dangerous"] is dangerous, got
    assert got["intact"], "an allowlisted object was changed by the file"
