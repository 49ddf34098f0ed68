"""Checkpoint formats and their detection from the leading bytes (never from the file name).

===================  ==================================================  ==============
format               leading bytes                                        reader
===================  ==================================================  ==============
``zip``              ``PK\\x03\\x04`` (torch ≥ 1.6, TorchScript, .pt2)     :mod:`.zipped`
``legacy``           pickle of the magic number ``0x1950A86A20F9469CFC6C``  (issue: formats)
``tar``              a POSIX tar header (``ustar`` at offset 257)          (issue: formats)
===================  ==================================================  ==============
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["Format", "detect"]


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

_SNIFFERS: Final = (
    (Format.ZIP, lambda head: head[:4] == b"PK\x03\x04"),
    (Format.LEGACY, lambda head: head[:2] in (b"\x80\x02", b"\x80\x01") and b"\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19" in head[:20]),
    (Format.TAR, lambda head: len(head) >= 262 and head[257:262] == b"ustar"),
)


def detect(head: bytes) -> Format:
    """The format whose signature ``head`` (the first ≥ 512 bytes) carries."""
    for fmt, sniff in _SNIFFERS:
        if sniff(head):
            return fmt
    return Format.UNKNOWN
