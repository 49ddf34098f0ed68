"""A corpus for bulk runs: clean, dangerous, damaged files and files that are no checkpoint.

``corpus(n)`` gives ``n`` files (name -> bytes) cycling through :data:`KINDS`;
the name says the kind (``0007-dangerous-zip.pt``), so a test knows what each
record must say.  ``benchmarks/bulk.py`` uses it too.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Final

import numpy as np

import ptfile
from ptfile.archive import ZipWriter


def _clean(i: int, elems: int) -> bytes:
    buf = io.BytesIO()
    ptfile.save({"w": np.arange(elems, dtype="float32") + i, "step": i}, buf)
    return buf.getvalue()


def _torch(i: int, elems: int) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.arange(elems, dtype=torch.float32) + i}, buf)
    return buf.getvalue()


def _legacy(i: int, elems: int) -> bytes:
    buf = io.BytesIO()
    ptfile.save({"w": np.arange(elems, dtype="float32") - i}, buf,
                _use_new_zipfile_serialization=False)
    return buf.getvalue()


#: os.system("echo <i>") as GLOBAL + REDUCE: never run, only scanned.
def _system_pickle(i: int) -> bytes:
    arg = f"echo {i}".encode()
    return b"\x80\x02cposix\nsystem\nX" + len(arg).to_bytes(4, "little") + arg + b"\x85R."


def _dangerous_zip(i: int, elems: int) -> bytes:
    buf = io.BytesIO()
    with ZipWriter(buf.write, "archive") as writer:
        writer.write_record("data.pkl", _system_pickle(i))
        writer.write_record("data/0", bytes(4 * elems))
        writer.write_record("version", b"3\n")
    return buf.getvalue()


def _dangerous_pickle(i: int, elems: int) -> bytes:
    return _system_pickle(i)


def _damaged(i: int, elems: int) -> bytes:
    data = _clean(i, elems)
    return data[: len(data) * 3 // 5]  # the end records and the directory are gone


def _not_a_checkpoint(i: int, elems: int) -> bytes:
    return f"# notes {i}\nthis is not a checkpoint\n".encode() * 3


#: kind -> (suffix, writer); the corpus cycles through them in this order.
KINDS: Final[dict[str, tuple[str, Callable[[int, int], bytes]]]] = {
    "clean": (".pt", _clean),
    "clean2": (".bin", _clean),
    "torch": (".pt", _torch),
    "legacy": (".pth", _legacy),
    "dangerous-zip": (".pt", _dangerous_zip),
    "dangerous-pickle": (".pkl", _dangerous_pickle),
    "damaged": (".bin", _damaged),
    "not-a-checkpoint": (".ckpt", _not_a_checkpoint),
}


#: What each kind of corpus file must give, per command (the bulk API, the CLI's reports).
EXPECTED: Final = {
    "scan": {"clean": "allowed", "clean2": "allowed", "torch": "allowed", "legacy": "allowed",
             "dangerous-zip": "dangerous", "dangerous-pickle": "dangerous",
             "damaged": "error", "not-a-checkpoint": "error"},
    "verify": {"clean": "ok", "clean2": "ok", "torch": "ok", "legacy": "ok",
               "dangerous-zip": "ok", "dangerous-pickle": "error", "damaged": "damaged",
               "not-a-checkpoint": "error"},
}


def kind_of(name: str) -> str:
    """The kind a corpus file name carries."""
    stem = name.rsplit("/", 1)[-1].split(".")[0]
    return stem.split("-", 1)[1]


def corpus(n: int, elems: int = 64, with_torch: bool = True) -> dict[str, bytes]:
    """``n`` files, name -> bytes, in folders of 50 (``d00/0007-clean.pt``)."""
    kinds = [k for k in KINDS if with_torch or k != "torch"]
    out = {}
    for i in range(n):
        kind = kinds[i % len(kinds)]
        suffix, write = KINDS[kind]
        out[f"d{i // 50:02d}/{i:04d}-{kind}{suffix}"] = write(i, elems)
    return out


def die_on(command: str, url: str, options: object, out: object) -> dict[str, object]:
    """A stand-in for ``run_one`` for the pool tests: the worker process dies on "die"."""
    if url == "die":
        os._exit(3)
    return {"path": url, "command": command, "ok": True, "verdict": "clean", "exit_code": 0,
            "pid": os.getpid()}
