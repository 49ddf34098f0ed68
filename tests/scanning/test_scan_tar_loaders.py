"""The scanner reads legacy tar and stream checkpoints as torch's own loaders do (issue 23).

Each hostile file hides a payload that creates a sentinel file where a loader might
unpickle it; the oracle is the real loaders (``torch.load`` of a path and of a
``BytesIO``, ``pickle.load``) run in a sandboxed child (:mod:`tar_cases`).  The
property: **if any loader creates the sentinel, ``ptfile.scan`` is not clean** (it is
dangerous, or it raises).  Positions where torch 2.13 reads nothing (``sys_info``, bytes
after the archive or after a legacy stream's five pickles, a ``./storages`` member) are
grounded too.  Benign legacy files scan clean; findings name their loaders.
"""

from __future__ import annotations

import io
import struct
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

import ptfile
from ptfile.errors import FormatError
from ptfile.scanning import loaders
from tar_cases import (
    LOADERS,
    SYS_INFO,
    Payload,
    dumps,
    fired,
    float_storage,
    legacy_stream,
    storages_member,
    tar_checkpoint,
    tar_file,
    tensors_member,
    v7_header,
)

DATA4 = struct.pack("<4f", 1, 2, 3, 4)


def _polyglot(p: Payload) -> bytes:
    """A legacy stream whose first 512 bytes are also a v7 tar header (no ``ustar``): the
    header's fields sit inside sys_info's padding string.  torch.load of a path reads the
    tar (its ``storages`` member holds the payload), of a BytesIO the clean stream."""
    sys_info = dumps({"pad": "A" * 700, **SYS_INFO})
    stream = bytearray(legacy_stream([None, None, sys_info, None, None]))
    run = stream.index(b"A" * 700)
    assert run < 100 and run + 700 > 512
    header = v7_header(b"x", 0)  # fields 100..511 (size set below), checksum recomputed
    block = bytearray(stream[:512])
    block[100:512] = header[100:512]
    block[257:263] = b"AAAAAA"  # no ustar magic
    size = len(stream) - 512
    block[124:136] = b"%011o\0" % size
    block[148:156] = b"        "
    block[148:156] = b"%06o\0 " % sum(block)
    stream[:512] = block
    members = tar_file([("pickle", dumps(1)), ("tensors", dumps(0)), ("storages", dumps(p))])
    return bytes(stream) + bytes(-len(stream) % 512) + members


#: name -> (builder of the file around a payload, the loaders that must fire it).
CASES: dict[str, tuple[Callable[[Payload], bytes], set[str]]] = {
    "sys_info": (lambda p: tar_checkpoint(sys_info=dumps(p)), set()),
    "storages-count": (lambda p: tar_checkpoint(storages=dumps(p)), {"torch.load(path)"}),
    "storage-key": (lambda p: tar_checkpoint(storages=storages_member(
        [((p,), "cpu", float_storage(), DATA4)])), {"torch.load(path)"}),
    "storage-location": (lambda p: tar_checkpoint(storages=storages_member(
        [(1, p, float_storage(), DATA4)])), {"torch.load(path)"}),
    "storage-type": (lambda p: tar_checkpoint(storages=storages_member(
        [(1, "cpu", p, DATA4)])), {"torch.load(path)"}),
    "storage-after-float-key": (lambda p: tar_checkpoint(storages=storages_member(
        [(1.5, "cpu", float_storage(), DATA4), ((p,), "cpu", float_storage(), DATA4)])),
        {"torch.load(path)"}),
    "storage-views": (lambda p: tar_checkpoint(storages=storages_member(
        [(1, "cpu", float_storage(), DATA4)], views=[p])), {"torch.load(path)"}),
    "tensors-count": (lambda p: tar_checkpoint(tensors=dumps(p)), {"torch.load(path)"}),
    "tensor-after-tuple-key": (lambda p: tar_checkpoint(tensors=tensors_member(
        [(("a", 1), 1, (2, 2)), ((p,), 1, (1,))])), {"torch.load(path)"}),
    "tensor-after-rank-70": (lambda p: tar_checkpoint(tensors=tensors_member(
        [(0, 1, (1,) * 70), ((p,), 1, (1,))])), {"torch.load(path)"}),
    "pickle": (lambda p: tar_checkpoint(obj=dumps(p)), {"torch.load(path)"}),
    "pickle-after-refused-storage": (lambda p: tar_checkpoint(
        storages=storages_member([(frozenset({1}), "cpu", float_storage(), DATA4)]),
        tensors=dumps(0), obj=dumps(p)), {"torch.load(path)"}),
    "v7-storages": (lambda p: tar_checkpoint(v7=True, storages=dumps(p)), {"torch.load(path)"}),
    "v7-pickle": (lambda p: tar_checkpoint(v7=True, obj=dumps(p)), {"torch.load(path)"}),
    "gnu-storages": (lambda p: tar_checkpoint(storages=dumps(p), fmt=tarfile.GNU_FORMAT),
                     {"torch.load(path)"}),
    "after-the-archive": (lambda p: tar_checkpoint() + dumps(p), set()),
    "dot-slash-storages": (lambda p: tar_file([
        ("pickle", dumps(1)), ("tensors", dumps(0)), ("./storages", dumps(p))]), set()),
    "extra-member": (lambda p: tar_checkpoint(extra=[("evil", dumps(p))]), set()),
    "stream-polyglot": (_polyglot, {"torch.load(path)"}),
    **{f"stream-p{proto}-#{i}": (
        lambda p, i=i, proto=proto: legacy_stream(
            [None] * i + [dumps(p, proto)] + [None] * (4 - i), proto),
        {"torch.load(path)", "torch.load(BytesIO)"} | ({"pickle.load"} if i == 0 else set()))
       for proto in range(6) for i in range(5)},
    **{f"stream-p{proto}-after": (
        lambda p, proto=proto: legacy_stream(protocol=proto, tail=dumps(p, proto)), set())
       for proto in range(6)},
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[bytes, set[str]]]:
    """Every case's bytes and the loaders that fired its payload (one oracle child)."""
    root = tmp_path_factory.mktemp("tar-oracle")
    files = {name: (build(Payload(root / f"sentinel-{i}")), root / f"sentinel-{i}")
             for i, (name, (build, _)) in enumerate(CASES.items())}
    results = fired(root, list(files.values()))
    return {name: (files[name][0], result[0]) for name, result in zip(files, results, strict=True)}


