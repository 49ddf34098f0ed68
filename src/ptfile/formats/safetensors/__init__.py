"""The safetensors format, whole: its one header reader (:mod:`.header`: the format's
spec, torch's reading, the checks), its one writer and index writer (:mod:`.writer`), and
ptfile's own metadata in it (:mod:`.meta`: tied names, values, nesting).

This face gives the reader's names; the writer and the metadata rules are imported from
their modules (the writer imports numpy, which reading a header does not need).
"""

from __future__ import annotations

from .header import (
    CODES,
    PACKED,
    SHARDING_INFO,
    Entry,
    Header,
    check_header,
    header_json,
    open_safetensors,
    read_header,
    read_safetensors,
    saved_offsets,
    to_tensors,
)

__all__ = ["CODES", "PACKED", "SHARDING_INFO", "Entry", "Header", "check_header", "header_json",
           "open_safetensors", "read_header", "read_safetensors", "saved_offsets", "to_tensors"]
