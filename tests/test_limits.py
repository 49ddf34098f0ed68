"""Every ceiling on untrusted input is a ``ptfile.Limits`` field (issue 24).

For each field added by that issue: a small value passed in ``Limits(...)`` makes
the matching input fail (``LimitExceededError`` with ``limit``, ``maximum`` and
``actual``) or, in ``scan``, be flagged, while the defaults read the same input
as torch does.  And the source holds no module-level ``MAX_*`` constant but the
facts of a format (or of numpy, CPython, torch) and the thresholds that choose
*how* work is done, each listed in :data:`NOT_CEILINGS` with its reason.
"""

from __future__ import annotations

import ast
import pickle
import struct
import zlib
from pathlib import Path
from typing import Final

import pytest
import torch

import ptfile
from hostile import tar
from ptfile.allowlist.structural import state_dict

SOURCE: Final = Path(__file__).resolve().parents[1] / "src" / "ptfile"

#: Module-level ``MAX_*`` constants that are no ceiling on untrusted input, and why.
NOT_CEILINGS: Final[dict[str, str]] = {
    "formats/zipinfo.py:MAX_READ_VERSION": "the newest archive version torch's reader reads",
    "archive/_entries.py:MAX_SIZE": "the ZIP64 maximum size (a signed 64-bit field)",
    "archive/writer.py:MAX_ALIGNMENT": "what a ZIP extra field's 16-bit length can pad",
    "allowlist/numpy_globals.py:_MAX_ITEMSIZE": "numpy's NPY_MAX_INT, no item size reaches it",
    "picklevm/costs.py:MAX_BYTES_PER_BYTE": "what CPython's unpickler allocates per byte",
    # Thresholds choosing how to do the same work: no input is refused or passed by them.
    "scanning/fast.py:MAX_OBJECTS": "past it the precise walk decides, with the same findings",
    "scanning/loaders/stream.py:MAX_VALUE_OBJECTS": "past it the value reads as unknown "
                                                    "(the cautious reading)",
    "reader.py:MAX_SLICE_RUNS": "the caller's slice is read as runs or as one span",
}


def _module_max_constants() -> set[str]:
    found = set()
    for path in SOURCE.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id.lstrip("_").startswith("MAX"):
                    found.add(f"{path.relative_to(SOURCE).as_posix()}:{target.id}")
    return found


def test_no_max_constant_outside_the_format_facts() -> None:
    found = _module_max_constants()
    assert found - NOT_CEILINGS.keys() == set(), "a ceiling on input belongs in ptfile.Limits"
    assert NOT_CEILINGS.keys() - found == set(), "stale NOT_CEILINGS entries"


def test_the_rank_ceiling_is_only_limits_max_ndim() -> None:
    from ptfile.model import tensor

    assert not hasattr(tensor, "MAX_NDIM")
    assert tensor.NUMPY_MAX_DIMS == ptfile.DEFAULT_LIMITS.max_ndim == 64


def _refused(info: pytest.ExceptionInfo[ptfile.LimitExceededError], limit: str,
             maximum: int) -> int:
    assert (info.value.limit, info.value.maximum) == (limit, maximum)
    assert info.value.actual > maximum
    return info.value.actual


# --------------------------------------------------------------------------- loads


class _Block(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.inner = inner if inner is not None else torch.nn.Identity()


def test_max_module_visits(tmp_path: Path) -> None:
    shared = _Block()
    model = torch.nn.Sequential(shared, shared, _Block(_Block()))  # 8 visits
    path = tmp_path / "model.pt"
    torch.save(model, path)
    with ptfile.open(path, structural=True) as reader:
        assert sorted(reader.keys()) == sorted(model.state_dict())
    with pytest.raises(ptfile.LimitExceededError) as info:
        ptfile.open(path, structural=True, limits=ptfile.Limits(max_module_visits=5))
    assert _refused(info, "max_module_visits", 5) == 6
    obj = ptfile.load(path, structural=True)
    assert list(state_dict(obj)) == list(model.state_dict())
    with pytest.raises(ptfile.LimitExceededError, match="max_module_visits"):
        state_dict(obj, limits=ptfile.Limits(max_module_visits=7))


def test_max_module_depth(tmp_path: Path) -> None:
    model = torch.jit.script(_Block(_Block(_Block())))  # the root and three levels below
    path = tmp_path / "script.pt"
    torch.jit.save(model, path)
    assert list(ptfile.load(path)) == list(torch.jit.load(path).state_dict())
    assert len(ptfile.load(path, limits=ptfile.Limits(max_module_depth=3))) == 6
    with pytest.raises(ptfile.LimitExceededError) as info:
        ptfile.load(path, limits=ptfile.Limits(max_module_depth=2))
    assert _refused(info, "max_module_depth", 2) == 3


def test_max_stack_bytes(tmp_path: Path) -> None:
    # 20,000 tuple opcodes may nest a tuple 20,000 deep: a 5 MiB stack (32 MiB reserved)
    obj = {"pairs": [(i,) for i in range(20_000)]}
    path = tmp_path / "tuples.pt"
    torch.save(obj, path)
    assert ptfile.load(path) == torch.load(path) == obj
    with pytest.raises(ptfile.LimitExceededError) as info:
        ptfile.load(path, limits=ptfile.Limits(max_stack_bytes=16 << 20))
    assert _refused(info, "max_stack_bytes", 16 << 20) == 32 << 20


# --------------------------------------------------------------------------- scan


def _kinds(result: ptfile.ScanResult) -> set[tuple[str, str]]:
    return {(f.kind, f.name) for f in result.findings if f.verdict is not ptfile.Verdict.ALLOWED}


def _zip(entries: list[tuple[str, bytes]], named: int | None = None) -> bytes:
    """A stored ZIP whose central directory names the first ``named`` entries only."""
    out, offsets = bytearray(), []
    for name, data in entries:
        offsets.append(len(out))
        raw = name.encode()
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, zlib.crc32(data),
                           len(data), len(data), len(raw), 0) + raw + data
    start, picks = len(out), entries[:named]
    for (name, data), offset in zip(picks, offsets):
        raw = name.encode()
        out += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, zlib.crc32(data),
                           len(data), len(data), len(raw), 0, 0, 0, 0, 0, offset) + raw
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(picks), len(picks),
                       len(out) - start, start, 0)
    return bytes(out)


