"""Reading ``.safetensors`` files as torch 2.13's ``torch.load`` reads them (and more).

Files are written by the real ``safetensors`` package (``safetensors.torch`` and
``safetensors.numpy``); every value is checked against ``torch.load(path)`` and
``safe_open``.  Malformed files must raise ptfile errors, and torch must refuse them
too (ptfile may read more than torch, never less).
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open

import ptfile
from ptfile.dcp.reader import DCPReader
from ptfile.formats import Format
from ptfile.inspection import diff, verify
from ptfile.outcomes import EXIT_DIFFERENT, EXIT_ERROR, EXIT_INVALID, EXIT_OK

ENTRY = Path(sys.executable).with_name("ptfile")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [str(ENTRY)] if ENTRY.exists() else [sys.executable, "-m", "ptfile"]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


def raw(t: torch.Tensor) -> bytes:
    """A torch tensor's bytes, C order."""
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def same(mine: ptfile.Tensor, ref: torch.Tensor) -> None:
    assert mine.dtype.name == str(ref.dtype).removeprefix("torch."), (mine.dtype, ref.dtype)
    assert tuple(mine.shape) == tuple(ref.shape)
    data = mine.storage.data if mine.storage is not None else None
    assert data is not None
    assert bytes(data) == raw(ref)


def every_dtype() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16,
                  torch.complex64):
        out[f"f.{dtype}"] = torch.randn(3, 4, generator=gen).to(dtype)
    for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                  torch.uint16, torch.uint32, torch.uint64):
        out[f"i.{dtype}"] = torch.randint(0, 100, (2, 3), generator=gen).to(dtype)
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                  torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2):
        out[f"q.{dtype}"] = torch.randint(0, 120, (2, 4), dtype=torch.uint8,
                                          generator=gen).view(dtype)
    out["bool"] = torch.tensor([True, False, True])
    out["scalar"] = torch.tensor(3.5)
    out["scalar_int"] = torch.tensor(7, dtype=torch.int64)
    out["empty"] = torch.zeros(0, 3)
    out["empty_bf16"] = torch.zeros(4, 0, dtype=torch.bfloat16)
    out["dotted.name.weight"] = torch.arange(6.0).reshape(2, 3)
    return out


@pytest.fixture(scope="module")
def st_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    safetensors.torch.save_file(every_dtype(), path, metadata={"format": "pt", "k": "v"})
    return path


def test_load_equals_torch_load_and_safe_open(st_file: Path) -> None:
    ref = torch.load(st_file)
    mine = ptfile.load(st_file)
    assert type(mine) is dict and list(mine) == list(ref)  # data order, as torch
    with safe_open(st_file, "pt") as f:
        assert sorted(f.keys()) == sorted(mine)
        for name, t in mine.items():
            same(t, ref[name])
            same(t, f.get_tensor(name))
    assert ptfile.detect_format(st_file) is Format.SAFETENSORS


def test_every_input_kind_reads_the_same(st_file: Path, tmp_path: Path) -> None:
    ref = torch.load(st_file)
    renamed = tmp_path / "model.bin"  # torch.load needs the suffix; ptfile reads the bytes
    renamed.write_bytes(st_file.read_bytes())
    with open(st_file, "rb") as fp:
        from_file = ptfile.load(fp)
    for loaded in (ptfile.load(st_file, mmap=True), ptfile.load(str(st_file), mmap="r"),
                   ptfile.load(io.BytesIO(st_file.read_bytes())), from_file,
                   ptfile.load(st_file.read_bytes()), ptfile.load(renamed)):
        assert list(loaded) == list(ref)
        for name, t in loaded.items():
            same(t, ref[name])


def test_load_options(st_file: Path) -> None:
    tagged = ptfile.load(st_file, "cuda:0")
    assert {t.storage.location for t in tagged.values()} == {"cuda:0"}
    mapped = ptfile.load(st_file, {"cpu": "meta"})  # torch refuses a dict here: ptfile reads more
    assert {t.storage.location for t in mapped.values()} == {"meta"}
    skipped = ptfile.load(st_file, skip_data=True)
    assert all(t.storage.data is None for t in skipped.values())
    assert skipped["f.torch.float32"].shape == (3, 4)
    writable = ptfile.load(st_file)["f.torch.float32"].numpy()
    writable[0, 0] = 1.0  # read into memory: a writable copy, as torch.load's


