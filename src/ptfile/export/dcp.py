"""The documented path of DCP consolidation: :mod:`ptfile.dcp.consolidate` defines it."""

from __future__ import annotations

from ..dcp.consolidate import SHARD_BYTES, SLAB_BYTES, convert_dcp

__all__ = ["SHARD_BYTES", "SLAB_BYTES", "convert_dcp"]
