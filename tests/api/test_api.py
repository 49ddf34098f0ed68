"""load/save knobs against torch: mmap modes, map_location, settings, targets, atomic saves."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_same, assert_sharing


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    path = tmp_path / "w.pt"
    x = torch.arange(6.0)
    torch.save({"x": x, "v": x[2:4]}, path)
    return path


def test_api_mmap_private_writes_never_reach_file(ckpt: Path) -> None:
    before = ckpt.read_bytes()
    sd = ptfile.load(ckpt, mmap=True)
    arr = sd["x"].numpy()
    arr[:] = 42
    assert sd["v"].numpy().tolist() == [42, 42]  # views share memory
    assert ckpt.read_bytes() == before


def test_api_mmap_readonly_arrays_are_not_writable(ckpt: Path) -> None:
    arr = ptfile.load(ckpt, mmap="r")["x"].numpy()
    assert not arr.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        arr[0] = 1


def test_api_mmap_shared_writes_reach_file(ckpt: Path) -> None:
    sd = ptfile.load(ckpt, mmap="r+")
    sd["x"].numpy()[0] = 99.0
    del sd
    assert torch.load(ckpt)["x"][0].item() == 99.0


def test_api_mmap_shared_via_settings(ckpt: Path) -> None:
    with ptfile.settings(mmap_flags=ptfile.MAP_SHARED):
        assert ptfile.get_default_mmap_options() == ptfile.MAP_SHARED
        ptfile.load(ckpt, mmap=True)["x"].numpy()[1] = 7.0
    assert ptfile.get_default_mmap_options() == ptfile.MAP_PRIVATE
    assert torch.load(ckpt)["x"][1].item() == 7.0


def test_api_no_mmap_arrays_are_writable_copies(ckpt: Path) -> None:
    before = ckpt.read_bytes()
    sd = ptfile.load(ckpt)
    sd["x"].numpy()[:] = -1
    assert sd["v"].numpy().tolist() == [-1, -1]
    assert ckpt.read_bytes() == before


def test_api_map_location_forms(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save({"a": torch.ones(1), "b": torch.zeros(1)}, path)
    assert ptfile.load(path)["a"].device == "cpu"
    assert ptfile.load(path, "cuda:1")["a"].device == ptfile.Device("cuda", 1)
    assert ptfile.load(path, {"cpu": "mps"})["b"].device.type == "mps"
    seen: list[str] = []

    def hook(storage: ptfile.Storage, location: str) -> str:
        seen.append(location)
        return "xpu:0"
    assert str(ptfile.load(path, hook)["a"].device) == "xpu:0"
    assert seen == ["cpu", "cpu"]


def test_api_register_package_handles_tags(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save(torch.ones(2), path)
    calls: list[str] = []

    def deserialize(storage: ptfile.Storage, location: str) -> ptfile.Storage | None:
        if location.startswith("npu"):
            calls.append(location)
            storage.location = "npu-host"
            return storage
        return None
    ptfile.register_package(5, lambda obj: None, deserialize)
    assert str(ptfile.load(path, "npu:3").device) == "npu-host"
    assert calls == ["npu:3"]


def test_api_settings_crc_alignment_byteorder_match_torch(tmp_path: Path) -> None:
    obj = {"a": torch.arange(5.0), "b": torch.ones(2, 2, dtype=torch.int64)}
    loaded_from = tmp_path / "src.pt"
    torch.save(obj, loaded_from)
    ours = ptfile.load(loaded_from)
    config = torch.utils.serialization.config.save
    for crc, alignment, disable in [(False, 64, False), (True, 4096, False), (True, 1, True),
                                    (True, 100, False)]:
        torch.serialization.set_crc32_options(crc)
        old = config.storage_alignment
        config.storage_alignment = alignment
        try:
            expected = io.BytesIO()
            torch.save(obj, expected, _disable_byteorder_record=disable)
        finally:
            torch.serialization.set_crc32_options(True)
            config.storage_alignment = old
        got = io.BytesIO()
        with ptfile.settings(crc32=crc, storage_alignment=alignment):
            ptfile.save(ours, got, _disable_byteorder_record=disable)
        assert got.getvalue() == expected.getvalue(), (crc, alignment, disable)


def test_api_set_crc32_options_function() -> None:
    assert ptfile.get_crc32_options() is True
    ptfile.set_crc32_options(False)
    try:
        buf = io.BytesIO()
        ptfile.save({"a": np.ones(3)}, buf)
    finally:
        ptfile.set_crc32_options(True)
    crcs = [ci.CRC for ci in zipfile.ZipFile(io.BytesIO(buf.getvalue())).infolist()]
    assert crcs and all(c == 0 for c in crcs)
    assert ptfile.get_crc32_options() is True


def _without_byteorder(data: bytes, swap: bool) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            payload = src.read(info)
            if info.filename.endswith("/byteorder"):
                continue
            if swap and "/data/" in info.filename:
                payload = np.frombuffer(payload, "<f4").astype(">f4").tobytes()
            dst.writestr(info.filename, payload)
    return out.getvalue()


def test_api_default_load_endianness_for_files_without_record() -> None:
    buf = io.BytesIO()
    torch.save(torch.tensor([1.0, 2.0]), buf)
    little = _without_byteorder(buf.getvalue(), swap=False)
    big = _without_byteorder(buf.getvalue(), swap=True)
    assert ptfile.load(little).numpy().tolist() == [1.0, 2.0]
    with ptfile.settings(load_endianness="big"):
        assert ptfile.load(big).numpy().tolist() == [1.0, 2.0]
    ptfile.set_default_load_endianness("native")
    try:
        assert ptfile.get_default_load_endianness() == "native"
        assert ptfile.load(little).numpy().tolist() == [1.0, 2.0]
    finally:
        ptfile.set_default_load_endianness(None)


def test_api_calculate_storage_offsets_reads_no_local_headers(ckpt: Path) -> None:
    with ptfile.settings(calculate_storage_offsets=True):
        sd = ptfile.load(ckpt, mmap=True)
    assert sd["v"].numpy().tolist() == [2.0, 3.0]


@pytest.mark.parametrize("map_location", [None, {"cpu": "cpu"}], ids=["fast", "reference"])
def test_api_calculate_storage_offsets_ignores_storage_local_headers(
        tmp_path: Path, map_location: dict[str, str] | None) -> None:
    import zipfile

    path = tmp_path / "t.pt"
    torch.save({f"w{i}": torch.full((3,), float(i)) for i in range(80)}, path)
    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if "/data/" in info.filename:  # spoil each storage's local header signature
                blob[info.header_offset:info.header_offset + 4] = b"XXXX"
    damaged = tmp_path / "d.pt"
    damaged.write_bytes(bytes(blob))
    with ptfile.settings(calculate_storage_offsets=True):
        sd = ptfile.load(damaged, map_location=map_location)
    assert [sd[f"w{i}"].numpy().tolist() for i in (0, 79)] == [[0.0] * 3, [79.0] * 3]
    with pytest.raises(ptfile.ArchiveError, match="local file header"):
        ptfile.load(damaged, map_location=map_location)


def test_api_prefix_rules_match_torch(tmp_path: Path) -> None:
    t = torch.ones(2)
    (tmp_path / "p").mkdir()
    for name in ("a.b.c", "noext", "x.tar.gz", "ü.pt"):
        torch.save(t, tmp_path / f"t-{name}")
        ptfile.save(ptfile.load(tmp_path / f"t-{name}"), tmp_path / "p" / f"t-{name}")
        assert (tmp_path / "p" / f"t-{name}").read_bytes() == (tmp_path / f"t-{name}").read_bytes()
    with pytest.raises(ptfile.SaveError, match="invalid file name"):
        ptfile.save(np.ones(1), tmp_path / ".pt")


def test_api_archive_name_override() -> None:
    buf = io.BytesIO()
    ptfile.save(np.ones(1), buf, archive_name="model")
    assert zipfile.ZipFile(io.BytesIO(buf.getvalue())).namelist()[0] == "model/data.pkl"


def test_api_atomic_save_keeps_old_file_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "keep.pt"
    ptfile.save({"a": np.ones(2)}, path)
    before = path.read_bytes()
    with pytest.raises(ptfile.SaveError):
        ptfile.save({"a": np.ones(2), "bad": object()}, path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["keep.pt"]


@pytest.mark.parametrize("fsync", [False, True])
def test_api_save_fsyncs_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         fsync: bool) -> None:
    """Atomic (temporary file + rename) either way; the file and its folder are fsynced
    only with fsync=True (issue 15: durability is an option, not the default)."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    path = tmp_path / "d.pt"
    x = torch.arange(5.0)
    ptfile.save({"x": x}, path, fsync=fsync)
    assert len(synced) == (2 if fsync else 0)
    assert sorted(os.listdir(tmp_path)) == ["d.pt"]
    (tmp_path / "torch").mkdir()
    torch.save({"x": x}, tmp_path / "torch" / "d.pt")
    assert path.read_bytes() == (tmp_path / "torch" / "d.pt").read_bytes()


