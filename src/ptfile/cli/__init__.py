"""The ``ptfile`` command (``python -m ptfile``): :mod:`.commands` parses and runs one
command; :mod:`.bulk` runs one over many files (a local pool or Dask)."""

from __future__ import annotations

from .commands import main

__all__ = ["main"]
