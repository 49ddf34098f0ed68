"""Container variants with a payload where a real loader might reach it (the scan harness).

A variant is a :class:`Recipe`: a technique and the parameters hypothesis drew for it.
:func:`build` turns a recipe and a sentinel path into the file's bytes; the payload (a
``__reduce__``) only creates the sentinel: ``open(path, "w")``, ``os.mkdir(path)`` or
``pathlib.Path(path).touch()``.  Building from a recipe keeps every case reproducible by
code (a regression test is a recipe), and lets the harness give each file its own sentinel.

Techniques (:data:`TECHNIQUES`), each from what torch 2.13's loaders read:

``zip.data``       torch.save's ZIP layout built by hand, the payload in the record torch
                   unpickles (``<prefix>/data.pkl``, looked up case-insensitively by miniz),
                   with the name's case, the folder, record order, compression, bytes before
                   and after varied;
``zip.record``     a benign ``data.pkl``, the payload in another record (``constants.pkl``
                   makes the file TorchScript, ``bytecode.pkl``, ``extra/``, a storage...);
``zip.around``     a benign torch ZIP with the payload pickle before it (torch falls back to
                   the legacy reader, ``pickle.load`` reads byte 0) or after it;
``legacy``         the legacy stream's five pickles (magic, protocol, sys_info, object,
                   storage keys), each at any protocol, the payload at any position, raw
                   storage bytes after;
``tar``            a legacy tar (members ``storages``, ``tensors``, ``pickle``) with ustar,
                   GNU, PAX or magic-less (v7) headers, any key types and ranks, the payload
                   in any record, after records a strict reader refuses;
``torchscript``    a torch.jit.save'd module, the payload in one of its records, names in
                   other cases;
``pt2``            a torch.export.save'd program, the payload in each record role torch.export
                   unpickles (``use_pickle`` weights and tensor constants, opaque objects,
                   sample inputs) and in the legacy (``serialized_*``) layout, names in other
                   cases, subfolders;
``pickle``         a bare payload pickle (protocols 0-5), with bytes after it.

:func:`benign_files` are files torch writes (state dicts of many dtypes, protocols 2-5, the
legacy format, TorchScript, ``torch.export``): they must scan clean.
"""

from __future__ import annotations

import functools
import io
import json
import operator
import os
import pathlib
import pickle
import struct
import tarfile
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

# --------------------------------------------------------------------------- payloads


class _Open:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


class _Mkdir(_Open):
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


class _Touch(_Open):
    def __reduce__(self) -> tuple[Any, ...]:
        return (operator.methodcaller("touch"), (pathlib.PurePosixPath(self.path),))


class _TouchPath(_Open):
    """``methodcaller("touch")(PosixPath(path))``: a concrete path, so it can touch."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (operator.methodcaller("touch"), (pathlib.PosixPath(self.path),))


PAYLOADS: dict[str, Callable[[str], object]] = {
    "open": _Open, "mkdir": _Mkdir, "touch": _TouchPath,
}


def payload(kind: str, sentinel: str, protocol: int) -> bytes:
    """A pickle that creates ``sentinel`` when unpickled, and nothing else."""
    return pickle.dumps(PAYLOADS[kind](sentinel), protocol=protocol)


def _dumps(obj: object, protocol: int) -> bytes:
    return pickle.dumps(obj, protocol=protocol)


# --------------------------------------------------------------------------- containers


def zip_of(records: list[tuple[str, bytes]], *, deflate: bool = False) -> bytes:
    """A ZIP of ``records`` in order, names as given (case, folders, duplicates kept)."""
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", method) as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # duplicate names are meant
        for name, data in records:
            zf.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data, compress_type=method)
    return buf.getvalue()


def torch_zip(data_pkl: bytes, prefix: str = "archive", data_name: str = "data.pkl",
              extra: list[tuple[str, bytes]] | None = None, first: str = "data") -> bytes:
    """torch.save's layout: ``<prefix>/data.pkl``, ``byteorder``, ``version``... (no storages)."""
    records = [(f"{prefix}/{data_name}", data_pkl), (f"{prefix}/byteorder", b"little"),
               (f"{prefix}/version", b"3\n"), (f"{prefix}/.data/serialization_id", b"0" * 40)]
    if first != "data":
        records = records[1:] + records[:1]
    return zip_of(records + (extra or []))