def test_api_file_objects_and_streams(ckpt: Path) -> None:
    data = ckpt.read_bytes()
    buf = io.BytesIO(b"junk" + data)
    buf.seek(4)
    assert ptfile.load(buf)["v"].numpy().tolist() == [2.0, 3.0]
    with open(ckpt, "rb") as fp:
        assert ptfile.load(fp)["x"].numpy().sum() == 15.0

    class Stream(io.RawIOBase):
        def __init__(self) -> None:
            self._inner = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            chunk = self._inner.read(min(len(b), 7))
            b[: len(chunk)] = chunk
            return len(chunk)
    assert ptfile.load(io.BufferedReader(Stream()))["x"].numpy().sum() == 15.0
    assert ptfile.load(data)["x"].numpy().sum() == 15.0


def test_api_view_outside_storage_is_storage_error(golden: Path) -> None:
    data = bytearray((golden / "tiny_tensor.pt").read_bytes())
    at = data.index(b"QK\x00")
    data[at + 2] = 5  # storage_offset 5 in a 2-element storage
    with pytest.raises(ptfile.StorageError, match="needs 7 elements"):
        ptfile.load(bytes(data))


def test_api_unsafe_global_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"f": os.getcwd}, path)
    with pytest.raises(ptfile.UnsafeGlobalError, match=r"posix\.getcwd") as info:
        ptfile.load(path)
    assert info.value.module == "posix" and info.value.name == "getcwd"
    assert isinstance(info.value, __import__("pickle").UnpicklingError)


