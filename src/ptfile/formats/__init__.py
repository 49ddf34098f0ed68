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

Detection is imported with the package; the readers (and :class:`~.options.ReadOptions`)
are imported the first time :data:`READERS` or :func:`read` is used (PEP 562), so what
only detects (``ptfile.scan``) imports neither numpy nor ml_dtypes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NoReturn

from .._io.local import Source
from ..errors import UnknownFormatError, UnsupportedFeatureError
from .detection import Detected, Format, InputKind, detect, detect_input, detect_source

if TYPE_CHECKING:  # imported on first use (PEP 562): detecting a format needs no reader
    from .options import ReadOptions

    #: One reader per format, each ``(source, detected, options) -> object``.
    READERS: dict[Format, Reader]

__all__ = ["READERS", "Detected", "Format", "InputKind", "ReadOptions", "detect",
           "detect_input", "detect_source", "read",
           "read_detected", "refuse"]

Reader = Callable[[Source, "Detected", "ReadOptions"], Any]

#: The module and function of each format's reader; :data:`READERS` imports them when
#: first used, so a scan (which reads no tensors) imports no reader, numpy or ml_dtypes.
_READER_NAMES: Final = {
    Format.ZIP: ("zipped", "read_zip"),
    Format.TORCHSCRIPT: ("torchscript", "read_script_state_dict"),
    Format.LEGACY: ("legacy_pickle", "read_legacy"),
    Format.TAR: ("legacy_tar", "read_tar"),
    Format.PT2: ("pt2", "read_pt2"),
    Format.SAFETENSORS: ("safetensors", "read_safetensors"),
}


def _readers() -> dict[Format, Reader]:
    """:data:`READERS`, made (and kept) on first use."""
    found: dict[Format, Reader] | None = globals().get("READERS")
    if found is None:
        found = {fmt: getattr(importlib.import_module(f"{__name__}.{module}"), name)
                 for fmt, (module, name) in _READER_NAMES.items()}
        globals()["READERS"] = found
    return found


def __getattr__(name: str) -> Any:
    """:data:`READERS` and :class:`~.options.ReadOptions`, imported on first use."""
    if name == "READERS":
        return _readers()
    if name == "ReadOptions":
        value = importlib.import_module(f"{__name__}.options").ReadOptions
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    reader = _readers().get(detected.format)
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
