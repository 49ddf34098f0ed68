"""DCP directories on S3 (moto on loopback, through s3fs): load_dcp, open, inspect, scan and
verify take the directory's URL and fetch only the byte ranges they need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ptfile
from dcp_cases import make_chunked
from oracle import assert_same, torch_bytes


@pytest.fixture(scope="module")
def remote(s3: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, Path, dict[str, Any]]:
    local = tmp_path_factory.mktemp("dcp") / "ckpt"
    make_chunked(local)
    for item in local.iterdir():
        s3["fs"].pipe(f"models/ckpt/{item.name}", item.read_bytes())
    return "s3://models/ckpt", local, s3["options"]


def test_load_dcp_from_s3_equals_local(remote: tuple[str, Path, dict[str, Any]]) -> None:
    url, local, options = remote
    got = ptfile.load_dcp(url, storage_options=options)
    expected = ptfile.load_dcp(local)
    assert list(got) == list(expected)
    np.testing.assert_array_equal(got["w"].numpy(), expected["w"].numpy())
    assert got["step"] == 7


def test_open_on_s3_fetches_only_the_chunks_read(remote: tuple[str, Path, dict[str, Any]]
                                                 ) -> None:
    url, local, options = remote
    full = ptfile.load_dcp(local)["w"].numpy()
    total = sum(p.stat().st_size for p in local.iterdir())
    with ptfile.open(url, storage_options=options) as ck:
        assert ck.info("w").shape == (9, 4)
        assert ck.files.opened == {".metadata"}
        np.testing.assert_array_equal(ck.get_slice("w")[:2, 1], full[:2, 1])
        assert len(ck.files.opened) == 2  # .metadata and the first block's file
        assert ck.files.bytes_fetched < total
    report = ptfile.inspection.verify(url, storage_options=options)
    assert report.ok, report.to_dict()
    assert ptfile.inspect(url, storage_options=options).format == "dcp"
    assert ptfile.scan(url, storage_options=options).is_clean
    assert ptfile.detect_format(url, storage_options=options) is ptfile.Format.DCP


def test_files_on_s3_still_open_as_files(s3: dict[str, Any]) -> None:
    import torch

    pytest.importorskip("s3fs")
    s3["fs"].pipe("models/plain", torch_bytes({"w": torch.ones(2)}))
    with ptfile.open("s3://models/plain", storage_options=s3["options"]) as ck:
        assert isinstance(ck, ptfile.CheckpointReader)
        assert_same(ck["w"], torch.ones(2))
    with pytest.raises(ptfile.FormatError, match=r"no \.metadata"):
        ptfile.load_dcp("s3://models", storage_options=s3["options"])


def test_suffixless_http_url_is_not_listed_as_a_directory(tmp_path: Path) -> None:
    """fsspec would answer "is it a directory?" over HTTP by fetching the whole page."""
    import torch

    from rangeserver import RangeServer

    torch.save({"w": torch.zeros(1 << 18)}, tmp_path / "model")
    with RangeServer(tmp_path) as server:
        with ptfile.open(server.url("model")) as ck:
            assert isinstance(ck, ptfile.CheckpointReader)
            assert ck.info("w").shape == (1 << 18,)
        assert server.stats.body_bytes["model"] < (1 << 20)  # the file is 1 MiB