def test_api_rejects_torch_only_arguments(ckpt: Path) -> None:
    with pytest.raises(TypeError):
        ptfile.load(ckpt, pickle_module=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ptfile.load(ckpt, foo=1)


@pytest.mark.parametrize("mmap", [True, "r", "c", "r+"])
def test_api_mmap_of_a_file_object_is_refused_like_torch(ckpt: Path, mmap: bool | str) -> None:
    with pytest.raises(ValueError, match="mmap needs a path") as ours:
        ptfile.load(io.BytesIO(ckpt.read_bytes()), mmap=mmap)
    with ckpt.open("rb") as fp, pytest.raises(ValueError, match="mmap needs a path"):
        ptfile.load(fp, mmap=mmap)
    with pytest.raises(ValueError, match="mmap"):
        torch.load(io.BytesIO(ckpt.read_bytes()), mmap=True)
    assert not isinstance(ours.value, ptfile.PtfileError)
    assert ptfile.load(io.BytesIO(ckpt.read_bytes()), mmap=False)["v"].numpy().tolist() == [2.0, 3.0]


def _spoil_local_header(path: Path, out: Path, member_suffix: str) -> None:
    """Copy ``path`` to ``out`` with the local header signature of one record spoiled."""
    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(member_suffix))
    blob[info.header_offset:info.header_offset + 4] = b"XXXX"
    out.write_bytes(bytes(blob))


@pytest.mark.parametrize("map_location", [None, {"cpu": "cpu"}], ids=["fast", "reference"])
@pytest.mark.parametrize("n", [3, 80], ids=["few", "bulk"])  # 80: over the 64 single reads
def test_api_mmap_reads_each_local_header_on_first_use(
        tmp_path: Path, map_location: dict[str, str] | None, n: int) -> None:
    path = tmp_path / "t.pt"
    torch.save({f"w{i}": torch.full((3,), float(i)) for i in range(n)}, path)
    damaged = tmp_path / "d.pt"
    _spoil_local_header(path, damaged, "/data/1")
    with pytest.raises(ptfile.ArchiveError, match="local file header"):
        ptfile.load(damaged, map_location=map_location)  # in memory: checked at load
    sd = ptfile.load(damaged, mmap=True, map_location=map_location)  # mapped: checked on use
    assert [sd[f"w{i}"].numpy().tolist() for i in range(n) if i != 1] == \
        [[float(i)] * 3 for i in range(n) if i != 1]
    for _ in range(2):  # every use of the damaged record raises, not only the first
        with pytest.raises(ptfile.ArchiveError, match="local file header"):
            np.asarray(sd["w1"])
    good = ptfile.load(path, mmap=True, map_location=map_location)
    ref = torch.load(path, mmap=True)
    assert all(np.array_equal(good[k].numpy(), ref[k].numpy()) for k in ref)