def _checkpoint(data_pkl: bytes) -> bytes:
    return _zip([("archive/data.pkl", data_pkl), ("archive/version", b"3\n")])


def test_max_scan_nesting() -> None:
    inner = pickle.dumps(1, 2)
    outer = pickle.dumps(pickle.dumps(inner, 3), 3)  # a pickle in bytes in a pickle in bytes
    assert ptfile.scan(outer).is_clean
    result = ptfile.scan(outer, limits=ptfile.Limits(max_scan_nesting=1))
    assert result.is_dangerous and ("nested", "") in _kinds(result)
    assert any("nested more than 1 deep" in f.message for f in result.findings)


def test_max_nested_scans() -> None:
    blobs = pickle.dumps([pickle.dumps(i, 2) for i in range(5)], 3)
    assert ptfile.scan(blobs).is_clean
    result = ptfile.scan(blobs, limits=ptfile.Limits(max_nested_scans=3))
    assert _kinds(result) == {("limit", "nested-scans")}
    assert result.verdict is ptfile.Verdict.UNKNOWN


def test_max_trailing_probes() -> None:
    data = _checkpoint(pickle.dumps({"w": 1}, 2) + b"\0" + b"\x80\x02N." * 5)
    default = ptfile.scan(data)  # bytes after STOP: unknown, each head probed
    assert ("limit", "trailing-probes") not in _kinds(default)
    result = ptfile.scan(data, limits=ptfile.Limits(max_trailing_probes=3))
    assert _kinds(result) == _kinds(default) | {("limit", "trailing-probes")}
    assert not result.is_dangerous


def test_max_tar_pickles() -> None:
    # a member torch never reads, holding five pickles in a row: each is searched
    data = tar({"sys_info": pickle.dumps({}, 2), "pickle": pickle.dumps({}, 2),
                 "tensors": pickle.dumps(0, 2),
                 "storages": pickle.dumps(0, 2) + pickle.dumps([], 2),
                 "extra": pickle.dumps(1, 2) * 5})
    default = ptfile.scan(data)
    assert ("limit", "tar-pickles") not in _kinds(default)
    result = ptfile.scan(data, limits=ptfile.Limits(max_tar_pickles=2))
    assert _kinds(result) == _kinds(default) | {("limit", "tar-pickles")}
    assert not result.is_dangerous


def _shadowed(count: int) -> bytes:
    """A checkpoint with ``count`` local headers no central directory entry names."""
    shadows = [(f"archive/shadow{i}", b"x" * 40) for i in range(count)]
    return _zip([("archive/data.pkl", pickle.dumps({"w": 1}, 2)), ("archive/version", b"3\n"),
                 *shadows], named=2)


def test_max_shadow_records() -> None:
    data = _shadowed(4)
    assert _kinds(ptfile.scan(data)) == {("archive", "shadow-record")}
    result = ptfile.scan(data, limits=ptfile.Limits(max_shadow_records=2))
    assert ("archive", "scan-limit") in _kinds(result)
    assert sum(f.name == "shadow-record" for f in result.findings) == 2
    assert any("max_shadow_records" in f.message for f in result.findings)


def test_max_shadow_search_bytes() -> None:
    data = _shadowed(4)
    result = ptfile.scan(data, limits=ptfile.Limits(max_shadow_search_bytes=100))
    assert ("archive", "scan-limit") in _kinds(result)
    assert any("max_shadow_search_bytes" in f.message for f in result.findings)
    assert sum(f.name == "shadow-record" for f in result.findings) < 4
