"""The metadata records of a torch ZIP archive (``pt-format.md`` §3), read and validated once.

Every kind of torch ZIP (``torch.save``, ``torch.jit.save``) has, under its
prefix folder: ``version`` (or ``.data/version``; a decimal, 1..10 readable),
``byteorder`` (``little``/``big``; when missing, the configured default),
``.format_version``, ``.storage_alignment`` and ``.data/serialization_id``.
Each is a short ASCII text; anything else is damage.  Every record of the
archive MUST lie under the prefix folder (torch refuses others).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..archive import ZipReader
from ..config import Settings
from ..errors import FormatError, brief

__all__ = ["MAX_READ_VERSION", "ZipInfo", "read_info"]

MAX_READ_VERSION: Final = 10


@dataclass(frozen=True, slots=True)
class ZipInfo:
    """What the archive's metadata records say."""

    prefix: str
    version: int
    byteorder: str
    byteorder_recorded: bool
    format_version: int | None
    storage_alignment: int
    serialization_id: str | None


def _text(reader: ZipReader, name: str) -> str | None:
    record = reader.get(name)
    if record is None:
        return None
    if record.size > 64:
        raise FormatError(f"metadata record is {record.size} bytes, expected a short text",
                          member=name)
    try:
        return reader.read(record).decode("ascii")
    except UnicodeDecodeError:
        raise FormatError("metadata record is not ASCII text", member=name) from None


def _decimal(text: str | None, name: str, default: int | None) -> int | None:
    if text is None:
        return default
    stripped = text.strip()
    if not stripped.isdigit() or len(stripped) > 18:
        raise FormatError(f"expected a decimal number, got {brief(text, 40)}", member=name)
    return int(stripped)


def read_info(reader: ZipReader, settings: Settings) -> ZipInfo:
    """Read and validate the metadata records of a torch ZIP checkpoint."""
    prefix = reader.prefix
    folder = prefix + "/"
    outside = reader.first_name_outside(folder)
    if outside is not None:
        raise FormatError(f"record {outside!r} is not under the archive folder "
                          f"{prefix!r}/ (torch: file in archive is not in a subdirectory)")
    version_name = f"{prefix}/.data/version" if reader.get(f"{prefix}/.data/version") \
        else f"{prefix}/version"
    version = _decimal(_text(reader, version_name), version_name, None)
    if version is None or not 1 <= version <= MAX_READ_VERSION:
        raise FormatError(f"archive version {version} is missing or outside 1..{MAX_READ_VERSION}",
                          member=version_name)
    order = _text(reader, f"{prefix}/byteorder")
    if order is not None and order not in ("little", "big"):
        raise FormatError(f"unknown byte order {brief(order, 20)}", member=f"{prefix}/byteorder")
    alignment = _decimal(_text(reader, f"{prefix}/.storage_alignment"), "storage_alignment", 64)
    return ZipInfo(
        prefix=prefix,
        version=version,
        byteorder=order or settings.missing_byteorder(),
        byteorder_recorded=order is not None,
        format_version=_decimal(_text(reader, f"{prefix}/.format_version"), "format_version", None),
        storage_alignment=alignment or 64,
        serialization_id=_text(reader, f"{prefix}/.data/serialization_id"),
    )
