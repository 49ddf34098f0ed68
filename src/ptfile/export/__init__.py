"""Conversions out of (and into) ptfile: safetensors (ptfile's own writer) and npz.

======================  =========================================================
:mod:`.safetensors`     ``.pt`` ⇄ ``.safetensors``, one file or a Hugging Face
                        sharded checkpoint (``*.index.json``), one shard at a time
:mod:`.npz`             ``.pt`` → ``.npz`` (numpy's own format, member by member)
======================  =========================================================
"""

from __future__ import annotations

from .npz import dump_npz
from .safetensors import SharedPolicy, convert_sharded, dump, load_safetensors

__all__ = ["SharedPolicy", "convert_sharded", "dump", "dump_npz", "load_safetensors"]
