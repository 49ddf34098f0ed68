"""Running the installed ``ptfile`` command with its stdout on a pseudo-terminal, as a
person sees it (the CLI's text reports, the table of a folder, inert names)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: The installed command beside the test's interpreter.
PTFILE = str(Path(sys.executable).parent / "ptfile")


def on_terminal(*args: object, cwd: Path | None = None) -> tuple[int, str, str]:
    """The command run with stdout on a pseudo-terminal (``os.openpty``), stderr on a
    pipe: its exit code, what it wrote (the tty's ``\\r\\n`` as ``\\n``), its stderr."""
    master, slave = os.openpty()
    proc = subprocess.Popen([PTFILE, *map(str, args)], stdout=slave, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, cwd=cwd)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # EIO: the command closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    code = proc.wait(timeout=120)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    proc.stderr.close()
    return code, b"".join(chunks).decode().replace("\r\n", "\n"), err