BENIGN_OBJECT: dict[str, Any] = {"epoch": 3, "lr": 0.5, "name": "run", "ids": [1, 2]}

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
SYS_INFO = {"protocol_version": PROTOCOL_VERSION, "little_endian": True,
            "type_sizes": {"short": 2, "int": 4, "long": 4}}


def _case(name: str, how: str) -> str:
    return {"same": name, "upper": name.upper(), "title": name.title(), "swap": name.swapcase()}[how]


# --------------------------------------------------------------------------- recipes


@dataclass(frozen=True)
class Recipe:
    """One variant: a technique of :data:`TECHNIQUES` and the parameters drawn for it."""

    technique: str
    params: dict[str, Any] = field(hash=False)

    def suffix(self) -> str:
        return ".pt2" if self.technique == "pt2" else ".pt"

    def label(self) -> str:
        return f"{self.technique}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"


def build(recipe: Recipe, sentinel: str) -> bytes:
    """The file's bytes for ``recipe``, its payload creating ``sentinel``."""
    return TECHNIQUES[recipe.technique][0](sentinel, **recipe.params)


_kinds = st.sampled_from(sorted(PAYLOADS))
_protocols = st.integers(0, 5)
_cases = st.sampled_from(["same", "upper", "title", "swap"])
_JUNK = [b"\x00", b"junk\n", b"PK\x05\x06" + b"\x00" * 18, b"\x80\x02N."]
_junk = st.sampled_from([b"", *_JUNK])
_rare_junk = st.sampled_from([b""] * 6 + _JUNK)  # mostly none: other changes stay visible


def _zip_data(sentinel: str, kind: str, protocol: int, prefix: str, case: str, prefix_case: str,
              nested: bool, first: str, deflate: bool, before: bytes, after: bytes) -> bytes:
    body = PAYLOADS[kind](sentinel)
    data = _dumps({"w": body, "n": 1} if nested else body, protocol)
    prefix = _case(prefix, prefix_case)
    records = [(f"{prefix}/{_case('data.pkl', case)}", data),
               (f"{prefix}/byteorder", b"little"), (f"{prefix}/version", b"3\n")]
    if first != "data":
        records = records[1:] + records[:1]
    return before + zip_of(records, deflate=deflate) + after


_ZIP_DATA = st.fixed_dictionaries({
    "kind": _kinds, "protocol": _protocols,
    "prefix": st.sampled_from(["archive", "a", "model", "Archive", "x.y", "long_name-1"]),
    "case": _cases, "prefix_case": _cases, "nested": st.booleans(),
    "first": st.sampled_from(["data", "version"]), "deflate": st.booleans(),
    "before": _rare_junk, "after": _rare_junk,
})


_RECORDS = ["constants.pkl", "bytecode.pkl", "extra/x.pkl", "data/0", "other.pkl",
            "CONSTANTS.PKL", "code/__torch__.py", "data.pkl.bak", ".data/x.pkl",
            "../data.pkl", "data.pkl/"]


def _zip_record(sentinel: str, kind: str, protocol: int, record: str, benign_protocol: int,
                before_data: bool) -> bytes:
    extra = [(f"archive/{record}", payload(kind, sentinel, protocol))]
    data = _dumps(BENIGN_OBJECT, benign_protocol)
    if before_data:
        return zip_of([*extra, ("archive/data.pkl", data), ("archive/version", b"3\n")])
    return torch_zip(data, extra=extra)


_ZIP_RECORD = st.fixed_dictionaries({
    "kind": _kinds, "protocol": _protocols, "record": st.sampled_from(_RECORDS),
    "benign_protocol": st.integers(2, 5), "before_data": st.booleans(),
})


def _zip_around(sentinel: str, kind: str, protocol: int, where: str, gap: bytes) -> bytes:
    archive = torch_zip(_dumps(BENIGN_OBJECT, 2))
    body = payload(kind, sentinel, protocol)
    return body + gap + archive if where == "before" else archive + gap + body


_ZIP_AROUND = st.fixed_dictionaries({
    "kind": _kinds, "protocol": _protocols, "where": st.sampled_from(["before", "after"]),
    "gap": _junk,
})


