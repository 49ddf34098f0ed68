"""Pausing CPython's cyclic garbage collector while building many objects that are not garbage.

Loading 100,000 tensors allocates ~10^6 container objects; with the collector
running, each allocation threshold triggers a collection over an ever larger
heap (~30 % of the load time), and none of it finds garbage.  Every layer that
builds such bulk (the archive's records, the formats' loads and saves, the
reader's metadata) pauses it the same way.

Pausing alone only defers the work: the collector counts the allocations made
while paused, so the first allocation after the pause starts a collection of
the youngest generation, which now holds every object the load built (400,000
for 100,000 tensors: 40-50 ms on the benchmark VM), and the next ones scan them
again on their way to the oldest generation.  These objects outlive the call
(they are its result), so when a paused block leaves at least
:data:`PROMOTE_MIN_OBJECTS` new container objects behind, :func:`paused_gc`
moves every tracked object straight into the oldest generation, where the
collector would have put them after scanning them twice
(``gc.freeze()`` then ``gc.unfreeze()``, which moves lists, not objects, and
resets the allocation count).  They are still collected, by full collections.
The move takes the objects of other threads too (they are then collected by a
full collection, not a young one), and it is skipped while anything is frozen
(``gc.get_freeze_count()``): unfreezing would thaw objects someone froze on
purpose (a pre-fork server keeping pages shared).  It is skipped on free-threaded
builds too, whose collector has no generations to move between (freezing there
marks every object, one by one).

CPython 3.12's collector moves every immortal object it meets into the permanent
generation, at every collection (375 tuples on 3.12.1, already at startup; 3.10, 3.11
and 3.13 leave the permanent generation to ``gc.freeze``), and nothing tells them from
objects an application froze.  So on 3.12 the move is skipped as for any frozen object:
a big load is followed by one young collection of what it built, as without this
module.
"""

from __future__ import annotations

import contextlib
import gc
import sysconfig
from collections.abc import Iterator
from typing import Final

__all__ = ["PROMOTE_MIN_OBJECTS", "paused_gc"]

#: Container objects a paused block must leave behind (allocations less deallocations,
#: as the collector counts them) for them to go straight to the oldest generation.
PROMOTE_MIN_OBJECTS: Final = 20_000
_GENERATIONAL: Final = not sysconfig.get_config_var("Py_GIL_DISABLED")


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the collector inside the block; re-enable it after if it was enabled
    (then, after a big block, with its objects in the oldest generation: module docstring).

    Examples
    --------
    >>> import gc
    >>> with paused_gc():
    ...     gc.isenabled()
    False
    """
    was_enabled = gc.isenabled()
    gc.disable()
    before = gc.get_count()[0]
    try:
        yield
    finally:
        if was_enabled:
            if _GENERATIONAL and gc.get_count()[0] - before >= PROMOTE_MIN_OBJECTS \
                    and not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