def test_open_is_safe_open(st_file: Path) -> None:
    ref = torch.load(st_file)
    with ptfile.open(st_file) as ck, safe_open(st_file, "pt") as f:
        assert ck.format is Format.SAFETENSORS
        assert list(ck.keys()) == list(ref)
        assert ck.metadata() == f.metadata() == {"format": "pt", "k": "v"}
        for name in ck:
            same(ck[name], ref[name])
            if ck.info(name).dtype.numpy is not None:
                assert ck.get_tensor(name).tobytes() == raw(ref[name])
        info = ck.info("f.torch.float32")
        header = int.from_bytes(st_file.read_bytes()[:8], "little")
        assert info.data_offset is not None and info.data_offset >= 8 + header
        assert info.shape == (3, 4) and info.stride == (4, 1)
        sliced = ck.get_slice("dotted.name.weight")
        assert sliced.get_shape() == [2, 3] and sliced.get_dtype() == "float32"
        assert sliced[1:, ::2].tolist() == ref["dotted.name.weight"][1:, ::2].tolist()
        assert sliced[1:, ::2].tolist() == f.get_slice("dotted.name.weight")[1:, ::2].tolist()
        assert ck.get_tensor("empty").shape == (0, 3)
        assert ck.get_tensor("scalar").shape == ()
    with ptfile.open(st_file, mmap=False) as ck, ptfile.open(io.BytesIO(st_file.read_bytes())) as b:
        for name in ("f.torch.bfloat16", "scalar", "bool"):
            assert ck.get_tensor(name).tobytes() == b.get_tensor(name).tobytes() == raw(ref[name])


def test_inspect_verify_scan(st_file: Path) -> None:
    found = ptfile.inspect(st_file)
    assert found.format == "safetensors" and found.metadata["k"] == "v"
    assert found.totals["tensors"] == len(every_dtype()) and found.records == []
    report = verify(st_file)
    assert report.ok and report.format == "safetensors"
    assert report.tensors_checked == len(every_dtype())
    result = ptfile.scan(st_file)
    assert result.is_clean and not result.findings


def test_numpy_written_files(tmp_path: Path) -> None:
    arrays = {"f16": np.arange(6, dtype=np.float16).reshape(2, 3),
              "f64": np.linspace(0, 1, 5), "i8": np.arange(-3, 3, dtype=np.int8),
              "u64": np.array([2**63 + 5], dtype=np.uint64), "b": np.array([True, False]),
              "zero_d": np.array(2.5, dtype=np.float32), "none": np.zeros((0,), np.int32)}
    path = tmp_path / "np.safetensors"
    safetensors.numpy.save_file(arrays, path)
    ref = torch.load(path)
    back = safetensors.numpy.load_file(path)
    mine = ptfile.load(path)
    assert list(mine) == list(ref)
    for name, t in mine.items():
        same(t, ref[name])
        np.testing.assert_array_equal(t.numpy(), back[name])
        assert t.numpy().dtype == back[name].dtype


