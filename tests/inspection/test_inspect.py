"""inspect (no data reads), verify (precise problems) and diff, as library calls."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ptfile
from counting import CountingFile
from ptfile.inspection import diff, inspect, verify


@pytest.fixture
def model(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 1024)
    path = tmp_path / "m.pt"
    torch.save({"sd": lin.state_dict(), "p": torch.nn.Parameter(torch.ones(3)),
                "view": lin.weight.detach()[:2]}, path)
    return path


def test_inspect_reads_no_tensor_data(model: Path) -> None:
    counting = CountingFile(model)
    ins = inspect(counting)
    counting.close()
    storage_bytes = sum(r.size for r in ins.records if "/data/" in r.name)
    assert storage_bytes > 256 * 1024 * 4
    # the end-record search reads the last 64 KiB (EOCD comment room), then headers only
    assert counting.bytes_read < model.stat().st_size - storage_bytes + 66_000
    assert ins.totals["parameters"] == 256 * 1024 + 1024 + 3 + 2 * 256
    assert ins.totals["bytes_by_dtype"] == {"float32": storage_bytes}
    assert ins.shared == {"0": ["sd.weight", "view"]}
    names = {t.name for t in ins.tensors}
    assert names == {"sd.weight", "sd.bias", "p", "view"}
    assert next(t for t in ins.tensors if t.name == "p").is_parameter
    doc = ins.to_dict()
    assert doc["tree"]["items"]["sd"]["type"] == "OrderedDict"
    assert ins.records[0].data_offset % 64 == 0


def test_verify_reports_the_record(model: Path, tmp_path: Path) -> None:
    assert verify(model).ok
    data = bytearray(model.read_bytes())
    ins = inspect(model)
    target = next(r for r in ins.records if r.name.endswith("data/1"))
    data[target.data_offset] ^= 1
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    report = verify(bad)
    assert not report.ok
    assert [(p.severity, p.where) for p in report.problems] == [("error", target.name)]
    data[0:4] = b"XXXX"  # no longer a ZIP, nor any checkpoint: nothing to verify
    bad.write_bytes(bytes(data))
    with pytest.raises(ptfile.UnknownFormatError):
        verify(bad)


def test_verify_flags_unreferenced_records(tmp_path: Path) -> None:
    from ptfile.archive import ZipWriter

    path = tmp_path / "extra.pt"
    buf = bytearray()
    ptfile.save({"w": np.ones(2, np.float32)}, path)
    original = ptfile.inspect(path)
    with ZipWriter(buf.extend, "extra") as writer:
        for r in original.records:
            if not r.name.endswith("serialization_id"):
                rec = r.name.split("/", 1)[1]
                writer.write_record(rec, path.read_bytes()[r.data_offset:r.data_offset + r.size])
        writer.write_record("data/99", b"junk")
    path.write_bytes(bytes(buf))
    report = verify(path)
    assert report.ok
    assert any("not referenced" in p.message for p in report.problems)


def test_diff_api(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    ptfile.save({"x": np.array([1.0, np.nan], np.float32), "y": np.zeros(3, np.int8),
                 "z": np.ones(2, np.float32)}, a)
    ptfile.save({"x": np.array([1.5, np.nan], np.float32), "y": np.zeros(4, np.int8),
                 "w": np.ones(1, np.float32)}, b)
    report = diff(a, b)
    assert report.max_abs_diff == {"x": 0.5}
    assert report.changed == {"y": "int8[3] -> int8[4]"}
    assert report.removed == ["z"]
    assert report.added == ["w"]
    assert not report.identical
    assert diff(a, a).identical
