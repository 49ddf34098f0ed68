"""The scanner decides a file's format as the loader does (``ptfile.formats.detect``).

Each test failed before the scanner called the loader's detection: it had its
own sniffing, which missed protocol 0/1 legacy streams and read a legacy
stream with a tar header at offset 257 as a tar only.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch

import ptfile

SYSTEM_0 = b"cposix\nsystem\n(S'id'\ntR."  # a protocol 0 pickle calling posix.system('id')


def _legacy_text(object_pickle: bytes, sys_info: object = None) -> bytes:
    """A legacy stream in protocol 0, as torch.save(pickle_protocol=0) writes it."""
    info = sys_info if sys_info is not None else {"protocol_version": 1001, "little_endian": True}
    return (pickle.dumps(0x1950A86A20F9469CFC6C, 0) + pickle.dumps(1001, 0)
            + pickle.dumps(info, 0) + object_pickle + pickle.dumps([], 0))


def test_issue_11_protocol_0_legacy_streams_are_scanned(tmp_path: Path) -> None:
    path = tmp_path / "p0.pt"
    torch.save({"w": torch.arange(3)}, path, pickle_protocol=0,
               _use_new_zipfile_serialization=False)
    assert ptfile.detect_format(path) is ptfile.Format.LEGACY  # the loader reads it as legacy
    clean = ptfile.scan(path)
    assert clean.format == "legacy"
    assert clean.is_clean, clean.findings
    assert _legacy_text(b"")[:27] == path.read_bytes()[:27]  # the same magic as torch writes
    result = ptfile.scan(_legacy_text(SYSTEM_0))
    assert result.format == "legacy"
    assert result.is_dangerous
    assert "posix.system" in result.unsafe_globals


def test_issue_11_legacy_stream_with_a_tar_magic_is_scanned_as_both() -> None:
    # The loader reads a legacy stream (its magic comes first); "ustar" at 257,
    # inside sys_info, made the scanner read the file as a tar only.
    at = _legacy_text(SYSTEM_0, {"protocol_version": 1001, "pad": "@"}).index(b"@")
    info = {"protocol_version": 1001, "pad": "x" * (257 - at) + "ustar"}
    data = _legacy_text(SYSTEM_0, info)
    assert data[257:262] == b"ustar"
    assert ptfile.detect_format(io.BytesIO(data)) is ptfile.Format.LEGACY
    result = ptfile.scan(data)
    assert result.format == "legacy"
    assert "posix.system" in result.unsafe_globals
    assert result.is_dangerous
