"""Remote checkpoints on S3: moto's standalone server on loopback, read through s3fs."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_same, torch_bytes

moto_server = pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"},
                   "key": "testing", "secret": "testing", "skip_instance_cache": True}
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("models")
        yield {"fs": fs, "options": options}
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_s3_load_open_scan_equal_local(s3: dict[str, Any]) -> None:
    ref = {"w": torch.randn(256, 256), "b": torch.arange(10).to(torch.bfloat16)}
    data = torch_bytes(ref)
    s3["fs"].pipe("models/m.pt", data)
    options = s3["options"]
    assert_same(ptfile.load("s3://models/m.pt", storage_options=options), ref)
    with ptfile.open("s3://models/m.pt", storage_options=options) as ck:
        assert ck.info("w").shape == (256, 256)
        np.testing.assert_array_equal(ck.get_slice("w")[::64, 3], ref["w"].numpy()[::64, 3])
    result = ptfile.scan("s3://models/m.pt", storage_options=options)
    assert not result.is_dangerous
    assert ptfile.detect_format("s3://models/m.pt", storage_options=options) is ptfile.Format.ZIP


def test_s3_legacy_and_missing_key(s3: dict[str, Any]) -> None:
    ref = {"w": torch.arange(6.0)}
    s3["fs"].pipe("models/legacy.pt", torch_bytes(ref, _use_new_zipfile_serialization=False))
    assert_same(ptfile.load("s3://models/legacy.pt", storage_options=s3["options"]), ref)
    with pytest.raises(ptfile.RemoteError) as info:
        ptfile.load("s3://models/none.pt", storage_options=s3["options"])
    assert info.value.status == 404


def test_s3_save_is_byte_identical_to_torch(s3: dict[str, Any], tmp_path: Path) -> None:
    obj = {"w": torch.arange(12.0).reshape(3, 4)}
    ptfile.save(ptfile.load(io.BytesIO(torch_bytes(obj))), "s3://models/saved.pt",
                storage_options=s3["options"])
    torch.save(obj, tmp_path / "saved.pt")  # the archive folder is the target's stem
    ours = s3["fs"].cat_file("models/saved.pt")
    assert ours == (tmp_path / "saved.pt").read_bytes()