@pytest.mark.parametrize("name", list(CASES))
def test_the_real_loaders_fire_where_the_model_says(
        name: str, outcomes: dict[str, tuple[bytes, set[str]]]) -> None:
    assert outcomes[name][1] == CASES[name][1]
    assert set(outcomes[name][1]) <= set(LOADERS)


@pytest.mark.parametrize("name", list(CASES))
def test_a_payload_a_loader_runs_never_scans_clean(
        name: str, outcomes: dict[str, tuple[bytes, set[str]]]) -> None:
    data, fired_by = outcomes[name]
    if not fired_by:
        return
    try:
        result = ptfile.scan(data)
    except FormatError:
        return  # raising is not clean
    assert result.is_dangerous, [f.to_dict() for f in result.findings if f.verdict.value != "allowed"]
    unsafe = [f for f in result.findings if f.verdict.value == "dangerous"]
    assert all(f.loaders for f in unsafe), unsafe


def test_payloads_name_the_loaders_that_run_them(
        outcomes: dict[str, tuple[bytes, set[str]]]) -> None:
    tar = ptfile.scan(outcomes["pickle"][0])
    assert {f.loaders for f in tar.findings if f.verdict.value == "dangerous"} == \
        {(loaders.TORCH_LOAD_UNSAFE,)}
    stream = ptfile.scan(outcomes["stream-p2-#0"][0])
    assert any(loaders.PICKLE_LOAD in f.loaders for f in stream.findings
               if f.verdict.value == "dangerous")
    later = ptfile.scan(outcomes["stream-p2-#3"][0])
    assert all(loaders.PICKLE_LOAD not in f.loaders for f in later.findings
               if f.verdict.value == "dangerous")


def test_a_payload_torch_never_reads_in_sys_info_is_at_most_unknown(
        outcomes: dict[str, tuple[bytes, set[str]]]) -> None:
    result = ptfile.scan(outcomes["sys_info"][0])
    assert not result.is_dangerous and not result.is_clean


@pytest.mark.parametrize("golden", ["tiny_tar.pt", "tiny_legacy.pt"])
def test_golden_legacy_files_scan_clean(golden: str) -> None:
    result = ptfile.scan(Path(__file__).parents[1] / "golden" / golden)
    assert result.is_clean, [f.to_dict() for f in result.findings if f.verdict.value != "allowed"]
    assert all(f.loaders for f in result.findings)


@pytest.mark.parametrize("proto", [2, 4])
def test_torch_written_legacy_files_scan_clean(tmp_path: Path, proto: int) -> None:
    import torch

    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.arange(6.0).reshape(2, 3), "n": 3}, path, pickle_protocol=proto,
               _use_new_zipfile_serialization=False)
    assert ptfile.scan(path).is_clean


def test_benign_tar_checkpoints_scan_clean() -> None:
    for data in (tar_checkpoint(), tar_checkpoint(v7=True),
                 tar_checkpoint(fmt=tarfile.GNU_FORMAT)):
        result = ptfile.scan(data)
        assert result.is_clean, [f.to_dict() for f in result.findings]


def test_a_zip_inside_a_legacy_storage_is_not_a_polyglot(tmp_path: Path) -> None:
    """No loader reads a storage's bytes as a ZIP: torch checks ``PK\\x03\\x04`` at byte 0,
    miniz takes the end record's offsets, which point into the stream, not the saved ZIP."""
    import zipfile

    import numpy as np
    import torch

    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("a.txt", "hello")
    path = tmp_path / "legacy.pt"
    blob = torch.from_numpy(np.frombuffer(inner.getvalue(), dtype=np.uint8).copy())
    torch.save({"blob": blob}, path, _use_new_zipfile_serialization=False)
    result = ptfile.scan(path)
    assert not any(f.name == "polyglot" for f in result.findings)
    assert result.is_clean


def test_load_refuses_a_file_that_is_a_tar_and_a_legacy_stream(tmp_path: Path) -> None:
    data = _polyglot(Payload(tmp_path / "never"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # torch's reader sees the tar
        assert tar.getnames()[-1] == "storages"
    with pytest.raises(FormatError, match="two readings"):
        ptfile.load(data)
    assert not (tmp_path / "never").exists()
