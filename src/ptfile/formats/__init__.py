"""Checkpoint formats: the one way in from a source to the object it holds.

Every front door (:func:`ptfile.load`, :func:`ptfile.open`,
:func:`ptfile.load_torchscript`, :func:`ptfile.detect_format`, and through
them ``inspect``, ``verify`` and ``convert``) goes the same way:

1. :func:`~.detection.detect_source` decides the format once, from the bytes
   (a ZIP's central directory is parsed then, once, and travels along);
2. :func:`read` hands the source, what was detected and one
   :class:`~.options.ReadOptions` to the reader of that format, from the
   table :data:`READERS`; formats without a reader are refused by
   :func:`refuse`, with a message naming the format.

The readers: :mod:`.zipped` (``torch.save`` ≥ 1.6), :mod:`.torchscript`
(``torch.jit.save``; :func:`ptfile.load` returns its state dict),
:mod:`.pt2` (``torch.export.save``; its weights and constants),
:mod:`.legacy_pickle` (pre-1.6 stream), :mod:`.legacy_tar` (pre-0.4) and
:mod:`.safetensors` (``{name: tensor}``, as torch.load returns for a ``.safetensors``;
its module holds the one safetensors header reader).
Their storages come from one loader per container kind
(:mod:`.storages` for every ZIP kind).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NoReturn

from .._io.local import Source
from ..errors import UnknownFormatError, UnsupportedFeatureError
from .detection import Detected, Format, InputKind, detect, detect_input, detect_source
from .legacy_pickle import read_legacy
from .legacy_tar import read_tar
from .options import ReadOptions
from .pt2 import read_pt2
from .safetensors import read_safetensors
from .torchscript import read_script_state_dict
from .zipped import read_zip

__all__ = ["READERS", "Detected", "Format", "InputKind", "ReadOptions", "detect",
           "detect_input", "detect_source", "read",
           "read_detected", "refuse"]

Reader = Callable[[Source, Detected, ReadOptions], Any]

#: One reader per format, each ``(source, detected, options) -> object``.
READERS: Final[dict[Format, Reader]] = {
    Format.ZIP: read_zip,
    Format.TORCHSCRIPT: read_script_state_dict,
    Format.LEGACY: read_legacy,
    Format.TAR: read_tar,
    Format.PT2: read_pt2,
    Format.SAFETENSORS: read_safetensors,
}


def refuse(detected: Detected) -> NoReturn:
    """Raise the error for a format that has no reader.

    Raises
    ------
    UnknownFormatError
        No sniffer recognised the leading bytes.
    UnsupportedFeatureError
        A recognised format without a reader.
    """
    if detected.format is Format.UNKNOWN:
        start = f"starts with {detected.head[:8].hex(' ')}" if detected.head else "is empty"
        raise UnknownFormatError(
            f"not a PyTorch checkpoint: the file {start}; "
            "expected a ZIP (PK 03 04), a legacy pickle stream, a tar archive or a "
            "safetensors file")
    raise UnsupportedFeatureError(f"the {detected.format.value} format is not supported yet")


def read_detected(source: Source, detected: Detected, options: ReadOptions) -> Any:
    """The object ``source`` holds, read by the reader of its ``detected`` format."""
    reader = READERS.get(detected.format)
    if reader is None:
        refuse(detected)
    return reader(source, detected, options)


def read(source: Source, options: ReadOptions) -> Any:
    """Detect the format of ``source`` once and read the object it holds.

    Raises
    ------
    FormatError
        The source is damaged or in no known format.
    UnsafeGlobalError
        ``options.find_class`` refused a global.
    LimitExceededError, UnsupportedFeatureError
    """
    return read_detected(source, detect_source(source, options.limits), options)
