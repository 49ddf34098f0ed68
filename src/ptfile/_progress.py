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
            bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False,
                       file=sys.stderr)
    try:
        yield (bar.update if bar is not None else (lambda _n: None))
    finally:
        if bar is not None:
            bar.close()
