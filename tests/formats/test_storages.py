"""The fast load path (FastStorages + the fast policy) against the reference path.

``ptfile.load`` takes the fast path when there is no ``map_location`` and no
registered package; an identity ``map_location`` forces the reference path
(:class:`~ptfile.formats.storages.StorageLoader` + the allowlist's rebuild
functions).  On valid and damaged files both must give the same tensors or
the same error.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ptfile
from hostile import with_data_pkl

GOLDEN = Path(__file__).parent.parent / "golden"
FILES = ["tiny_tensor.pt", "tiny_state_dict.pt", "tiny_views.pt", "tiny_dtypes.pt",
         "tiny_buffer_nocrc.pt", "tiny_bigendian.pt"]
SAMPLES = {name: (GOLDEN / name).read_bytes() for name in FILES}
REFERENCE = {"cpu": "cpu"}  # any map_location takes the reference path


def _summary(obj: Any) -> Any:
    """Everything a load decides, in comparable form (data bytes included)."""
    if isinstance(obj, ptfile.Tensor):
        s = obj.storage
        raw = None if s is None or s.data is None else bytes(s.data)
        return ("T", type(obj).__name__, obj.dtype.name, obj._shape, obj._stride, obj._offset,
                obj.requires_grad, s and (s.key, s.dtype.name, s.location, s.nbytes, s.untyped,
                                          s.byteorder), raw)
    if isinstance(obj, dict):
        return (type(obj).__name__, [(k, _summary(v)) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [_summary(v) for v in obj])
    if callable(obj):  # an allowlisted global itself (per-load on the fast path)
        return ("callable", getattr(obj, "__name__", "?"))
    return repr(obj)


def _outcome(data: bytes, **kwargs: Any) -> Any:
    try:
        return _summary(ptfile.load(io.BytesIO(data), **kwargs))
    except ptfile.PtfileError as exc:  # a repr of a function names its address: not compared
        return (type(exc).__name__, re.sub(r" at 0x[0-9a-f]+", "", str(exc)))


def _sharing(obj: dict[str, ptfile.Tensor]) -> list[list[str]]:
    groups: dict[int, list[str]] = {}
    for name, t in obj.items():
        groups.setdefault(id(t.storage), []).append(name)
    return sorted(groups.values())


@pytest.mark.parametrize("name", FILES)
def test_fast_and_reference_paths_agree_on_golden_files(name: str) -> None:
    fast, reference = _outcome(SAMPLES[name]), _outcome(SAMPLES[name], map_location=REFERENCE)
    assert fast == reference
    assert not isinstance(fast[0], str) or fast[0] not in ("FormatError", "StorageError")


def test_fast_path_keeps_sharing_and_views() -> None:
    base = np.arange(24, dtype=np.float32)
    buf = io.BytesIO()
    ptfile.save({"a": base, "b": base[4:10], "c": base.reshape(4, 6).T, "d": np.ones(3)}, buf)
    fast = ptfile.load(io.BytesIO(buf.getvalue()))
    reference = ptfile.load(io.BytesIO(buf.getvalue()), map_location=REFERENCE)
    assert _summary(fast) == _summary(reference)
    assert _sharing(fast) == _sharing(reference) == [["a", "b", "c"], ["d"]]
    np.testing.assert_array_equal(fast["c"].numpy(), base.reshape(4, 6).T)


@settings(max_examples=800, deadline=None)
@given(name=st.sampled_from([f for f in FILES if "nocrc" not in f]), data=st.data())
def test_fast_and_reference_paths_agree_on_damaged_pickles(name: str, data: st.DataObject) -> None:
    """Bit flips in data.pkl (geometry, keys, sizes, types) and in storage records."""
    src = zipfile.ZipFile(io.BytesIO(SAMPLES[name]))
    member = data.draw(st.sampled_from(src.namelist()))
    blob = bytearray(src.read(member))
    for _ in range(data.draw(st.integers(1, 3))):
        if blob:
            blob[data.draw(st.integers(0, len(blob) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    if data.draw(st.booleans()):
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, bytes(blob) if info.filename == member else src.read(info))
    damaged = out.getvalue()
    assert _outcome(damaged) == _outcome(damaged, map_location=REFERENCE)


@settings(max_examples=500, deadline=None)
@given(name=st.sampled_from(FILES), data=st.data())
def test_fast_and_reference_paths_agree_on_damaged_archives(name: str, data: st.DataObject) -> None:
    blob = bytearray(SAMPLES[name])
    for _ in range(data.draw(st.integers(1, 3))):
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    assert _outcome(bytes(blob)) == _outcome(bytes(blob), map_location=REFERENCE)


def _two_pids(second: bytes) -> bytes:
    """A torch-style archive whose pickle names storage '0' twice: well, then ``second``."""
    good = b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x02tQ"
    pickle = b"\x80\x02]q\x00(" + good + second + b"e."
    buf = io.BytesIO()
    ptfile.save({"w": np.ones(2, np.float32)}, buf)
    return with_data_pkl(buf.getvalue(), pickle)


@pytest.mark.parametrize("second", [
    b"(X\x03\x00\x00\x00xyzctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x02tQ",
    b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000K\x07K\x02tQ",
    b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ\xff\xff\xff\xfftQ",
    b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x02tQ",
], ids=["tag", "location", "numel", "same"])
def test_a_repeated_key_is_checked_like_the_first(second: bytes) -> None:
    data = _two_pids(second)
    assert _outcome(data) == _outcome(data, map_location=REFERENCE)


@pytest.mark.parametrize("key", ["../version", "", "0/", "00", "../data.pkl", "\u00e9"])
def test_keys_that_name_no_storage_record_fail_alike(key: str) -> None:
    raw = key.encode("utf-8")
    pid = (b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX" + len(raw).to_bytes(4, "little")
           + raw + b"X\x03\x00\x00\x00cpuK\x02tQ")
    data = _two_pids(pid)
    fast = _outcome(data)
    assert fast == _outcome(data, map_location=REFERENCE)
    assert fast[0] == "StorageError"


@pytest.mark.parametrize("name", ["_rebuild_tensor_v2", "_rebuild_tensor_v3"])
def test_build_on_a_rebuild_function_is_refused_on_both_paths(name: str) -> None:
    buf = io.BytesIO()
    ptfile.save({"w": np.ones(2, np.float32)}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    hostile = b"\x80\x02ctorch._utils\n" + name.encode() + b"\n}X\x01\x00\x00\x00aK\x01sb."
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename,
                         hostile if info.filename.endswith("data.pkl") else src.read(info))
    fast, reference = _outcome(out.getvalue()), _outcome(out.getvalue(), map_location=REFERENCE)
    assert fast == reference
    assert fast[0] == "UnsafeGlobalError"


def _torch_file(path: Path, n: int, numel: int) -> dict[str, Any]:
    import torch

    tensors = {f"t{i}": torch.arange(numel, dtype=torch.float32) + i for i in range(n)}
    torch.save(tensors, path)
    return {k: v.numpy() for k, v in tensors.items()}


def _damage_local_header(path: Path, key: str) -> None:
    with zipfile.ZipFile(path) as archive:
        offset = archive.getinfo(f"{path.stem}/data/{key}").header_offset
    data = bytearray(path.read_bytes())
    data[offset:offset + 4] = b"XXXX"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("n", "numel"), [(200, 4), (80, 1 << 14)])  # dense, sparse headers
def test_mapped_load_of_many_records_equals_the_file(tmp_path: Path, n: int,
                                                     numel: int) -> None:
    """Dense headers are checked in bulk at load; sparse ones on first use, from the
    65th on with the bulk-checked offsets (issue 15): the same bytes either way."""
    path = tmp_path / "many.pt"
    expected = _torch_file(path, n, numel)
    for loaded in (ptfile.load(path, mmap=True), ptfile.open(path)):
        for key, values in expected.items():
            np.testing.assert_array_equal(np.asarray(loaded[key]), values)


@pytest.mark.parametrize(("n", "numel"), [(200, 4), (80, 1 << 14)])
def test_mapped_load_reports_a_damaged_local_header_on_first_use(tmp_path: Path, n: int,
                                                                 numel: int) -> None:
    path = tmp_path / "many.pt"
    expected = _torch_file(path, n, numel)
    _damage_local_header(path, str(n - 3))
    loaded = ptfile.load(path, mmap=True)
    for key in sorted(expected, key=lambda k: int(k[1:])):
        if key == f"t{n - 3}":
            with pytest.raises(ptfile.ArchiveError, match="local file header"):
                np.asarray(loaded[key])
        else:
            np.testing.assert_array_equal(np.asarray(loaded[key]), expected[key])