def _legacy(sentinel: str, kind: str, protocols: list[int], position: int, nested: bool,
            tail: bytes, broken_before: bool) -> bytes:
    body: object = PAYLOADS[kind](sentinel)
    objects: list[object] = [MAGIC_NUMBER, PROTOCOL_VERSION, dict(SYS_INFO), BENIGN_OBJECT, []]
    if nested:
        wrapped = {0: [body], 1: [body], 2: {**SYS_INFO, "extra": body},
                   3: {**BENIGN_OBJECT, "w": body}, 4: [body]}
        objects[position] = wrapped[position]
    else:
        objects[position] = body
    if broken_before and position > 0:
        objects[position - 1] = "not what torch expects"
    return b"".join(_dumps(o, p) for o, p in zip(objects, protocols, strict=True)) + tail


_LEGACY = st.fixed_dictionaries({
    "kind": _kinds, "protocols": st.lists(_protocols, min_size=5, max_size=5),
    "position": st.integers(0, 4), "nested": st.booleans(),
    "tail": st.sampled_from([b"", b"\x00" * 8, struct.pack("<q", 1) + b"\x00" * 4]),
    "broken_before": st.booleans(),
})


# legacy tar: keys of any hashable type, storages of the right sizes, tensors of any rank

_KEYS: dict[str, Callable[[int], object]] = {
    "str": str, "int": int, "tuple": lambda i: (i, "k"), "bytes": lambda i: b"k%d" % i,
    "float": lambda i: i + 0.5, "none_tuple": lambda i: (None, i),
}


def _storage_args_plain(key: object, protocol: int) -> bytes:
    """MARK key "cpu" GLOBAL(torch.FloatStorage) TUPLE STOP, the key pickled at ``protocol``."""
    key_ops = _bare(key, protocol)
    loc_ops = _bare("cpu", protocol)
    proto = bytes([0x80, protocol]) if protocol >= 2 else b""
    return proto + b"(" + key_ops + loc_ops + b"ctorch\nFloatStorage\nt."


def _bare(obj: object, protocol: int) -> bytes:
    """The opcodes that push ``obj`` (no PROTO, FRAME or STOP; memo ops are harmless)."""
    raw = pickle.dumps(obj, protocol=protocol)
    if protocol >= 2:
        raw = raw[2:]
    if raw.startswith(b"\x95"):
        raw = raw[9:]
    return raw[:-1]


def _tar_members(sentinel: str, kind: str, protocol: int, key: str, ranks: list[int],
                 position: str) -> dict[str, bytes]:
    keyfn = _KEYS[key]
    nstorages = len(ranks)
    bad = PAYLOADS[kind](sentinel)

    def p(obj: object) -> bytes:
        return _dumps(obj, protocol)

    storages = p(bad) if position == "num_storages" else p(nstorages)
    for i in range(nstorages):
        if position == "storage_args" and i == nstorages - 1:
            storages += p(bad)
            break
        storages += _storage_args_plain(keyfn(i), protocol)
        storages += struct.pack("<q", 4) + struct.pack("<4f", 1, 2, 3, 4)
    else:
        storages += p(bad) if position == "storage_views" else p([])
    tensors = p(bad) if position == "num_tensors" else p(nstorages)
    for i, rank in enumerate(ranks):
        if position == "tensor_args" and i == nstorages - 1:
            tensors += p(bad)
            break
        tensors += _dumps((f"t{i}", keyfn(i), None), protocol)
        sizes = [1] * rank
        tensors += struct.pack("<i", rank) + b"\x00" * 4
        tensors += struct.pack(f"<{rank}q", *sizes) + struct.pack(f"<{rank}q", *sizes)
        tensors += struct.pack("<q", 0)
    obj = p({"w": bad}) if position == "pickle" else p(BENIGN_OBJECT)
    return {"storages": storages, "tensors": tensors, "pickle": obj}


def _tar(sentinel: str, kind: str, protocol: int, key: str, ranks: list[int], position: str,
         header: str, order: list[str], extra_member: bool) -> bytes:
    members = _tar_members(sentinel, kind, protocol, key, ranks or [1], position)
    fmt = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT,
           "v7": tarfile.USTAR_FORMAT}[header]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        if extra_member:
            info = tarfile.TarInfo("README")
            info.size = 3
            tf.addfile(info, io.BytesIO(b"hi\n"))
        for name in order:
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            info.mtime = 0
            tf.addfile(info, io.BytesIO(members[name]))
    data = bytearray(buf.getvalue())
    if header == "v7":  # no ustar magic: tarfile accepts a header by its checksum alone
        at = 0
        while at + 512 <= len(data) and data[at:at + 512].strip(b"\x00"):
            block = data[at:at + 512]
            size = int(block[124:136].strip(b"\x00 ") or b"0", 8)
            block[257:265] = b"\x00" * 8
            block[148:156] = b" " * 8
            block[148:156] = b"%06o\x00 " % sum(block)
            data[at:at + 512] = block
            at += 512 + (size + 511) // 512 * 512
    return bytes(data)


