"""ptfile.open: metadata without data reads, slices reading only their bytes, skip_data both ways."""

from __future__ import annotations

import io
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from counting import CountingFile
from ptfile._io.local import open_source
from ptfile.archive import ZipReader


@pytest.fixture
def views_file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = {"base": base, "sub": base[1:3, ::2], "t": base.t(),
          "bf": torch.arange(6, dtype=torch.bfloat16), "p": torch.nn.Parameter(torch.ones(3)),
          "nested": {"list": [torch.tensor([1, 2], dtype=torch.int64)]},
          "c": torch.tensor([1 + 2j, 3 - 1j]).conj(), "empty": torch.empty(0, 3)}
    path = tmp_path / "views.pt"
    torch.save(sd, path)
    return path, sd


def _expected(sd: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update({f"{k}.list.0": v["list"][0]})
        else:
            out[k] = v
    return out


def test_open_keys_and_metadata(views_file: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, sd = views_file
    with ptfile.open(path) as ck:
        assert list(ck.keys()) == list(_expected(sd))
        meta = ck.metadata()
        assert meta["format"] == "zip"
        assert meta["byteorder"] == "little"
        assert meta["storage_alignment"] == "64"
        assert meta["version"] == "3"
        assert ck.format is ptfile.Format.ZIP
        assert "missing" not in ck
        assert len(ck) == len(_expected(sd))


def test_open_storage_keys_include_storages_without_a_tensor(tmp_path: Path) -> None:
    path = tmp_path / "s.pt"
    torch.save({"w": torch.ones(2), "s": torch.zeros(3).untyped_storage(),
                "v": torch.ones(4)[1:]}, path)
    with ptfile.open(path) as ck:
        assert list(ck) == ["w", "v"]
        assert ck.storage_keys == {"0", "1", "2"}
        zr = ck.zip_reader
        assert zr is not None
        assert [ck.info(name).data_offset for name in ck] == \
            [zr.data_offset(f"s/data/{key}") for key in ("0", "2")]


@pytest.mark.parametrize("mmap", [True, False])
def test_open_info_matches_torch(views_file: tuple[Path, dict[str, torch.Tensor]],
                                 mmap: bool) -> None:
    path, sd = views_file
    reader = ZipReader(open_source(path.read_bytes()))
    with ptfile.open(path, mmap=mmap) as ck:
        for name, t in _expected(sd).items():
            info = ck.info(name)
            assert info.dtype.name == str(t.dtype).removeprefix("torch.")
            assert info.shape == tuple(t.shape)
            assert info.stride == t.stride()
            assert info.storage_offset == t.storage_offset()
            assert info.is_parameter == isinstance(t, torch.nn.Parameter)
            record = reader.get(f"views/data/{info.storage_key}")
            assert record is not None
            assert info.data_offset == reader.data_offset(record)
            assert info.storage_nbytes == t.untyped_storage().nbytes()
        assert ck.info("sub").storage_key == ck.info("base").storage_key == ck.info("t").storage_key


@pytest.mark.parametrize("mmap", [True, False])
def test_open_get_tensor_values(views_file: tuple[Path, dict[str, torch.Tensor]],
                                mmap: bool) -> None:
    path, sd = views_file
    with ptfile.open(path, mmap=mmap) as ck:
        for name, t in _expected(sd).items():
            got = ck.get_tensor(name)
            want = t.detach().resolve_conj().float() if t.dtype == torch.bfloat16 else \
                t.detach().resolve_conj()
            np.testing.assert_array_equal(np.asarray(got, dtype=want.numpy().dtype), want.numpy())
            assert ck[name].shape == tuple(t.shape)


KEYS = [np.s_[...], np.s_[1], np.s_[-1, 2:], np.s_[::2, ::-3], np.s_[None, 1:3, 3],
        np.s_[:, 1], np.s_[2:2], np.s_[..., -1], np.s_[3, ::-1]]


@pytest.mark.parametrize("key", KEYS)
def test_get_slice_matches_numpy(views_file: tuple[Path, dict[str, torch.Tensor]],
                                 key: Any) -> None:
    path, sd = views_file
    with ptfile.open(path) as ck:
        for name in ("base", "t"):
            want = sd[name].numpy()[key]
            sl = ck.get_slice(name)
            assert sl.get_shape() == list(sd[name].shape)
            assert sl.get_dtype() == "float32"
            np.testing.assert_array_equal(sl[key], want)


def test_get_slice_errors(views_file: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, _ = views_file
    with ptfile.open(path) as ck:
        sl = ck.get_slice("base")
        with pytest.raises(IndexError):
            sl[4]
        with pytest.raises(IndexError):
            sl[0, 0, 0]
        with pytest.raises(TypeError):
            sl["x"]
        with pytest.raises(KeyError):
            ck.get_tensor("nope")
    with pytest.raises(ValueError, match="closed"):
        ck.get_tensor("base")


@pytest.mark.parametrize("kind", ["file", "dcp", "bin-shards"])
def test_every_reader_is_a_mapping_and_a_context_manager(tmp_path: Path, kind: str) -> None:
    """One protocol for the file, DCP and set readers (ptfile.reader.TensorReader): names,
    membership and length without reading a tensor, and reads after close refused."""
    import torch.distributed.checkpoint as dcp

    from folders import write_bin_shards

    state = {"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(2, 3)}
    path = tmp_path / kind
    if kind == "file":
        torch.save(state, path)
    elif kind == "dcp":
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
    else:
        write_bin_shards(state, path, shards=2)
    ck = ptfile.open(path)
    with ck as entered:
        assert entered is ck
        assert sorted(ck) == sorted(state) and len(ck) == len(state)
        assert "a" in ck and "z" not in ck and 0 not in ck
        assert (ck.zip_reader is None) is (kind != "file")
        for name, want in state.items():
            assert np.array_equal(ck.get_tensor(name), want.numpy())
    with pytest.raises(ValueError, match="closed"):
        ck.get_tensor("a")


def test_open_damaged_raises_ptfile_errors(tmp_path: Path,
                                           views_file: tuple[Path, Any]) -> None:
    data = views_file[0].read_bytes()
    for cut in (10, len(data) // 2, len(data) - 30):
        bad = tmp_path / "bad.pt"
        bad.write_bytes(data[:cut])
        with pytest.raises(ptfile.PtfileError):
            ptfile.open(bad)
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ptfile.UnknownFormatError):
        ptfile.open(bad)


def test_open_legacy_formats_fall_back(golden: Path) -> None:
    with ptfile.open(golden / "tiny_legacy.pt") as ck:
        assert ck.format is ptfile.Format.LEGACY
        np.testing.assert_array_equal(ck.get_tensor("0"), [1.0, 2.0])
        np.testing.assert_array_equal(ck.get_slice("1")[:1], [2.0])


def test_open_big_endian(golden: Path) -> None:
    with ptfile.open(golden / "tiny_bigendian.pt") as ck:
        values = {k: ck.get_tensor(k).tolist() for k in ck}
    assert [1, 258] in values.values()
    assert [1.0, 2.0] in values.values()


# ----------------------------------------------------------------------------- scale


@pytest.fixture(scope="module")
def many_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("many") / "many.pt"
    rng = np.random.default_rng(0)
    values = rng.standard_normal((100_000, 4)).astype(np.float32)
    ptfile.save({f"model.layers.{i}.weight": values[i].copy() for i in range(100_000)}, path)
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)  # 28 MiB: not left in the basetemp


def test_open_100k_tensors_reads_only_headers_and_pickle(many_file: Path) -> None:
    counting = CountingFile(many_file)
    with ptfile.open(counting, mmap=False) as ck:
        infos = list(ck.infos())
        assert len(infos) == 100_000
        assert infos[-1].shape == (4,)
        assert infos[-1].dtype.name == "float32"
        after_listing = counting.bytes_read
        row = ck.get_tensor("model.layers.99999.weight")
        assert counting.bytes_read - after_listing < 200  # one local header + 16 data bytes
    reader = ZipReader(open_source(many_file.read_bytes()))
    pickle_size = reader.get("many/data.pkl").size  # type: ignore[union-attr]
    cd_size = sum(46 + len(r.name) for r in reader.records)
    assert after_listing < pickle_size + cd_size + 70_000 + 4096
    storage_bytes = sum(r.size for r in reader.records if "/data/" in r.name)
    assert after_listing < many_file.stat().st_size - storage_bytes // 2
    want = np.random.default_rng(0).standard_normal((100_000, 4)).astype(np.float32)[-1]
    np.testing.assert_array_equal(row, want)


@pytest.mark.slow
def test_open_2gib_sparse_file_reads_little(tmp_path: Path) -> None:
    """A >2 GiB checkpoint written with skip_data (sparse), filled through a shared map."""
    f32 = ptfile.DTYPES["float32"]
    n = (2**31 + 2**20) // 4 + 3
    big = ptfile.Tensor(ptfile.Storage(None, f32, nbytes=n * 4), 0, (n,), (1,))
    small = ptfile.Tensor(ptfile.Storage(None, f32, nbytes=8), 0, (2,), (1,))
    path = tmp_path / "big.pt"
    ptfile.save({"big": big, "small": small}, path, skip_data=True)
    assert path.stat().st_size > 2**31
    assert path.stat().st_blocks * 512 < 2**26  # holes, not zeros
    filled = ptfile.load(path, mmap="r+")
    filled["big"].numpy()[-3:] = [1.0, 2.0, 3.0]
    filled["small"].numpy()[:] = [5.0, 6.0]
    del filled
    counting = CountingFile(path)
    with ptfile.open(counting, mmap=False) as ck:
        info = ck.info("big")
        assert info.shape == (n,)
        assert info.data_offset is not None
        assert info.data_offset + info.storage_nbytes > 2**31
        np.testing.assert_array_equal(ck.get_slice("big")[-2:], [2.0, 3.0])
        np.testing.assert_array_equal(ck.get_tensor("small"), [5.0, 6.0])
    assert counting.bytes_read < 2**20
    loaded = torch.load(path, mmap=True)
    assert loaded["big"][-1].item() == 3.0
    assert loaded["small"].tolist() == [5.0, 6.0]


# ----------------------------------------------------------------------------- skip_data


def test_save_skip_data_is_torch_layout_with_zero_crc(tmp_path: Path) -> None:
    sd = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, np.int64)}
    full, skipped = io.BytesIO(), io.BytesIO()
    ptfile.save(sd, full)
    ptfile.save(sd, skipped, skip_data=True)
    a, b = full.getvalue(), skipped.getvalue()
    assert len(a) == len(b)
    reader = ZipReader(open_source(b))
    for record in reader.records:
        if "/data/" in record.name:
            assert record.crc32 == 0
            assert reader.read(record) == bytes(record.size)
        elif not record.name.endswith("serialization_id"):
            assert record.crc32 == zlib.crc32(reader.read(record))
    loaded = torch.load(io.BytesIO(b))
    assert loaded["w"].shape == (2, 3)
    assert loaded["w"].abs().sum().item() == 0
    path = tmp_path / "skip.pt"
    ptfile.save(sd, path, skip_data=True)
    mapped = ptfile.load(path, mmap="r+")
    mapped["w"].numpy()[:] = sd["w"]
    del mapped
    np.testing.assert_array_equal(torch.load(path)["w"].numpy(), sd["w"])


def test_load_skip_data_builds_tensors_without_data(views_file: tuple[Path, Any]) -> None:
    path, sd = views_file
    counting = CountingFile(path)
    obj = ptfile.load(counting, skip_data=True)
    assert obj["sub"].shape == tuple(sd["sub"].shape)
    assert obj["sub"].stride() == (6, 2)
    with pytest.raises(ptfile.UnsupportedFeatureError):
        obj["base"].numpy()


def test_load_skip_data_reads_no_storage_bytes(tmp_path: Path) -> None:
    path = tmp_path / "big.pt"
    torch.save({"w": torch.zeros(256, 1024), "b": torch.ones(3)}, path)
    counting = CountingFile(path)
    obj = ptfile.load(counting, skip_data=True)
    counting.close()
    assert obj["w"].shape == (256, 1024)
    assert obj["b"].storage.nbytes == 12
    assert counting.bytes_read < path.stat().st_size - 256 * 1024 * 4 + 70_000


def _index(draw: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    from hypothesis import strategies as st

    key: list[Any] = []
    for n in shape:
        kind = draw(st.sampled_from(["int", "slice", "none"]))
        if kind == "int" and n:
            key.append(draw(st.integers(-n, n - 1)))
        elif kind == "none":
            key.extend([None, slice(None)])
        else:
            bound = st.none() | st.integers(-n - 2, n + 2)
            step = draw(st.none() | st.integers(-3, 3).filter(bool))
            key.append(slice(draw(bound), draw(bound), step))
    return tuple(key)


def test_get_slice_agrees_with_numpy_on_random_views(tmp_path: Path) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    base = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    views = {"base": base, "t": base.transpose(2, 0, 1), "sub": base[1:, ::2, 3:],
             "flat": base.reshape(-1)[7:50:3]}
    path = tmp_path / "views.pt"
    ptfile.save(views, path)

    @given(name=st.sampled_from(sorted(views)), data=st.data())
    def check(name: str, data: Any) -> None:
        key = _index(data.draw, views[name].shape)
        with ptfile.open(path, mmap=False) as ck:
            np.testing.assert_array_equal(ck.get_slice(name)[key], views[name][key])

    check()


@pytest.mark.parametrize("name", ["tiny_views.pt", "tiny_dtypes.pt", "tiny_state_dict.pt",
                                  "tiny_bigendian.pt", "tiny_legacy.pt"])
def test_open_error_contract_on_damaged_goldens(golden: Path, name: str) -> None:
    """Truncations and bit flips: open/info/get_slice succeed or raise a PtfileError."""
    data = (golden / name).read_bytes()
    rng = np.random.default_rng(len(data))
    samples = [data[:cut] for cut in range(0, len(data), max(1, len(data) // 40))]
    for at in rng.integers(0, len(data), 60):
        flipped = bytearray(data)
        flipped[at] ^= 1 << int(rng.integers(0, 8))
        samples.append(bytes(flipped))
    for sample in samples:
        try:
            with ptfile.open(io.BytesIO(sample)) as ck:
                for info in ck.infos():
                    if info.dtype.numpy is not None and info.storage_key is not None:
                        ck.get_slice(info.name)[...]
        except ptfile.PtfileError:
            pass



@pytest.mark.parametrize("flat", [True, False])
def test_infos_in_bulk_equal_info_one_by_one(tmp_path: Path, flat: bool) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd: dict[str, Any] = {"base": base, "sub": base[1:3, ::2], "p": torch.nn.Parameter(torch.ones(3)),
                          "h": torch.ones(2, dtype=torch.float16), "e": torch.empty(0, 3)}
    if not flat:
        sd["nested"] = {"meta": torch.empty(2, 2, device="meta"), "x": [torch.tensor(1)]}
    path = tmp_path / "m.pt"
    torch.save(sd, path)
    with ptfile.open(path) as ck:
        infos = list(ck.infos())
        assert infos == [ck.info(name) for name in ck]
        assert all(type(info) is ptfile.TensorInfo for info in infos)
        assert [info.is_parameter for info in infos][:3] == [False, False, True]
        assert infos[0].data_offset is not None
