"""Progress bars for long work: a ``tqdm`` bar on stderr when it is a terminal, else nothing.

``tqdm`` is optional (the ``cli`` and ``remote`` extras install it): without
it, or when stderr is piped, the bar is a no-op that costs nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator

__all__ = ["progress_bar"]


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enabled: bool = True,
                 unit: str = "B", force: bool = False) -> Iterator[Callable[[int], None]]:
    """Yield ``update(n)`` of a tqdm bar on stderr when it is a terminal, or always with
    ``force`` (and tqdm is installed), else of a no-op.

    Examples
    --------
    >>> with progress_bar(10, "demo") as update:  # stderr is not a terminal here
    ...     update(10)
    """
    bar = None
    if enabled and (force or sys.stderr.isatty()):
        with contextlib.suppress(ImportError):
            tqdm = importlib.import_module("tqdm").tqdm
            # Bytes scale (1.2 MB); counts of files or tensors stay whole (7/50, not
            # 7.00/50.0).  A total of 0 is unknown: the bar counts up.
            bar = tqdm(total=total or None, desc=desc, unit=unit, unit_scale=unit == "B",
                       unit_divisor=1024 if unit == "B" else 1000, leave=False,
                       file=sys.stderr)
    try:
        yield (bar.update if bar is not None else (lambda _n: None))
    finally:
        if bar is not None:
            bar.close()
