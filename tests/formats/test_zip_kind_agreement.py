"""The kind of a torch ZIP is decided once (``formats.detection.kind_of_markers``): every
front door that names it agrees, the ambiguous archives included.

A ZIP holding ``archive_format`` beside ``data.pkl`` or ``constants.pkl`` is read by
``torch.export.load`` as a program and by ``torch.load`` / ``torch.jit.load`` as a pickle
or TorchScript.  ``detect_format`` (and so ``load`` and ``open``) refuses it,
``get_unsafe_globals_in_checkpoint`` refuses it with the same message, and ``scan`` reports
that message as an ``ambiguous-kind`` finding (every reading scanned).  The unambiguous
kinds are one answer for all three.
"""

from __future__ import annotations

import itertools
import pickle
import zipfile
from pathlib import Path

import pytest

import ptfile
from ptfile.formats import Format

MARKERS = ("archive_format", "constants.pkl", "data.pkl")
COMBOS = [c for r in range(1, 4) for c in itertools.combinations(MARKERS, r)]


def _archive(path: Path, markers: tuple[str, ...]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for marker in markers:
            z.writestr(f"a/{marker}",
                       b"pt2" if marker == "archive_format" else pickle.dumps({"x": 1}, 2))
        z.writestr("a/version", b"3\n")
    return path


@pytest.mark.parametrize("markers", COMBOS, ids="+".join)
def test_detect_scan_and_unsafe_globals_agree_on_the_zip_kind(
        markers: tuple[str, ...], tmp_path: Path) -> None:
    path = _archive(tmp_path / "m.pt", markers)
    result = ptfile.scan(path)
    ambiguous = [f for f in result.findings if f.name == "ambiguous-kind"]
    if "archive_format" in markers and len(markers) > 1:  # ambiguous: refused
        with pytest.raises(ptfile.FormatError) as detected:
            ptfile.detect_format(path)
        assert [f.message for f in ambiguous] == [str(detected.value)]
        with pytest.raises(ptfile.FormatError) as unsafe:
            ptfile.get_unsafe_globals_in_checkpoint(path)
        assert str(unsafe.value) == str(detected.value)
        return
    kind = ptfile.detect_format(path)
    assert not ambiguous
    assert result.format == kind.value
    if kind is Format.ZIP:
        assert ptfile.get_unsafe_globals_in_checkpoint(path) == []
    else:  # torch's function reads torch.save files only
        with pytest.raises(ptfile.FormatError, match=kind.value if kind is Format.PT2 else
                           "TorchScript"):
            ptfile.get_unsafe_globals_in_checkpoint(path)