def test_api_mmap_storages_outlive_the_load(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    torch.save({f"w{i}": torch.full((2,), float(i)) for i in range(100)}, path)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    sd = ptfile.load(path, mmap=True)
    if fds is not None:  # the map stays, with the descriptor Python's mmap keeps of its own
        assert len(os.listdir("/proc/self/fd")) <= fds + 1
    assert [sd[f"w{i}"].numpy().tolist() for i in (99, 0, 50)] == [[99.0] * 2, [0.0] * 2,
                                                                      [50.0] * 2]


def test_api_mmap_first_use_from_many_threads_agrees(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "t.pt"
    ref = {f"w{i}": torch.randn(5) for i in range(300)}
    torch.save(ref, path)
    sd = ptfile.load(path, mmap=True)
    with ThreadPoolExecutor(8) as pool:
        arrays = dict(zip(sd, pool.map(lambda t: t.numpy(), sd.values())))
    assert all(np.array_equal(arrays[k], ref[k].numpy()) for k in ref)


def _deflated_copy(path: Path, out: Path) -> None:
    """``path`` re-packed by a ZIP tool that compresses the storage records."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            method = zipfile.ZIP_DEFLATED if "/data/" in info.filename else zipfile.ZIP_STORED
            dst.writestr(info.filename, src.read(info), compress_type=method)


@pytest.mark.parametrize("map_location", [None, {"cpu": "cpu"}], ids=["fast", "reference"])
@pytest.mark.parametrize("mmap", [False, True, "r"])
def test_api_compressed_storage_records_are_inflated_as_torch_reads_them(
        tmp_path: Path, mmap: bool | str, map_location: dict[str, str] | None) -> None:
    path, packed = tmp_path / "t.pt", tmp_path / "z.pt"
    x = torch.arange(12.0).reshape(3, 4)
    torch.save({"x": x, "t": x.t(), "b": torch.zeros(1000, dtype=torch.bfloat16)}, path)
    _deflated_copy(path, packed)
    ref = torch.load(packed)  # torch inflates them when it reads the file into memory
    sd = ptfile.load(packed, mmap=mmap, map_location=map_location)
    assert_same(sd, ref)
    assert_sharing(sd, ref)
    if mmap == "r":  # read-only, as the map would be
        assert not sd["x"].numpy().flags.writeable
    else:  # a writable copy, shared by the views of its storage
        sd["x"].numpy()[0, 1] = 5
        assert sd["t"].numpy()[1, 0] == 5
    with pytest.raises(ptfile.UnsupportedFeatureError, match="compressed"):
        np.asarray(ptfile.load(packed, mmap="r+", map_location=map_location)["x"])


@pytest.mark.parametrize("mmap", [False, True])
def test_api_compressed_records_inflate_at_most_max_inflate_ratio(tmp_path: Path,
                                                                  mmap: bool) -> None:
    path, packed = tmp_path / "t.pt", tmp_path / "z.pt"
    torch.save({"zeros": torch.zeros(2**21), "w": torch.randn(10)}, path)  # 8 MiB of zeros
    _deflated_copy(path, packed)
    with zipfile.ZipFile(packed) as z:
        info = z.getinfo("t/data/0")  # (the folder is named after the original file)
    assert info.file_size > 64 * info.compress_size + 2**20  # ~1000x: a zip bomb's ratio
    with pytest.raises(ptfile.LimitExceededError, match="max_inflate_ratio"):
        np.asarray(ptfile.load(packed, mmap=mmap)["zeros"])
    loaded = ptfile.load(packed, mmap=mmap, limits=ptfile.Limits(max_inflate_ratio=2000))
    assert_same(loaded, torch.load(packed))


def test_every_public_name_reports_ptfile_as_its_module() -> None:
    """Issue 24: ``ptfile.load``, ``ptfile.open`` and every error class said a private
    module; one loop in ``ptfile/__init__`` now sets ``__module__`` for all of ``__all__``."""
    import pickle

    for name in ptfile.__all__:
        obj = getattr(ptfile, name)
        if isinstance(obj, type) or callable(obj):
            assert obj.__module__ == "ptfile", name
            if isinstance(obj, type) or hasattr(obj, "__qualname__"):
                assert pickle.loads(pickle.dumps(obj)) is obj, name  # found by its new name


def test_lazy_exports_agree_with_the_type_checking_imports() -> None:
    """``ptfile/__init__`` imports each public name on first use (``_EXPORTS``); its
    ``TYPE_CHECKING`` imports say the same for type checkers: the two must not drift."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    source = Path(ptfile.__file__).read_text()
    checked: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module is not None
                checked.update({a.asname or a.name: imp.module for a in imp.names})
    assert checked == ptfile._EXPORTS
    errors = {n for n in ptfile.__all__ if n not in checked and n != "__version__"}
    assert all(issubclass(getattr(ptfile.errors, n), (Exception, Warning)) for n in errors)
    assert set(ptfile.__all__) == set(checked) | errors | {"__version__"}
    # a fresh `import ptfile` imports neither numpy nor ml_dtypes
    probe = "import sys, ptfile; print('numpy' in sys.modules, 'ml_dtypes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]
