"""DCP folders as torch reads them (issue 30): paths that leave the folder, duplicate
storage entries, damage.

Every folder is written by real ``torch.distributed.checkpoint.save`` (one process, no
process group) and then edited as an attacker would: a bytes item's pickle (a
``torch.save`` whose object makes its sentinel folder, ``os.mkdir``) moved outside the
folder, or two ``storage_data`` entries of one item.  torch's DCP loader
(``_load_state_dict_from_keys``) runs each in the sandboxed oracle child
(:mod:`loader_oracle`), which says whether the payload ran; the scan must exit non-zero
exactly when it did, and a folder no loader can read is an error (exit 2), never
``unknown``, with or without ``--allow-unknown``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.state_dict_loader

import ptfile
from loader_oracle import DCP_LOADER, Job, Outcome, run_loaders, sandbox
from ptfile import cli, outcomes


class _Mkdir:
    """Unpickled, it makes the folder ``path`` (the sentinel)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (os.mkdir, (self.path,))


def _save(folder: Path, state: dict[str, object]) -> None:
    dcp.save(state, checkpoint_id=str(folder))


def _metadata(folder: Path) -> object:
    with open(folder / ".metadata", "rb") as f:
        return pickle.load(f)


def _entry(meta: object, fqn: str) -> tuple[object, object]:
    storage = meta.storage_data  # type: ignore[attr-defined]
    return next((k, v) for k, v in storage.items() if k.fqn == fqn)


def outside(folder: Path, sentinel: str) -> None:
    """The pickle of the bytes item ``epoch`` moved to ``../outside.bin``."""
    _save(folder, {"w": torch.ones(3), "epoch": _Mkdir(sentinel)})
    meta = _metadata(folder)
    key, info = _entry(meta, "epoch")
    data = (folder / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
    (folder.parent / f"{folder.name}-outside.bin").write_bytes(data)
    meta.storage_data[key] = type(info)(  # type: ignore[attr-defined]
        relative_path=f"../{folder.name}-outside.bin", offset=0, length=len(data))
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    # the payload is gone from the folder's own files
    blob = (folder / info.relative_path).read_bytes()
    (folder / info.relative_path).write_bytes(blob[:info.offset] + bytes(info.length)
                                              + blob[info.offset + info.length:])


def _twice(folder: Path, state: dict[str, object]) -> None:
    """``state`` saved, its item ``epocX`` renamed ``epoch``: two storage entries of one
    item, in the order ``state`` lists them (torch keeps the last)."""
    _save(folder, state)
    raw = (folder / ".metadata").read_bytes()
    assert raw.count(b"epocX") == 1  # memoised: every use of the name is one string
    (folder / ".metadata").write_bytes(raw.replace(b"epocX", b"epoch"))


def twice_payload_last(folder: Path, sentinel: str) -> None:
    _twice(folder, {"w": torch.ones(3), "epoch": 3, "epocX": _Mkdir(sentinel)})


def twice_payload_first(folder: Path, sentinel: str) -> None:
    _twice(folder, {"w": torch.ones(3), "epocX": _Mkdir(sentinel), "epoch": 3})


def benign(folder: Path, sentinel: str) -> None:
    _save(folder, {"w": torch.ones(3), "epoch": 3, "cfg": {"lr": [0.1, 0.2]},
                   "name": "run-7"})


def _cut(folder: Path) -> None:
    data_file = next(folder.glob("*.distcp"))
    data_file.write_bytes(data_file.read_bytes()[:40])


def truncated(folder: Path, sentinel: str) -> None:
    benign(folder, sentinel)
    _cut(folder)


def data_file_missing(folder: Path, sentinel: str) -> None:
    benign(folder, sentinel)
    next(folder.glob("*.distcp")).unlink()


def metadata_cut(folder: Path, sentinel: str) -> None:
    benign(folder, sentinel)
    (folder / ".metadata").write_bytes((folder / ".metadata").read_bytes()[:100])


#: Each case: how it is made, whether torch's DCP loader runs its payload, its scan exit.
CASES: dict[str, tuple[Callable[[Path, str], None], bool, int]] = {
    "outside": (outside, True, outcomes.EXIT_UNSAFE),
    "twice-payload-last": (twice_payload_last, True, outcomes.EXIT_UNSAFE),
    "twice-payload-first": (twice_payload_first, False, outcomes.EXIT_OK),
    "benign": (benign, False, outcomes.EXIT_OK),
    "truncated": (truncated, False, outcomes.EXIT_ERROR),
    "data-file-missing": (data_file_missing, False, outcomes.EXIT_ERROR),
    "metadata-cut": (metadata_cut, False, outcomes.EXIT_ERROR),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Outcome]]:
    root = tmp_path_factory.mktemp("dcp-reading")
    files, sentinels = sandbox(root)
    jobs = []
    for name, (make, _, _) in CASES.items():
        folder = files / name
        make(folder, str(sentinels / name))
        jobs.append(Job(name, folder, sentinels / name, (DCP_LOADER,)))
    done = run_loaders(root, jobs)
    return {job.id: (job.path, outcome) for job, outcome in zip(jobs, done, strict=True)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_scan_judges_the_folder_as_torch_reads_it(
        name: str, folders: dict[str, tuple[Path, Outcome]]) -> None:
    _, fires, code = CASES[name]
    folder, outcome = folders[name]
    assert bool(outcome.fired) is fires, outcome  # the oracle: torch's DCP loader
    if code == outcomes.EXIT_ERROR:
        assert outcome.errors[DCP_LOADER] is not None  # torch cannot read it either
    assert cli.main(["scan", str(folder)]) == code
    assert cli.main(["scan", "--allow-unknown", str(folder)]) == code


def test_an_item_outside_the_folder_is_reported_and_scanned(
        folders: dict[str, tuple[Path, Outcome]]) -> None:
    folder, _ = folders["outside"]
    found = {(f.kind, f.name or f.module) for f in ptfile.scan(folder).findings
             if f.verdict.value == "dangerous"}
    assert ("archive", "outside-folder") in found
    assert any(kind == "global" for kind, _ in found), found  # os.mkdir, read from outside


def test_an_outside_item_with_a_benign_pickle_is_still_reported(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    benign(folder, "")
    meta = _metadata(folder)
    key, info = _entry(meta, "epoch")
    shutil.copy(folder / info.relative_path, tmp_path / "elsewhere.distcp")
    meta.storage_data[key] = type(info)(  # type: ignore[attr-defined]
        relative_path="../elsewhere.distcp", offset=info.offset, length=info.length)
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: torch says it loads in one
        loaded = dcp.state_dict_loader._load_state_dict_from_keys(checkpoint_id=str(folder))
    assert loaded["epoch"] == 3  # torch follows the path
    result = ptfile.scan(folder)
    assert [f.name for f in result.findings if f.verdict.value != "allowed"] == \
        ["outside-folder"]
