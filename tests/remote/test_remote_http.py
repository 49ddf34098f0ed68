"""Remote checkpoints over HTTP: a loopback range server the tests start and stop.

Every case gives the values of a local load, within the byte and request bounds
of the remote-source design (``ptfile/_remote.py``): metadata in at most 3
requests once the size is known, slices of the selected bytes, a full load of
at most 1.05x the file, a scan that never reads storages, and clear errors
from servers that misbehave.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_same
from ptfile.model.tree import flatten
from rangeserver import Behaviour, RangeServer

torch.manual_seed(13)
GOLDEN = Path(__file__).parent.parent / "golden"


class _Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)


def _make_files(folder: Path) -> dict[str, Path]:
    base = torch.randn(64, 256)
    files = {
        "zip.pt": {"w": base, "t": base.t(), "h": torch.randn(300).to(torch.bfloat16),
                   "row": base[3], "big": torch.randn(1024, 1024)},
        "legacy.pt": {"w": base, "i": torch.arange(50)},
        "legacy_big.pt": {"big": torch.randn(2048, 1024)},  # 8 MiB of storage after the pickles
    }
    for name, obj in files.items():
        torch.save(obj, folder / name,
                   _use_new_zipfile_serialization=not name.startswith("legacy"))
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(_Holder()), buf)
    (folder / "script.pt").write_bytes(buf.getvalue())
    (folder / "tar.pt").write_bytes((GOLDEN / "tiny_tar.pt").read_bytes())
    return {p.name: p for p in folder.iterdir()}


def _big_sparse(folder: Path) -> Path:
    """A 2 GiB checkpoint of 64 bf16 4096x4096 matrices, written with holes for data."""
    bf16 = ptfile.DTYPES["bfloat16"]
    n = 4096 * 4096
    sd = {f"layer{i}.weight": ptfile.Tensor(ptfile.Storage(None, bf16, nbytes=2 * n), 0,
                                            (4096, 4096), (4096, 1), dtype=bf16)
          for i in range(64)}
    path = folder / "big.pt"
    ptfile.save(sd, path, skip_data=True)
    return path


def _same_trees(a: object, b: object) -> None:
    """Two ptfile loads hold the same tensors (names, dtypes, shapes, values)."""
    left, right = flatten(a), flatten(b)
    assert list(left) == list(right)
    for name, t in left.items():
        u = right[name]
        assert (t.dtype, t.shape, t.stride()) == (u.dtype, u.shape, u.stride()), name
        np.testing.assert_array_equal(np.asarray(t.numpy()), np.asarray(u.numpy()), name)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("served")
    _make_files(path)
    _big_sparse(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)  # 12 MiB: not left in the basetemp


@pytest.fixture
def server(folder: Path) -> Iterator[RangeServer]:
    with RangeServer(folder) as srv:
        yield srv


@pytest.mark.parametrize("name", ["zip.pt", "legacy.pt", "legacy_big.pt", "script.pt",
                                  "tar.pt"])
def test_remote_load_equals_local_within_105_percent(server: RangeServer, folder: Path,
                                                     name: str) -> None:
    local = ptfile.load(folder / name)
    remote = ptfile.load(server.url(name))
    _same_trees(remote, local)
    if name != "tar.pt":  # the torch oracle (the tar golden predates weights_only loads)
        ref = torch.jit.load(folder / name).state_dict() if name == "script.pt" else \
            torch.load(folder / name, weights_only=True)
        assert_same(remote, ref)
    size = (folder / name).stat().st_size
    assert server.stats.body_bytes[name] <= 1.05 * size


def test_remote_full_load_fetches_concurrent_chunks(server: RangeServer, folder: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from ptfile._io import remote as _remote

    monkeypatch.setattr(_remote, "CHUNK_BYTES", 1 << 16)  # many chunks of a small file
    remote = ptfile.load(server.url("zip.pt"))
    assert_same(remote, torch.load(folder / "zip.pt", weights_only=True))
    size = (folder / "zip.pt").stat().st_size
    assert server.stats.requests["zip.pt"] == -(-size // (1 << 16))
    assert server.stats.body_bytes["zip.pt"] == size


def _metadata_bytes(path: Path) -> int:
    """data.pkl plus the central directory (and the end records after it): the bound the
    remote design promises, less its 1 MiB."""
    with zipfile.ZipFile(path) as z:
        pickle = z.getinfo("big/data.pkl").file_size
        return pickle + path.stat().st_size - z.start_dir


def test_remote_open_and_every_info_of_2gib_within_bound(server: RangeServer,
                                                         folder: Path) -> None:
    path = folder / "big.pt"
    assert path.stat().st_size >= 2 * 2**30
    with ptfile.open(server.url("big.pt")) as ck:
        infos = list(ck.infos())
        assert len(infos) == 64 and all(i.data_offset is not None for i in infos)
        with ptfile.open(path) as local:
            assert infos == list(local.infos())
    assert server.stats.requests["big.pt"] <= 3  # (the size came from a HEAD)
    assert server.stats.body_bytes["big.pt"] <= _metadata_bytes(path) + 2**20


def test_remote_slice_reads_only_selected_bytes(server: RangeServer, folder: Path) -> None:
    expected = torch.load(folder / "zip.pt", weights_only=True)["big"].numpy()
    with ptfile.open(server.url("zip.pt")) as ck:
        ck.info("big")
        server.reset()
        rows = ck.get_slice("big")[::256, 5:9]  # 4 runs of 16 bytes, 1 MiB apart
        np.testing.assert_array_equal(rows, expected[::256, 5:9])
        assert server.stats.requests["zip.pt"] <= 4 + 1, server.stats.ranges  # runs, header
        assert server.stats.body_bytes["zip.pt"] <= 4 * 16 + 2 * (64 << 10)
        np.testing.assert_array_equal(ck.get_slice("big")[7, ::-3], expected[7, ::-3])
        np.testing.assert_array_equal(ck.get_tensor("t"),
                                      torch.load(folder / "zip.pt")["t"].numpy())


def test_remote_scan_inspect_verify_detect(server: RangeServer, folder: Path) -> None:
    url = server.url("big.pt")
    result = ptfile.scan(url)
    assert result.to_dict()["findings"] == ptfile.scan(folder / "big.pt").to_dict()["findings"]
    # The pickles and the 64 local headers (fetched together), never 2 GiB of storages.
    assert server.stats.body_bytes["big.pt"] <= _metadata_bytes(folder / "big.pt") + 2**20
    assert ptfile.detect_format(server.url("script.pt")) is ptfile.Format.TORCHSCRIPT
    assert ptfile.inspect(server.url("zip.pt")).tensors == \
        ptfile.inspect(folder / "zip.pt").tensors
    from ptfile.inspection import verify

    assert verify(server.url("zip.pt")).ok
    archive = ptfile.load_torchscript(server.url("script.pt"))
    assert_same(archive.state_dict(), torch.jit.load(folder / "script.pt").state_dict())


def test_remote_cli_inspect_scan_convert(server: RangeServer, folder: Path,
                                         tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ptfile", *args], capture_output=True,
                              text=True, timeout=120, check=False)

    done = cli("inspect", server.url("zip.pt"), "--json")
    assert done.returncode == 0, done.stderr
    assert {t["name"] for t in json.loads(done.stdout)["tensors"]} == {"w", "t", "h", "row",
                                                                         "big"}
    assert cli("scan", server.url("zip.pt")).returncode == 0
    out = tmp_path / "z.safetensors"
    done = cli("convert", server.url("zip.pt"), str(out))
    assert done.returncode == 0, done.stderr
    from safetensors.numpy import load_file

    loaded = load_file(out)
    assert np.array_equal(loaded["big"], torch.load(folder / "zip.pt")["big"].numpy())
    done = cli("inspect", server.url("nothing.pt"))
    assert done.returncode == 2 and "404" in done.stderr


@pytest.mark.parametrize("ranges", ["none", "ignore"])
def test_remote_server_without_ranges_reads_once(folder: Path, ranges: str) -> None:
    with RangeServer(folder, Behaviour(ranges=ranges)) as srv, warnings.catch_warnings():
        warnings.simplefilter("ignore" if ranges == "ignore" else "error", ptfile.PtfileWarning)
        with ptfile.open(srv.url("zip.pt")) as ck:
            np.testing.assert_array_equal(ck.get_tensor("w"),
                                          torch.load(folder / "zip.pt")["w"].numpy())
        assert srv.stats.requests["zip.pt"] == 1  # one whole read, kept
    with RangeServer(folder, Behaviour(ranges="ignore")) as srv, \
            pytest.warns(ptfile.PtfileWarning, match="ignores range requests"):
        ptfile.open(srv.url("zip.pt")).close()


def test_remote_server_without_ranges_refused_over_the_limit(folder: Path) -> None:
    with RangeServer(folder, Behaviour(ranges="none")) as srv, \
            pytest.raises(ptfile.RemoteError, match="max_whole_download_bytes"):
        ptfile.open(srv.url("zip.pt"), limits=ptfile.Limits(max_whole_download_bytes=1000))


@pytest.mark.parametrize("behaviour", [Behaviour(fail_first=2), Behaviour(truncate_first=2)],
                         ids=["500s-then-success", "truncated-then-whole"])
def test_remote_transient_failures_are_retried(folder: Path, behaviour: Behaviour) -> None:
    with RangeServer(folder, behaviour) as srv:
        assert_same(ptfile.load(srv.url("zip.pt")), torch.load(folder / "zip.pt"))
        with ptfile.open(srv.url("legacy.pt")) as ck:
            np.testing.assert_array_equal(ck.get_tensor("i"), np.arange(50))


@pytest.mark.parametrize(("behaviour", "match"), [
    (Behaviour(fail_first=100), "failed after"),
    (Behaviour(truncate_first=100), "failed after|expected"),
    (Behaviour(size_delta=1000), "expected|failed after|truncated"),
    (Behaviour(size_delta=-1000), None),
], ids=["always-500", "always-truncated", "length-too-big", "length-too-small"])
def test_remote_persistent_failures_are_clear_errors(folder: Path, behaviour: Behaviour,
                                                     match: str | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from ptfile._io import remote as _remote

    monkeypatch.setattr(_remote, "BACKOFF_SECONDS", 0.001)
    with RangeServer(folder, behaviour) as srv, \
            pytest.raises((ptfile.RemoteError, ptfile.FormatError), match=match):
        ptfile.load(srv.url("zip.pt"))


def test_remote_legacy_streams_read_once_and_scanned_without_storages(
        server: RangeServer, folder: Path) -> None:
    path = folder / "legacy_big.pt"
    with ptfile.open(server.url("legacy_big.pt")) as ck:  # a stream: read whole, in order
        np.testing.assert_array_equal(ck.get_tensor("big"), torch.load(path)["big"].numpy())
    # the signature's 64 KiB block, then the file once, in two 8 MiB chunks
    assert server.stats.requests["legacy_big.pt"] <= 3
    assert server.stats.body_bytes["legacy_big.pt"] <= path.stat().st_size + (64 << 10)
    server.reset()
    result = ptfile.scan(server.url("legacy_big.pt"))
    assert result.to_dict()["findings"] == ptfile.scan(path).to_dict()["findings"]
    assert server.stats.body_bytes["legacy_big.pt"] <= 2 << 20  # the pickles, not 8 MiB


def test_remote_not_found_forbidden_and_missing_backends(server: RangeServer) -> None:
    with pytest.raises(ptfile.RemoteError) as info:
        ptfile.open(server.url("missing.pt"))
    assert info.value.status == 404 and isinstance(info.value, OSError)
    with pytest.raises(ptfile.RemoteError, match="access denied") as info:
        ptfile.load(server.url("forbidden/zip.pt"))
    assert info.value.status == 403
    with pytest.raises(ptfile.UnsupportedFeatureError, match="gcsfs"):
        ptfile.load("gs://bucket/model.pt")
    with pytest.raises(ValueError, match="mmap needs a path"):
        ptfile.load(server.url("zip.pt"), mmap=True)


def test_remote_save_and_convert_to_writable_urls(folder: Path, tmp_path: Path) -> None:
    obj = {"w": np.arange(12.0).reshape(3, 4)}
    ptfile.save(obj, "memory://ptfile-tests/saved.pt")
    local = io.BytesIO()
    ptfile.save(obj, local, archive_name="saved")
    import fsspec

    with fsspec.open("memory://ptfile-tests/saved.pt", "rb") as fp:
        assert fp.read() == local.getvalue()  # byte-identical to a local save of that name
    assert_same(ptfile.load("memory://ptfile-tests/saved.pt"),
                torch.load(io.BytesIO(local.getvalue()), weights_only=True))
    from ptfile.export import convert

    convert.convert(str(folder / "zip.pt"), "memory://ptfile-tests/z.safetensors",
                    to="safetensors")
    with fsspec.open("memory://ptfile-tests/z.safetensors", "rb") as fp:
        (tmp_path / "z.safetensors").write_bytes(fp.read())
    from safetensors.numpy import load_file

    assert np.array_equal(load_file(tmp_path / "z.safetensors")["w"],
                          torch.load(folder / "zip.pt")["w"].numpy())
    with RangeServer(folder) as srv, \
            pytest.raises(ptfile.UnsupportedFeatureError, match="cannot be written"):
        ptfile.save(obj, srv.url("new.pt"))


def test_remote_broken_streamed_read_is_a_remote_error(folder: Path) -> None:
    with RangeServer(folder, Behaviour(ranges="none", truncate_first=1)) as srv, \
            pytest.raises(ptfile.RemoteError):
        ptfile.open(srv.url("zip.pt"))