_TAR_POSITIONS = ["num_storages", "storage_args", "storage_views", "num_tensors",
                  "tensor_args", "pickle"]
_TAR = st.fixed_dictionaries({
    "kind": _kinds, "protocol": _protocols, "key": st.sampled_from(sorted(_KEYS)),
    "ranks": st.lists(st.integers(0, 3), min_size=1, max_size=3),
    "position": st.sampled_from(_TAR_POSITIONS),
    "header": st.sampled_from(["ustar", "gnu", "pax", "v7"]),
    "order": st.permutations(["storages", "tensors", "pickle"]),
    "extra_member": st.booleans(),
})


# TorchScript and .pt2: a real file written by torch once, then rebuilt with the payload


@functools.cache
def torchscript_bytes() -> bytes:
    """A torch.jit.save'd module (torch imported here, in the parent only)."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(Tiny()), buf)
    return buf.getvalue()


def _records(data: bytes) -> tuple[tuple[str, bytes], ...]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return tuple((i.filename, zf.read(i)) for i in zf.infolist())


def torchscript_base() -> tuple[tuple[str, bytes], ...]:
    """The records of :func:`torchscript_bytes`."""
    return _records(torchscript_bytes())


def _rename(name: str, target: str, case: str) -> str:
    head, _, tail = name.partition("/")
    return f"{head}/{_case(tail, case)}" if tail == target or tail.startswith(target) else name


def _torchscript(sentinel: str, kind: str, protocol: int, record: str, case: str,
                 mode: str) -> bytes:
    records = list(torchscript_base())
    prefix = records[0][0].split("/", 1)[0]
    body = payload(kind, sentinel, protocol)
    out: list[tuple[str, bytes]] = []
    replaced = False
    for name, data in records:
        tail = name.split("/", 1)[1]
        if tail == record and mode == "replace":
            out.append((f"{prefix}/{_case(tail, case)}", body))
            replaced = True
        else:
            out.append((_rename(name, "code/", case) if record == "code/" else name, data))
    if not replaced:
        out.append((f"{prefix}/{_case(record, case)}", body))
    return zip_of(out)


_TORCHSCRIPT = st.fixed_dictionaries({
    "kind": _kinds, "protocol": _protocols,
    "record": st.sampled_from(["data.pkl", "constants.pkl", "extra/payload.pkl",
                               "bytecode.pkl", "code/", ".data/version"]),
    "case": _cases, "mode": st.sampled_from(["replace", "add"]),
})


@functools.cache
def pt2_bytes() -> bytes:
    """A torch.export.save'd tiny program (torch imported here only)."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.register_buffer("b", torch.ones(2))
            self.c = torch.zeros(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + self.b + self.c

    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.export.save(torch.export.export(Tiny(), (torch.ones(1, 2),)), buf)
    return buf.getvalue()


def pt2_base() -> tuple[tuple[str, bytes], ...]:
    """The records of :func:`pt2_bytes`."""
    return _records(pt2_bytes())


def _wrap(body: bytes, wrapper: str) -> bytes:
    """The payload as torch.load reads it: a bare pickle, a torch ZIP, or a legacy stream."""
    if wrapper == "zip":
        return torch_zip(body)
    if wrapper == "legacy":
        return body + _dumps(PROTOCOL_VERSION, 2)
    return body


def _pt2(sentinel: str, kind: str, protocol: int, role: str, wrapper: str, case: str,
         subfolder: bool, prefix: str) -> bytes:
    records = dict(pt2_base())
    old = next(iter(records)).split("/", 1)[0]
    records = {f"{prefix}/{k.split('/', 1)[1]}": v for k, v in records.items()}
    body = _wrap(payload(kind, sentinel, protocol), wrapper)
    sub = "sub/" if subfolder else ""
    del old
    if role == "legacy_layout":
        ep = records[f"{prefix}/models/model.json"]
        return zip_of([("version", b"1"), ("serialized_exported_program.json", ep),
                       ("serialized_state_dict.pt", body), ("serialized_constants.pt", body),
                       ("serialized_example_inputs.pt", body)])
    if role == "sample_inputs":
        records[f"{prefix}/data/sample_inputs/model.pt"] = body
    elif role in ("weight", "tensor_constant", "opaque", "custom_obj"):
        folder = "weights" if role == "weight" else "constants"
        config_name = f"{prefix}/data/{folder}/model_{folder}_config.json"
        config = json.loads(records[config_name])
        fqn, meta = next(iter(config["config"].items()))
        stem = {"weight": "weight_9", "tensor_constant": "tensor_9", "opaque": "opaque_obj_9",
                "custom_obj": "custom_obj_9"}[role]
        meta = dict(meta, path_name=sub + stem, use_pickle=role in ("weight", "tensor_constant"))
        config["config"] = {**config["config"], fqn: meta}
        records[config_name] = json.dumps(config).encode()
        records[f"{prefix}/data/{folder}/{_case(sub + stem, case)}"] = body
    elif role == "archive_format_case":
        records = {(_case(k, case) if k.endswith("archive_format") else k): v
                   for k, v in records.items()}
        records[f"{prefix}/data/sample_inputs/model.pt"] = body
    return zip_of(list(records.items()))


_PT2 = st.fixed_dictionaries({
    "kind": _kinds, "protocol": _protocols,
    "role": st.sampled_from(["sample_inputs", "weight", "tensor_constant", "opaque",
                             "custom_obj", "legacy_layout", "archive_format_case"]),
    "wrapper": st.sampled_from(["bare", "zip", "legacy"]), "case": _cases,
    "subfolder": st.booleans(), "prefix": st.sampled_from(["model", "archive", "M"]),
})


def _pickle(sentinel: str, kind: str, protocol: int, after: bytes) -> bytes:
    return payload(kind, sentinel, protocol) + after


_PICKLE = st.fixed_dictionaries({"kind": _kinds, "protocol": _protocols, "after": _junk})


#: technique -> (builder(sentinel, **params) -> bytes, strategy of params)
TECHNIQUES: dict[str, tuple[Callable[..., bytes], st.SearchStrategy[dict[str, Any]]]] = {
    "zip.data": (_zip_data, _ZIP_DATA),
    "zip.record": (_zip_record, _ZIP_RECORD),
    "zip.around": (_zip_around, _ZIP_AROUND),
    "legacy": (_legacy, _LEGACY),
    "tar": (_tar, _TAR),
    "torchscript": (_torchscript, _TORCHSCRIPT),
    "pt2": (_pt2, _PT2),
    "pickle": (_pickle, _PICKLE),
}


def recipes(techniques: list[str] | None = None) -> st.SearchStrategy[Recipe]:
    """Recipes of the given techniques (all by default)."""
    names = techniques or sorted(TECHNIQUES)
    return st.one_of(*(TECHNIQUES[n][1].map(functools.partial(Recipe, n)) for n in names))


# --------------------------------------------------------------------------- benign files


def benign_files() -> dict[str, bytes]:
    """Files torch writes with nothing to run: each must scan clean (exit 0)."""
    import torch

    out: dict[str, bytes] = {}
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
              torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
              torch.complex64, torch.float8_e4m3fn]
    for dtype in dtypes:
        for protocol in (2, 3, 4, 5):
            for zipped in (True, False):
                state = {"w": torch.ones(3, 2).to(dtype), "b": torch.zeros(2).to(dtype)[1:]}
                buf = io.BytesIO()
                torch.save(state, buf, pickle_protocol=protocol,
                           _use_new_zipfile_serialization=zipped)
                name = f"state-{str(dtype).split('.')[-1]}-p{protocol}-{'zip' if zipped else 'legacy'}"
                out[name] = buf.getvalue()
    lin = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    for protocol in (2, 4):
        buf = io.BytesIO()
        torch.save({"model": lin.state_dict(), "step": 7, "opt": {"lr": 0.1}}, buf,
                   pickle_protocol=protocol)
        out[f"training-p{protocol}"] = buf.getvalue()
    out["torchscript"] = torchscript_bytes()
    out["export"] = pt2_bytes()
    return out


def write_benign(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """:func:`benign_files` written under ``folder`` (``.pt2`` for the exported program)."""
    paths = {}
    for name, data in benign_files().items():
        path = folder / f"benign-{name}{'.pt2' if name == 'export' else '.pt'}"
        path.write_bytes(data)
        paths[name] = path
    return paths
