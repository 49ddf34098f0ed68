"""The ZIP container layer: a validating reader and a torch-identical writer.

This layer knows nothing about torch objects; it moves named byte records in
and out of ZIP archives laid out exactly as ``torch.save`` lays them out.  The
format subset is specified in :mod:`ptfile.archive.records`.
"""

from __future__ import annotations

from .anomalies import Anomaly
from .layout import computed_data_offset, computed_data_offsets, computed_next_header_offset
from .reader import Record, ZipReader
from .serialization_id import SERIALIZATION_ID_NAME
from .writer import MAX_ALIGNMENT, ZipWriter

__all__ = [
    "MAX_ALIGNMENT",
    "SERIALIZATION_ID_NAME",
    "Anomaly",
    "Record",
    "ZipReader",
    "ZipWriter",
    "computed_data_offset",
    "computed_data_offsets",
    "computed_next_header_offset",
]
