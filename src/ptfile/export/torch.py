"""The torch bridge's documented path: :mod:`ptfile.model.torch` defines it."""

from __future__ import annotations

from ..model.torch import from_torch, to_torch

__all__ = ["from_torch", "to_torch"]
