"""Legacy tar and stream checkpoints with a sentinel payload, and the real loaders as oracle.

Files are built the way torch < 0.4 wrote them (the layout torch 2.13's ``legacy_load``
reads: members ``sys_info``, ``storages``, ``tensors``, ``pickle``) with stdlib
``tarfile`` or by hand (v7 headers without the ``ustar`` magic), and legacy streams
(five pickles) the way ``torch.save(_use_new_zipfile_serialization=False)`` writes them.
A payload is a pickle whose unpickling creates a sentinel file (``builtins.open(path,
"w")``).  :func:`fired` runs the real loaders on a batch of files in one sandboxed child
(``python -I``, torch imported once): an audit hook refuses process creation, sockets and
writes outside the sandbox folder; ``TMPDIR`` (where ``legacy_load`` extracts members) is
inside it.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

#: The legacy stream's magic number and protocol version (torch.serialization).
MAGIC = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
SYS_INFO = {"protocol_version": PROTOCOL_VERSION, "little_endian": True,
            "type_sizes": {"short": 2, "int": 4, "long": 8}}
#: Loaders the oracle runs: a path (torch tries tarfile first), a file object without a
#: fileno (torch reads a stream only), ``pickle.load``.
LOADERS = ("torch.load(path)", "torch.load(BytesIO)", "pickle.load")


class Payload:
    """Unpickling this creates ``path`` (``open(path, "w")``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def __reduce__(self) -> tuple[object, ...]:
        return (open, (self.path, "w"))


def dumps(obj: object, protocol: int = 2) -> bytes:
    return pickle.dumps(obj, protocol)


def float_storage() -> object:
    """``torch.FloatStorage``, as torch 0.3 pickled a storage's type."""
    import torch
    return torch.FloatStorage


def storages_member(entries: Sequence[tuple[object, object, object, bytes]],
                    views: object = (), protocol: int = 2, count: object | None = None) -> bytes:
    """``storages``: the count, then per storage ``(key, location, type)``, an int64 element
    count and the bytes (float32 elements), then the views list."""
    out = dumps(len(entries) if count is None else count, protocol)
    for key, location, kind, data in entries:
        out += dumps((key, location, kind), protocol)
        out += struct.pack("<q", len(data) // 4) + data
    return out + dumps(list(views), protocol)


def float_tensor() -> object:
    import torch
    return torch.FloatTensor


def tensors_member(entries: Sequence[tuple[object, object, Sequence[int]]],
                   protocol: int = 2) -> bytes:
    """``tensors``: the count, then per tensor ``(key, storage_key, type)``, int32 ndim, 4
    bytes, sizes, strides (contiguous) and an offset (all int64)."""
    out = dumps(len(entries), protocol)
    for key, storage, sizes in entries:
        out += dumps((key, storage, float_tensor()), protocol)
        strides, step = [], 1
        for size in reversed(sizes):
            strides.insert(0, step)
            step *= size
        out += struct.pack(f"<ii{len(sizes)}q{len(sizes)}qq", len(sizes), 0, *sizes, *strides, 0)
    return out


class _Persistent(pickle.Pickler):
    def __init__(self, file: io.BytesIO, protocol: int, ids: dict[int, str]) -> None:
        super().__init__(file, protocol)
        self.ids = ids

    def persistent_id(self, obj: object) -> object:
        return self.ids.get(id(obj))


class Ref:
    """In the ``pickle`` member: the tensor or storage of key ``key`` (a persistent id)."""

    def __init__(self, key: str) -> None:
        self.key = key


def pickle_member(obj: object, protocol: int = 2) -> bytes:
    """The object pickle: :class:`Ref` objects become persistent ids (their keys)."""
    refs: dict[int, str] = {}

    def collect(value: object) -> None:
        if isinstance(value, Ref):
            refs[id(value)] = value.key
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)

    collect(obj)
    out = io.BytesIO()
    _Persistent(out, protocol, refs).dump(obj)
    return out.getvalue()


def tar_file(members: Sequence[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A tar archive of regular members, as stdlib ``tarfile`` writes it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def v7_header(name: bytes, size: int, kind: bytes = b"0", magic: bytes = b"") -> bytes:
    """A 512-byte header without the ``ustar`` magic (v7), its checksum valid."""
    block = bytearray(512)
    block[:len(name)] = name
    block[100:108] = b"0000644\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"00000000000\0"
    block[156:157] = kind
    block[257:257 + len(magic)] = magic
    block[148:156] = b"        "
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def v7_tar(members: Sequence[tuple[str, bytes]], end: bool = True) -> bytes:
    """A tar archive of v7 headers (no ``ustar`` magic): ``tarfile`` reads it."""
    out = b""
    for name, data in members:
        out += v7_header(name.encode(), len(data)) + data + bytes(-len(data) % 512)
    return out + (bytes(1024) if end else b"")


def tar_checkpoint(*, sys_info: bytes | None = None, storages: bytes | None = None,
                   tensors: bytes | None = None, obj: bytes | None = None,
                   extra: Sequence[tuple[str, bytes]] = (), v7: bool = False,
                   fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """A torch 0.3 tar checkpoint of one 2x2 float tensor (key 0 on storage 1; the pickle
    names it by the persistent id ``"0"``, which torch reads with ``int()``), with any
    member replaced."""
    members = [
        ("sys_info", dumps(SYS_INFO) if sys_info is None else sys_info),
        ("pickle", pickle_member({"t": Ref("0")}) if obj is None else obj),
        ("tensors", tensors_member([(0, 1, (2, 2))]) if tensors is None else tensors),
        ("storages", storages_member([(1, "cpu", float_storage(),
                                       struct.pack("<4f", 1, 2, 3, 4))])
         if storages is None else storages),
        *extra,
    ]
    return v7_tar(members) if v7 else tar_file(members, fmt)


def legacy_stream(pickles: Sequence[bytes | None] = (None,) * 5, protocol: int = 2,
                  tail: bytes = b"") -> bytes:
    """A legacy stream of an empty dict: magic, protocol, sys_info, object, keys, with any
    of the five pickles replaced."""
    default = [dumps(MAGIC, protocol), dumps(PROTOCOL_VERSION, protocol),
               dumps(SYS_INFO, protocol), dumps({"a": 1}, protocol), dumps([], protocol)]
    return b"".join(d if p is None else p for d, p in zip(default, pickles, strict=True)) + tail


_CHILD = r"""
import io, json, os, pickle, sys, warnings
root = os.path.realpath(sys.argv[1])
warnings.simplefilter("ignore")
import torch

def inside(path):
    try:
        path = os.fsdecode(path)
    except TypeError:
        return False
    return os.path.realpath(os.path.join(os.getcwd(), path)).startswith(root + os.sep)

def hook(event, args):
    if event.startswith(("subprocess.", "socket.")) or event in (
            "os.system", "os.fork", "os.exec", "os.posix_spawn", "os.spawn", "ctypes.dlopen"):
        raise PermissionError("sandbox: " + event)
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        mode, flags = args[1] or "r", args[2] or 0
        if (any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR)) \
                and not inside(args[0]):
            raise PermissionError("sandbox: write outside the root")

sys.addaudithook(hook)

def by_path(p):
    return torch.load(p, map_location="cpu", weights_only=False)

def by_bytesio(p):
    with open(p, "rb") as f:
        return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=False)

def by_pickle(p):
    with open(p, "rb") as f:
        return pickle.load(f)

LOADERS = {"torch.load(path)": by_path, "torch.load(BytesIO)": by_bytesio,
           "pickle.load": by_pickle}
for line in sys.stdin:
    path, sentinel = json.loads(line)
    fired, errors = [], {}
    for name, load in LOADERS.items():
        try:
            load(path)
            errors[name] = None
        except BaseException as exc:
            errors[name] = type(exc).__name__ + ": " + str(exc)[:200]
        if os.path.lexists(sentinel):
            fired.append(name)
            os.remove(sentinel)
    print(json.dumps([fired, errors]), flush=True)
"""


def fired(root: Path, files: Sequence[tuple[bytes, Path]]) -> list[tuple[set[str], dict[str, str]]]:
    """For each ``(file bytes, sentinel)``: the loaders that created the sentinel, and each
    loader's error (None when it loaded)."""
    root = root.resolve()
    (root / "tmp").mkdir(exist_ok=True)
    lines = []
    for i, (data, sentinel) in enumerate(files):
        path = root / f"case{i}.pt"
        path.write_bytes(data)
        lines.append(json.dumps([str(path), str(sentinel)]))
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(root / "tmp"), "HOME": str(root),
           "OMP_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
    run = subprocess.run([sys.executable, "-I", "-c", _CHILD, str(root)], input="\n".join(lines),
                         capture_output=True, text=True, cwd=root, env=env, timeout=600,
                         check=False)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")]
    if len(rows) != len(files):
        raise RuntimeError(f"the oracle child answered {len(rows)} of {len(files)}:\n"
                           f"{run.stderr[-3000:]}")
    return [(set(f), e) for f, e in rows]
