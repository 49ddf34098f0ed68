"""The collector around big loads (ptfile._gc): paused while building, then the result moved
straight to the oldest generation, without a collection, and never touching frozen objects."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ptfile
from ptfile._gc import PROMOTE_MIN_OBJECTS, paused_gc


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A torch-written state dict with enough tensors (4 container objects each) to promote."""
    path = tmp_path_factory.mktemp("gc") / "many.pt"
    n = PROMOTE_MIN_OBJECTS // 2
    torch.save({f"w{i}": torch.full((2,), float(i)) for i in range(n)}, path)
    return path


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection that starts while the test runs."""
    started: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.collect()
    gc.callbacks.append(record)
    try:
        yield started
    finally:
        gc.callbacks.remove(record)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_big_load_leaves_no_collection_behind(many: Path, collections: list[int]) -> None:
    cycle = _Cycle()
    gone = weakref.ref(cycle)
    del cycle  # garbage, for a full collection to find
    sd = ptfile.load(many)
    _ = [object() for _ in range(5_000)]  # the allocations that would start a collection
    assert collections == [] and gc.isenabled() and gc.get_freeze_count() == 0
    assert len(sd) == PROMOTE_MIN_OBJECTS // 2 and float(sd["w7"].numpy()[1]) == 7.0
    gc.collect()
    assert gone() is None  # promoted garbage is still collected


def test_frozen_objects_stay_frozen(many: Path) -> None:
    sentinel: list[object] = []
    gc.freeze()  # as a pre-fork server does: sentinel is in the permanent generation
    try:
        frozen = gc.get_freeze_count()
        sd = ptfile.load(many)
        assert not any(o is sentinel for o in gc.get_objects())  # not thawed
        assert gc.get_freeze_count() <= frozen  # and nothing of the load's frozen
        assert any(o is sd for o in gc.get_objects())
    finally:
        gc.unfreeze()


def test_small_blocks_and_nested_blocks_leave_the_collector_as_it_was() -> None:
    assert gc.isenabled()
    with paused_gc():
        with paused_gc():
            kept = [[] for _ in range(PROMOTE_MIN_OBJECTS)]
        assert not gc.isenabled()  # the inner block does not re-enable it
    assert gc.isenabled() and len(kept) == PROMOTE_MIN_OBJECTS
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