def test_pt_and_its_safetensors_conversion_diff_identical(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    sd = {k: v.detach().clone() for k, v in net.state_dict().items()}
    sd["half"] = torch.randn(2, 2).to(torch.bfloat16)
    pt, st_path = tmp_path / "model.pt", tmp_path / "model.safetensors"
    torch.save(sd, pt)
    safetensors.torch.save_file(sd, st_path)
    assert diff(pt, st_path).identical
    done = run("diff", pt, st_path, "--json")
    assert done.returncode == EXIT_OK, done.stderr
    assert json.loads(done.stdout)["identical"] is True
    sd["0.bias"] = sd["0.bias"] + 1
    changed = tmp_path / "changed.safetensors"
    safetensors.torch.save_file(sd, changed)
    assert run("diff", pt, changed).returncode == EXIT_DIFFERENT


def test_cli_on_a_safetensors_file(st_file: Path) -> None:
    for command in ("inspect", "verify", "scan"):
        done = run(command, st_file, "--json")
        assert done.returncode == EXIT_OK, (command, done.stdout, done.stderr)
        doc = json.loads(done.stdout)
        assert doc.get("format") == "safetensors", (command, doc)


# --------------------------------------------------------------------------- malformed


def blob(header: Any, data: bytes = b"", *, length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def u8(offsets: list[int], shape: list[int] | None = None, dtype: str = "U8") -> dict[str, Any]:
    return {"dtype": dtype, "shape": [offsets[1] - offsets[0]] if shape is None else shape,
            "data_offsets": offsets}


MALFORMED: dict[str, tuple[bytes, type[ptfile.PtfileError]]] = {
    "truncated length": (b"\x10\x00\x00", ptfile.FormatError),
    "truncated header": (blob({"a": u8([0, 1])}, b"\x00")[:20], ptfile.FormatError),
    "length beyond file": (blob({"a": u8([0, 1])}, b"\x00", length=4096), ptfile.FormatError),
    "huge length": (blob(b"{}", length=2**40), ptfile.LimitExceededError),
    "empty header": (blob(b"", b"{}"), ptfile.FormatError),
    "bad json": (blob(b'{"a": {"dtype": "U8",}'), ptfile.FormatError),
    "not utf-8": (blob(b'{"\xff": 1}'), ptfile.FormatError),
    "a list": (blob(b"[]"), ptfile.FormatError),
    "trailing nul": (blob(b"{}\x00"), ptfile.FormatError),
    "entry not an object": (blob({"a": [1]}), ptfile.FormatError),
    "missing dtype": (blob({"a": {"shape": [1], "data_offsets": [0, 1]}}, b"x"),
                      ptfile.FormatError),
    "unknown dtype": (blob({"a": u8([0, 1], dtype="u8")}, b"x"), ptfile.FormatError),
    "no torch dtype": (blob({"a": u8([0, 3], [4], "F6_E2M3")}, b"xyz"),
                       ptfile.UnsupportedFeatureError),
    "negative dim": (blob({"a": u8([0, 1], [-1])}, b"x"), ptfile.FormatError),
    "float dim": (blob({"a": u8([0, 1], [1.0])}, b"x"), ptfile.FormatError),
    "dim of 2**64": (blob({"a": u8([0, 0], [0, 2**64], "F32")}), ptfile.FormatError),
    "three offsets": (blob({"a": u8([0, 1, 1], [1])}, b"x"), ptfile.FormatError),
    "begin after end": (blob({"a": u8([1, 0], [0])}, b"x"), ptfile.FormatError),
    "wrong size": (blob({"a": u8([0, 4], [2], "F32")}, bytes(4)), ptfile.FormatError),
    "shape overflows": (blob({"a": u8([0, 0], [2**40, 2**40], "F32")}), ptfile.FormatError),
    "out of range": (blob({"a": u8([0, 8])}, bytes(4)), ptfile.FormatError),
    "overlap": (blob({"a": u8([0, 2]), "b": u8([1, 3])}, bytes(3)), ptfile.FormatError),
    "shared bytes": (blob({"a": u8([0, 2]), "b": u8([0, 2])}, bytes(2)), ptfile.FormatError),
    "gap": (blob({"a": u8([0, 1]), "b": u8([2, 3])}, bytes(3)), ptfile.FormatError),
    "trailing bytes": (blob({"a": u8([0, 1])}, bytes(3)), ptfile.FormatError),
    "duplicate name": (blob(b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                            b'"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}',
                            bytes(2)), ptfile.FormatError),
    "metadata not strings": (blob({"__metadata__": {"a": 1}}), ptfile.FormatError),
    "metadata a list": (blob({"__metadata__": []}), ptfile.FormatError),
    "F4 odd last dim": (blob({"a": u8([0, 3], [2, 3], "F4")}, bytes(3)), ptfile.FormatError),
    "F4 0-d": (blob({"a": u8([0, 1], [], "F4")}, bytes(1)), ptfile.FormatError),
    "rank 65": (blob({"a": u8([0, 1], [1] * 65)}, b"x"), ptfile.LimitExceededError),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_raise_ptfile_errors(name: str, tmp_path: Path) -> None:
    data, error = MALFORMED[name]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    if name != "rank 65":  # torch 2.13 loads 65 dimensions; numpy (and so ptfile) cannot
        with pytest.raises(Exception) as refused:  # noqa: PT011 - torch's own error types
            torch.load(path)
        assert not isinstance(refused.value, ptfile.PtfileError)
    unknown = ptfile.detect_format(io.BytesIO(data)) is Format.UNKNOWN  # no "{" at byte 8
    expected: type[ptfile.PtfileError] = ptfile.UnknownFormatError if unknown else error
    with pytest.raises(expected):
        ptfile.load(path)
    with pytest.raises(expected):
        ptfile.load(io.BytesIO(data))
    with pytest.raises(expected):
        ptfile.open(path)
    with pytest.raises(expected):
        ptfile.inspect(path)
    with pytest.raises(ptfile.PtfileError):
        ptfile.scan(path)
    if unknown or expected is ptfile.UnsupportedFeatureError:  # nothing ptfile can verify
        with pytest.raises(expected):
            verify(path)
    else:
        assert not verify(path).ok


@pytest.mark.parametrize("name", ["huge length", "overlap", "wrong size"])
def test_cli_on_malformed(name: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(MALFORMED[name][0])
    assert run("scan", path).returncode == EXIT_ERROR
    assert run("inspect", path).returncode == EXIT_ERROR
    assert run("verify", path).returncode == EXIT_INVALID
    done = run("scan", path, "--json")
    assert done.returncode == EXIT_ERROR and "error" in json.loads(done.stdout)


def test_header_ceiling_is_a_limit(st_file: Path) -> None:
    with pytest.raises(ptfile.LimitExceededError) as hit:
        ptfile.load(st_file, limits=ptfile.Limits(max_safetensors_header_bytes=64))
    assert hit.value.limit == "max_safetensors_header_bytes"
    ptfile.load(st_file, limits=ptfile.Limits(max_safetensors_header_bytes=1 << 20))


# --------------------------------------------------------------------------- accepted


ACCEPTED: dict[str, bytes] = {
    "empty": blob({}),
    "null metadata": blob({"__metadata__": None}),
    "leading whitespace": blob(b' \n{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
                               b"\x07"),
    "extra entry field": blob({"a": {**u8([0, 1]), "note": 1}}, b"\x07"),
    "json order is not data order": blob({"z": u8([1, 2]), "a": u8([0, 1]), "m": u8([2, 3])},
                                         b"\x01\x02\x03"),
    "unicode name": blob({"é/ü": u8([0, 1])}, b"\x07"),
    "empty tensor mid-data": blob({"b": u8([0, 1]), "e": u8([1, 1], [0, 3], "F32")}, b"\x07"),
    "F4 pairs": blob({"a": u8([0, 3], [3, 2], "F4")}, b"\x01\x02\x03"),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_what_torch_reads_ptfile_reads(name: str, tmp_path: Path) -> None:
    path = tmp_path / "ok.safetensors"
    path.write_bytes(ACCEPTED[name])
    ref = torch.load(path)
    mine = ptfile.load(path)
    assert list(mine) == list(ref)
    for key, t in mine.items():
        same(t, ref[key])
    with ptfile.open(path) as ck:
        assert list(ck) == list(ref)
    assert ptfile.scan(path).is_clean


def test_a_folder_stays_dcp_a_file_in_it_opens_plain(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    safetensors.torch.save_file({"w": torch.arange(4.0)}, folder / "model.safetensors")
    with ptfile.open(folder) as ck:
        assert isinstance(ck, DCPReader)
    with ptfile.open(folder / "model.safetensors") as ck:
        assert ck.format is Format.SAFETENSORS and ck.get_tensor("w").tolist() == [0, 1, 2, 3]
    assert ptfile.load(folder / "model.safetensors")["w"].numpy().tolist() == [0, 1, 2, 3]


NUMPY_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                "uint16", "uint32", "uint64", "bool"]


@given(st.dictionaries(
    st.text("abc._", min_size=1, max_size=6),
    st.tuples(st.sampled_from(NUMPY_DTYPES),
              st.lists(st.integers(0, 3), max_size=3), st.integers(0, 2**32 - 1)),
    max_size=5))
def test_roundtrip_property(spec: dict[str, tuple[str, list[int], int]]) -> None:
    arrays = {}
    for name, (dtype, shape, seed) in spec.items():
        rng = np.random.default_rng(seed)
        arrays[name] = rng.integers(0, 2, size=shape, dtype=np.uint8).astype(dtype) \
            if dtype == "bool" else rng.integers(0, 100, size=shape).astype(dtype)
    data = safetensors.numpy.save(arrays)
    mine = ptfile.load(data)
    back = safetensors.numpy.load(data)
    assert sorted(mine) == sorted(back)
    for name, t in mine.items():
        np.testing.assert_array_equal(t.numpy(), back[name])
        assert t.numpy().dtype == back[name].dtype and t.numpy().shape == back[name].shape


def test_a_url_reads_by_its_bytes(st_file: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    fsspec.filesystem("memory").pipe("/st-read/model.bin", st_file.read_bytes())
    url = "memory://st-read/model.bin"
    try:
        ref = torch.load(st_file)
        for name, t in ptfile.load(url).items():
            same(t, ref[name])
        with ptfile.open(url) as ck:
            assert ck.format is Format.SAFETENSORS and ck.metadata()["k"] == "v"
            assert ck.get_tensor("bool").tolist() == [True, False, True]
        assert ptfile.scan(url).is_clean
    finally:
        fsspec.filesystem("memory").rm("/st-read", recursive=True)
