"""Finding a ZeRO run's tag folder (ptfile.zero.files.tag_folder) without DeepSpeed: the
names only, from a local folder and from a folder URL, listed once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ptfile.errors import FormatError, UnsupportedFeatureError
from ptfile.limits import DEFAULT_LIMITS
from ptfile.zero.files import rank_files, tag_folder

#: A ZeRO-2 run of two data-parallel ranks, as ``engine.save_checkpoint`` names its files.
RANK_FILES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
              "zero_pp_rank_1_mp_rank_00_optim_states.pt")


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A run folder behind ``memory://zero-run`` (``latest`` naming ``global_step2``);
    yields the listing and folder questions asked of the backend."""
    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    fs = fsspec.filesystem("memory")
    fs.pipe("/zero-run/latest", b"global_step2\n")
    for name in RANK_FILES:
        fs.pipe(f"/zero-run/global_step2/{name}", b"x")
    calls: list[tuple[str, str]] = []
    for method in ("ls", "isdir"):
        real = getattr(MemoryFileSystem, method)

        def counted(self: Any, path: str, *args: Any, _real: Any = real, _name: str = method,
                    **kw: Any) -> Any:
            calls.append((_name, path))
            return _real(self, path, *args, **kw)

        monkeypatch.setattr(MemoryFileSystem, method, counted)
    yield calls
    fs.rm("/zero-run", recursive=True)


def test_a_tag_folder_url_is_listed_once(listed: list[tuple[str, str]], tmp_path: Path) -> None:
    folder, tag, names = tag_folder("memory://zero-run", ["latest"], None, None, DEFAULT_LIMITS)
    assert (folder, tag) == ("memory://zero-run/global_step2", "global_step2")
    assert listed == [("ls", "/zero-run/global_step2")]
    # the same names as the same run on disk gives
    (tmp_path / "global_step2").mkdir()
    (tmp_path / "latest").write_text("global_step2\n")
    for name in RANK_FILES:
        (tmp_path / "global_step2" / name).write_bytes(b"x")
    local = tag_folder(str(tmp_path), ["latest"], None, None, DEFAULT_LIMITS)
    assert local == (str(tmp_path / "global_step2"), "global_step2", names)
    assert rank_files(folder, names, None) == (list(RANK_FILES[:1]), list(RANK_FILES[1:]))


def test_a_missing_tag_folder_url(listed: list[tuple[str, str]]) -> None:
    with pytest.raises(FormatError, match="the tag folder 'global_step9' is missing"):
        tag_folder("memory://zero-run", ["latest"], "global_step9", None, DEFAULT_LIMITS)
    with pytest.raises(FormatError, match="the tag folder 'latest' is missing"):
        tag_folder("memory://zero-run", ["latest"], "latest", None, DEFAULT_LIMITS)  # a file
    assert [name for name, _ in listed] == ["ls", "ls"]


def test_an_offloaded_tag_folder_url_is_refused(listed: list[tuple[str, str]]) -> None:
    """NVMe offload keeps the optimizer state in ``offloaded_tensors/``: no optim files."""
    import fsspec

    fsspec.filesystem("memory").pipe("/zero-run/global_step2/offloaded_tensors/0.tensor.swp",
                                     b"x")
    with pytest.raises(UnsupportedFeatureError, match="NVMe-offloaded"):
        rank_files("memory://zero-run/global_step2", list(RANK_FILES[:1]), None)
