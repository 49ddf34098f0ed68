"""The collector around big loads (ptfile._gc): paused while building, then the result moved
straight to the oldest generation, without a collection, and never touching frozen objects."""

from __future__ import annotations

import gc
import sys
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
def collections(many: Path) -> Iterator[list[int]]:
    """The generation of every collection that starts while the test runs, once a first
    load of ``many`` has imported what a load imports (the modules a front door imports
    on first use allocate thousands of objects outside any paused block; run alone, the
    test would see their collections) and with nothing frozen: CPython 3.12's collector
    parks the immortal objects it meets in the permanent generation at every collection,
    which :func:`paused_gc` cannot tell from frozen ones and will not thaw
    (``ptfile._gc``); here they are thawed after the last collection."""
    started: list[int] = []
    ptfile.load(many)

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.collect()
    gc.unfreeze()  # 3.12: the immortal objects that collection parked (none elsewhere)
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


def test_python_3_12_parks_immortal_objects_where_frozen_ones_go() -> None:
    """Why the fixture thaws: on 3.12 every collection moves the immortal objects it meets
    to the permanent generation (3.10, 3.11 and 3.13 leave it empty), so there
    ``gc.get_freeze_count()`` is never 0 after a collection and the move is skipped."""
    gc.unfreeze()
    gc.collect()
    parked = gc.get_freeze_count()
    gc.unfreeze()
    assert (parked > 0) == (sys.version_info[:2] == (3, 12))


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


def test_a_big_load_does_not_thaw_what_is_frozen(many: Path, collections: list[int]) -> None:
    """With anything frozen the move is skipped: the load's objects stay young, and the
    allocations after it start the collection the move would have saved."""
    sentinel: list[object] = []
    gc.freeze()
    try:
        sd = ptfile.load(many)
        assert gc.get_freeze_count() > 0 and not any(o is sentinel for o in gc.get_objects())
        _ = [[] for _ in range(1_000)]  # tracked allocations: past the youngest threshold
        assert 0 in collections and len(sd) == PROMOTE_MIN_OBJECTS // 2
    finally:
        gc.unfreeze()
