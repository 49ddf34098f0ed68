"""Remote checkpoints on S3: moto's standalone server on loopback, read through s3fs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptfile
from oracle import assert_same, torch_bytes

pytest.importorskip("moto.server")
pytest.importorskip("s3fs")


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
