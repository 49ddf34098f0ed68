"""What CPython's C unpickler really resolves and calls, run in a child process, inertly.

The child reads a pickle from stdin and unpickles it the way ``torch.load``
reads a ZIP record (``pickle.Unpickler`` over an ``io.BytesIO``, which has no
``peek()``), or over a buffered reader (with ``peek()``).  ``find_class``
records the name and returns a stand-in that records its calls; an audit hook
refuses process creation, so even a mistake runs nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys

_CHILD = r"""
import io, json, pickle, sys
def _block(event, args):
    if event in ("os.system", "subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork",
                 "os.spawn", "os.startfile"):
        raise RuntimeError("blocked " + event)
sys.addaudithook(_block)
found, calls = [], []
class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        found.append([module, name])
        def stand_in(*args, **kwargs):
            calls.append([module, name])
        return stand_in
    def persistent_load(self, pid):
        return None
data = sys.stdin.buffer.read()
file = io.BytesIO(data) if sys.argv[1] == "bytesio" else io.BufferedReader(io.BytesIO(data))
try:
    Unpickler(file).load()
    error = None
except Exception as exc:
    error = type(exc).__name__
print(json.dumps({"globals": found, "calls": calls, "error": error}))
"""


def c_unpickler(data: bytes, reader: str = "bytesio") -> dict[str, object]:
    """``{"globals": [[module, name]...], "calls": [...], "error": name or None}``."""
    out = subprocess.run([sys.executable, "-I", "-c", _CHILD, reader], input=data,
                         capture_output=True, check=True, timeout=60)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def resolved(data: bytes, reader: str = "bytesio") -> set[str]:
    """``module.name`` of every global the C unpickler resolves in ``data``."""
    names = c_unpickler(data, reader)["globals"]
    assert isinstance(names, list)
    return {f"{m}.{n}" for m, n in names}
