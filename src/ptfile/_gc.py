"""Pausing CPython's cyclic garbage collector while building many objects that are not garbage.

Loading 100,000 tensors allocates ~10^6 container objects; with the collector
running, each allocation threshold triggers a collection over an ever larger
heap (~30 % of the load time), and none of it finds garbage.  Every layer that
builds such bulk (the archive's records, the formats' loads and saves, the
reader's metadata) pauses it the same way.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused_gc"]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the collector inside the block; re-enable it after if it was enabled.

    Examples
    --------
    >>> import gc
    >>> with paused_gc():
    ...     gc.isenabled()
    False
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
