"""The ZIP container layer: a validating reader and a torch-identical writer.

This layer knows nothing about torch objects; it moves named byte records in
and out of ZIP archives laid out exactly as ``torch.save`` lays them out.  The
format subset is specified in :mod:`ptfile.archive.records`.  Every reader of a
ZIP, strict (:class:`ZipReader`) or tolerant (the scanner's), finds its members
by one walk, :mod:`ptfile.archive.walk` (:func:`walk_zip`), and inflates them
with :mod:`ptfile.archive.inflate`.

The face is lazy (PEP 562, :mod:`ptfile._lazy`, as :mod:`ptfile`'s): each name below is imported
from its module the first time it is used, so reading a small archive
(``ptfile scan``) imports neither the writer nor numpy.  numpy is imported
by the functions that build arrays: the vectorised central directory pass,
the bulk local header check, the writer's runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from .. import _lazy

if TYPE_CHECKING:  # what the lazy names are, for type checkers
    from .anomalies import Anomaly
    from .layout import computed_data_offset, computed_data_offsets, computed_next_header_offset
    from .reader import Record, ZipReader
    from .serialization_id import SERIALIZATION_ID_NAME
    from .walk import ZipEntry, walk_zip
    from .writer import MAX_ALIGNMENT, ZipWriter

#: Each public name and the module that holds it.
_EXPORTS: Final[dict[str, str]] = {
    "Anomaly": "anomalies",
    "computed_data_offset": "layout", "computed_data_offsets": "layout",
    "computed_next_header_offset": "layout",
    "Record": "reader", "ZipReader": "reader",
    "SERIALIZATION_ID_NAME": "serialization_id",
    "ZipEntry": "walk", "walk_zip": "walk",
    "MAX_ALIGNMENT": "writer", "ZipWriter": "writer",
}

__all__ = [
    "MAX_ALIGNMENT",
    "SERIALIZATION_ID_NAME",
    "Anomaly",
    "Record",
    "ZipEntry",
    "ZipReader",
    "ZipWriter",
    "computed_data_offset",
    "computed_data_offsets",
    "computed_next_header_offset",
    "walk_zip",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (a submodule,
    ``from ptfile.archive import tar``, is found by import)."""
    return _lazy.load(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
