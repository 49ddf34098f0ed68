"""The pre-0.4 tar format, built by hand as torch's reader expects, against torch 2.13."""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_same

GOLDEN = Path(__file__).parent.parent / "golden"


class Ref:
    def __init__(self, key: Any) -> None:
        self.key = key


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return obj.key if isinstance(obj, Ref) else None


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def build_tar(storages: list[tuple[Any, type, np.ndarray]], views: list[tuple[Any, ...]],
              tensors: list[tuple[Any, Any, tuple[int, ...], tuple[int, ...], int]], obj: Any,
              fmt: int = tarfile.PAX_FORMAT, extra: tuple[str, ...] = ()) -> bytes:
    st = io.BytesIO()
    pickle.dump(len(storages), st, protocol=2)
    for key, cls, values in storages:
        pickle.dump((key, "cpu", cls), st, protocol=2)
        st.write(struct.pack("<q", values.size) + values.tobytes())
    pickle.dump(views, st, protocol=2)
    te = io.BytesIO()
    pickle.dump(len(tensors), te, protocol=2)
    for key, storage_key, size, stride, offset in tensors:
        pickle.dump((key, storage_key, None), te, protocol=2)
        te.write(struct.pack(f"<i4x{len(size)}q{len(size)}qq", len(size), *size, *stride, offset))
    pk = io.BytesIO()
    _Pickler(pk, protocol=2).dump(obj)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name in extra:
            _member(tar, name, b"ignored")
        _member(tar, "sys_info", pickle.dumps({"little_endian": True}, protocol=2))
        _member(tar, "pickle", pk.getvalue())
        _member(tar, "tensors", te.getvalue())
        _member(tar, "storages", st.getvalue())
    return out.getvalue()


def torch_load(data: bytes, tmp_path: Path) -> Any:
    path = tmp_path / "tar.pt"  # torch tries the tar format only for real files
    path.write_bytes(data)
    return torch.load(path, weights_only=False)


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")
def test_tar_golden_file_equals_torch() -> None:
    ours = ptfile.load(GOLDEN / "tiny_tar.pt")
    theirs = torch.load(GOLDEN / "tiny_tar.pt", weights_only=False)
    assert_same(ours["t"], theirs["t"])
    assert isinstance(ours["view"], ptfile.Storage)
    assert np.frombuffer(ours["view"].data, np.float32).tolist() == theirs["view"].tolist()
    assert ptfile.detect_format(GOLDEN / "tiny_tar.pt") is ptfile.Format.TAR


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_tar_dtypes_views_and_sharing_equal_torch(tmp_path: Path, fmt: int) -> None:
    floats = np.arange(12, dtype=np.float64)
    longs = np.array([5, -6, 7, 1 << 40], dtype=np.int64)
    halves = np.array([1.5, -2.0], dtype=np.float16)
    storages = [(1, torch.DoubleStorage, floats), (2, torch.LongStorage, longs),
                (3, torch.HalfStorage, halves), (4, torch.ByteStorage, np.arange(3, dtype="u1"))]
    views = [(9, 1, 4, 6)]
    tensors = [(10, 1, (3, 4), (4, 1), 0), (11, 1, (4, 3), (1, 4), 0), (12, 2, (2,), (2,), 1),
               (13, 9, (2, 3), (3, 1), 0), (14, 3, (), (), 1), (15, 4, (3,), (1,), 0),
               (16, 1, (2, 2), (0, 1), 5)]
    obj = {"m": Ref(10), "mt": Ref("11"), "strided": Ref(12), "on_view": Ref(13),
           "scalar": Ref(14), "bytes": Ref(15), "expanded": Ref(16), "plain": [1, "x"]}
    long_name = ("a" * 120,) if fmt != tarfile.USTAR_FORMAT else ("b" * 90,)
    data = build_tar(storages, views, tensors, obj, fmt, extra=long_name)
    ours, theirs = ptfile.load(io.BytesIO(data)), torch_load(data, tmp_path)
    assert_same(ours, theirs)
    assert ours["m"].storage is ours["mt"].storage
    assert ours["on_view"].numpy().tolist() == [[4, 5, 6], [7, 8, 9]]


def test_tar_damage_is_a_ptfile_error() -> None:
    ok = build_tar([(1, torch.FloatStorage, np.zeros(4, np.float32))], [],
                   [(2, 1, (2,), (1,), 0)], {"t": Ref(2)})
    assert ptfile.load(io.BytesIO(ok))["t"].shape == (2,)
    too_far = build_tar([(1, torch.FloatStorage, np.zeros(4, np.float32))], [],
                        [(2, 1, (2,), (1,), 3)], {"t": Ref(2)})
    with pytest.raises(ptfile.StorageError):
        ptfile.load(io.BytesIO(too_far))
    bad_view = build_tar([(1, torch.FloatStorage, np.zeros(4, np.float32))], [(5, 1, 3, 2)],
                         [], {"t": Ref(5)})
    with pytest.raises(ptfile.StorageError, match="does not fit"):
        ptfile.load(io.BytesIO(bad_view))
    unknown = build_tar([], [], [], {"t": Ref(7)})
    with pytest.raises(ptfile.StorageError, match="names no storage"):
        ptfile.load(io.BytesIO(unknown))
    header = bytearray(ok)
    header[0] ^= 1  # the first header's checksum no longer matches
    with pytest.raises(ptfile.FormatError, match="checksum"):
        ptfile.load(io.BytesIO(bytes(header)))


def test_tar_missing_member_is_a_format_error() -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _member(tar, "pickle", pickle.dumps(1, protocol=2))
    with pytest.raises(ptfile.FormatError, match="'storages'"):
        ptfile.load(io.BytesIO(out.getvalue()))


def test_tar_module_class_refused_by_default_policy() -> None:
    data = build_tar([], [], [], {"m": Ref((torch.nn.Linear, "file.py", "source"))})
    with pytest.raises(ptfile.UnsafeGlobalError):
        ptfile.load(io.BytesIO(data))


def test_tar_skip_data_reads_no_storage_bytes() -> None:
    big = np.zeros(1 << 20, np.float32)
    data = build_tar([(1, torch.FloatStorage, big)], [], [(2, 1, (1 << 20,), (1,), 0)],
                     {"t": Ref(2)})

    class Counting(io.BytesIO):
        bytes_read = 0

        def read(self, n: int | None = -1) -> bytes:
            out = super().read(n)
            self.bytes_read += len(out)
            return out

    f = Counting(data)
    assert ptfile.load(f, skip_data=True)["t"].shape == (1 << 20,)
    assert f.bytes_read < 100_000 < len(data)
    assert ptfile.load(io.BytesIO(data), mmap=False)["t"].numpy().sum() == 0
