"""Several ``ptfile`` command lines in one child process, for tests that run a few in a row.

Each child that runs the command imports ptfile and numpy (and, for remote inputs,
huggingface_hub or fsspec) again: about 0.3 to 0.7 s of CPU before the command does
anything.  :func:`run_each` runs a test's command lines in turn in one fresh child, by the
entry point the installed ``ptfile`` script calls (``ptfile.cli.main``), and gives each
one's exit code, standard output and error output, as ``subprocess.run`` would have.  The
child inherits the test's environment, working directory and umask, like the script.

The tests of the installed script itself (``test_journeys.py``, ``tests/cli``) still run
it, one process per command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

#: Run as ``python -c``: each argument is one command line (a JSON list), run in turn;
#: prints ``[exit code, stdout, stderr]`` per command line as one JSON line.
_EACH = """
import contextlib, io, json, sys
from ptfile.cli import main
for argv in map(json.loads, sys.argv[1:]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    print(json.dumps([code, out.getvalue(), err.getvalue()]), flush=True)
"""


class Ran(NamedTuple):
    """One command line's outcome, named as ``subprocess.CompletedProcess`` names it."""

    returncode: int
    stdout: str
    stderr: str


def run_each(*commands: Sequence[str | Path], env: Mapping[str, str] | None = None,
             timeout: float = 120) -> list[Ran]:
    """Each command line (``["convert", src, out]``) run in turn in one child process."""
    done = subprocess.run([sys.executable, "-c", _EACH,
                           *(json.dumps([str(a) for a in c]) for c in commands)],
                          capture_output=True, text=True, check=False, timeout=timeout,
                          env=None if env is None else dict(env))
    assert done.returncode == 0, done.stderr
    results = [Ran(*json.loads(line)) for line in done.stdout.splitlines()]
    assert len(results) == len(commands), done.stdout + done.stderr
    return results
