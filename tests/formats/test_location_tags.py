"""Location tags on re-save: memoised where the checkpoint memoised them, as torch's tags are.

torch writes each storage's persistent id with ``location_tag(storage)``.  Its
``cpu`` tag is one constant object, so the pickler memoises it (``BINPUT`` once,
``BINGET`` after); an indexed tag such as ``cuda:0`` is built afresh for every
persistent id, so it is written out in full each time.  A checkpoint whose tag
function returned one object for ``cuda:0`` (issue 11: a file in the wild) memoises it.
``ptfile.save(ptfile.load(f))`` must give back the file's bytes in both cases;
a tag the load remapped, or that the caller set, follows torch's rule.

The CPU-only torch here has no CUDA storages, so the files are written by
``torch.save`` with its ``location_tag`` replaced: by torch's own builder of
indexed tags (fresh objects) or by a function returning one constant object.
"""

from __future__ import annotations

import io
import pickletools
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import ptfile

torch = pytest.importorskip("torch")

Tagger = Callable[[Any], str]


def _torch_tag(index: int) -> Tagger:
    """torch's own tag for a storage on ``cuda:<index>`` (a new str at each call)."""
    device = types.SimpleNamespace(device=torch.device("cuda", index))
    return lambda storage: torch.serialization._backend_tag("cuda", device)


_CONSTANT_TAGS = {index: "".join(["cuda:", str(index)]) for index in range(2)}


def _constant_tag(index: int) -> Tagger:
    """A tag function returning one str object for every storage on ``cuda:<index>``."""
    tag = _CONSTANT_TAGS[index]
    return lambda storage: tag


def _by_size(small: Tagger, large: Tagger) -> Tagger:
    """``small`` for storages of at most 8 bytes, else ``large`` (two devices in one file)."""
    return lambda storage: small(storage) if storage.nbytes() <= 8 else large(storage)


def _torch_bytes(obj: object, tag: Tagger) -> bytes:
    buffer = io.BytesIO()
    with mock.patch.object(torch.serialization, "location_tag", tag):
        torch.save(obj, buffer)
    return buffer.getvalue()


def _resave(loaded: object) -> bytes:
    buffer = io.BytesIO()
    ptfile.save(loaded, buffer)
    return buffer.getvalue()


def _objects() -> dict[str, Any]:
    base = torch.arange(6.0)
    tied = torch.ones(3)
    return {
        "distinct": {"a": torch.ones(2), "b": torch.zeros(3), "c": torch.arange(4)},
        "shared storage": {"a": base, "b": base[1:3], "c": base[::2]},
        "tied tensor": {"w": tied, "lm_head": tied, "b": torch.zeros(5)},
        "mixed": {"a": base, "b": torch.ones(1), "c": base[2:], "d": torch.zeros(2)},
    }


TAGGERS: dict[str, Tagger] = {
    "memoised": _constant_tag(0),
    "fresh": _torch_tag(0),
    "memoised cuda:1, fresh cuda:0": _by_size(_constant_tag(1), _torch_tag(0)),
    "fresh cuda:1, memoised cuda:0": _by_size(_torch_tag(1), _constant_tag(0)),
}
LOADS: dict[str, Callable[[Path], Any]] = {
    "fast": ptfile.load,
    "reference": lambda path: ptfile.load(path, map_location={"cpu": "cpu"}),
    "mmap": lambda path: ptfile.load(path, mmap=True),
}


def _gets_of(raw: bytes, text: str) -> int:
    """How often the pickle fetches ``text`` from the memo instead of writing it."""
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        stream = archive.read(name)
    memo: dict[Any, Any] = {}
    last: Any = None
    gets = 0
    for op, arg, _ in pickletools.genops(stream):
        if op.name in ("BINPUT", "LONG_BINPUT"):
            memo[arg] = last
        elif op.name in ("BINGET", "LONG_BINGET"):
            gets += memo.get(arg) == text
        last = arg
    return gets


def test_torch_tags_cpu_as_one_object_and_cuda_afresh() -> None:
    # The premise: torch's tag functions, called twice for the same storage.
    storage = torch.ones(1).untyped_storage()
    assert torch.serialization._cpu_tag(storage) is torch.serialization._cpu_tag(storage)
    fresh = _torch_tag(0)
    assert fresh(storage) == fresh(storage) == "cuda:0"
    assert fresh(storage) is not fresh(storage)
    # ...so torch's pickle fetches 'cpu' from the memo and writes 'cuda:0' each time,
    # unless the tag function hands out one object.
    obj = _objects()["distinct"]
    assert _gets_of(_torch_bytes(obj, torch.serialization.location_tag), "cpu") == 2
    assert _gets_of(_torch_bytes(obj, _torch_tag(0)), "cuda:0") == 0
    assert _gets_of(_torch_bytes(obj, _constant_tag(0)), "cuda:0") == 2


@pytest.mark.parametrize("load", LOADS.values(), ids=list(LOADS))
@pytest.mark.parametrize("tagger", TAGGERS.values(), ids=list(TAGGERS))
@pytest.mark.parametrize("name", list(_objects()))
def test_issue_11_memoised_location_strings_kept_on_resave(
        tmp_path: Path, name: str, tagger: Tagger, load: Callable[[Path], Any]) -> None:
    raw = _torch_bytes(_objects()[name], tagger)
    path = tmp_path / "ckpt.pt"
    path.write_bytes(raw)
    assert _resave(load(path)) == raw


@pytest.mark.parametrize("tagger", [_constant_tag(0), _torch_tag(0)], ids=["memoised", "fresh"])
def test_remapped_location_strings_follow_torchs_rule(tmp_path: Path, tagger: Tagger) -> None:
    obj = _objects()["mixed"]
    path = tmp_path / "ckpt.pt"
    path.write_bytes(_torch_bytes(obj, tagger))
    expected = _torch_bytes(obj, _torch_tag(1))  # what torch writes for tensors on cuda:1
    assert _resave(ptfile.load(path, map_location="cuda:1")) == expected
    assert _resave(ptfile.load(path, map_location={"cuda:0": "cuda:1"})) == expected


def test_location_strings_set_by_the_caller_follow_torchs_rule(tmp_path: Path) -> None:
    obj = _objects()["shared storage"]
    path = tmp_path / "ckpt.pt"
    path.write_bytes(_torch_bytes(obj, _constant_tag(1)))
    loaded = ptfile.load(path)
    for tensor in loaded.values():
        tensor.storage.location = "cuda:0"  # one literal object, as torch never builds it
    assert _resave(loaded) == _torch_bytes(obj, _torch_tag(0))
