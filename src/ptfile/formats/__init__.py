"""Checkpoint formats and their detection from the leading bytes (never from the file name).

===================  ==================================================  ==============
format               leading bytes                                        reader
===================  ==================================================  ==============
``zip``              ``PK\\x03\\x04`` (torch ≥ 1.6, TorchScript, .pt2)     :mod:`.zipped`
``legacy``           pickle of the magic number ``0x1950A86A20F9469CFC6C``  :mod:`.legacy_pickle`
``tar``              a POSIX tar header (``ustar`` at offset 257)          :mod:`.legacy_tar`
===================  ==================================================  ==============

A ZIP is refined by its records (:func:`detect_source`): a ``constants.pkl``
makes it ``torchscript`` (:mod:`.torchscript`), an ``archive_format`` record
``pt2`` (``torch.export.save``, refused with a message naming the format).
"""

from __future__ import annotations

import enum
from typing import Final

from .._io import Source
from ..archive import ZipReader
from ..limits import DEFAULT_LIMITS, Limits

__all__ = ["Format", "detect", "detect_source"]


class Format(enum.Enum):
    """The container formats ``torch.load`` reads."""

    ZIP = "zip"
    TORCHSCRIPT = "torchscript"
    PT2 = "pt2"
    LEGACY = "legacy"
    TAR = "tar"
    UNKNOWN = "unknown"


#: The pickled magic number opening every legacy stream (protocol 2 LONG1 form).
LEGACY_MAGIC_PICKLE: Final = bytes.fromhex("80028a0a6cfc9c46f9206aa850192e")

#: The magic number as LONG1 bytes (protocols 2-5, after PROTO and any FRAME).
_MAGIC_LONG1: Final = LEGACY_MAGIC_PICKLE[2:-1]
#: The magic number as protocol 0/1 text (``LONG`` opcode).
_MAGIC_TEXT: Final = b"L119547037146038801333356L\n"

_SNIFFERS: Final = (
    (Format.ZIP, lambda head: head[:4] == b"PK\x03\x04"),
    (Format.LEGACY, lambda head: (head[:1] == b"\x80" and _MAGIC_LONG1 in head[:32])
        or head.startswith(_MAGIC_TEXT)),
    (Format.TAR, lambda head: len(head) >= 262 and head[257:262] == b"ustar"),
)


def detect(head: bytes) -> Format:
    """The format whose signature ``head`` (the first ≥ 512 bytes) carries."""
    for fmt, sniff in _SNIFFERS:
        if sniff(head):
            return fmt
    return Format.UNKNOWN


def detect_source(source: Source, limits: Limits = DEFAULT_LIMITS) -> Format:
    """The format of ``source``: :func:`detect`, with ZIPs refined by their records.

    Raises
    ------
    FormatError
        A ZIP's central directory is damaged (its records cannot be listed).
    """
    fmt = detect(source.pread(0, min(source.size, 512), "file signature"))
    if fmt is not Format.ZIP:
        return fmt
    reader = ZipReader(source, limits=limits)
    prefix = reader.prefix
    if reader.get(f"{prefix}/archive_format") is not None:
        return Format.PT2
    if reader.get(f"{prefix}/constants.pkl") is not None:
        return Format.TORCHSCRIPT
    return fmt
