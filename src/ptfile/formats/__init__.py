"""Checkpoint formats: the one way in from a source to the object it holds.

Every front door (:func:`ptfile.load`, :func:`ptfile.open`,
:func:`ptfile.load_torchscript`, :func:`ptfile.detect_format`, and through
them ``inspect``, ``verify`` and ``convert``) goes the same way:

1. :func:`~.detection.detect_source` decides the format once, from the bytes
   (a ZIP's central directory is parsed then, once, and travels along);
2. the format's entry in :data:`TABLE` names its module, its reader and, where the
   format can be read lazily, its opener.  :func:`read` (``load``) hands the source,
   what was detected and one :class:`~.options.ReadOptions` to the reader
   (:data:`READERS`); :func:`open_detected` (``open``) hands them to the opener
   (:data:`OPENERS`), which returns an :class:`~.options.Opened` (the object
   without storage bytes, and where those bytes are), or, for a format without
   one, to the reader, the whole object then read at once.  A format without an
   entry is refused by :func:`refuse`, the same way by both, with a message naming
   the format.

The readers: :mod:`.zipped` (``torch.save`` ≥ 1.6), :mod:`.torchscript`
(``torch.jit.save``; :func:`ptfile.load` returns its state dict),
:mod:`.pt2` (``torch.export.save``; its weights and constants),
:mod:`.legacy_pickle` (pre-1.6 stream), :mod:`.legacy_tar` (pre-0.4) and
:mod:`.safetensors` (``{name: tensor}``, as torch.load returns for a ``.safetensors``;
its module holds the one safetensors header reader); the openers: those of
:mod:`.zipped`, :mod:`.pt2` and :mod:`.safetensors`.
Their storages come from one loader per container kind
(:mod:`.storages` for every ZIP kind).

Detection and :data:`TABLE` (names only) are imported with the package; the readers
and openers (and :class:`~.options.ReadOptions`) are imported the first time
:data:`READERS`, :data:`OPENERS`, :func:`read` or :func:`open_detected` is used
(PEP 562), so what only detects (``ptfile.scan``) imports neither numpy nor ml_dtypes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, NamedTuple, NoReturn

from .. import _lazy
from .._io.local import BytesSource, Source
from ..errors import UnknownFormatError, UnsupportedFeatureError
from .detection import Detected, Format, InputKind, detect, detect_input, detect_source

if TYPE_CHECKING:  # imported on first use (PEP 562): detecting a format needs no reader
    from .options import Opened, ReadOptions

    #: One reader per format of :data:`TABLE`, each ``(source, detected, options) -> object``.
    READERS: dict[Format, Reader]
    #: One opener per format of :data:`TABLE` that names one,
    #: each ``(source, detected, options) -> Opened``.
    OPENERS: dict[Format, Opener]

__all__ = ["OPENERS", "READERS", "REFUSALS", "TABLE", "Detected", "Format", "FormatEntry", "InputKind",
           "ReadOptions", "detect", "detect_input", "detect_source", "open_detected", "read",
           "read_detected", "refuse"]

Reader = Callable[[Source, "Detected", "ReadOptions"], Any]
Opener = Callable[[Source, "Detected", "ReadOptions"], "Opened"]


class FormatEntry(NamedTuple):
    """How one format is read: the module (of this package) and the names in it of its
    reader (``load``) and opener (``open``, None where the format has no lazy reading).
    ``stream``: the format is read front to back (no index to seek by), so without an
    opener a source that reads on demand (a URL, a file object) is read whole, once, in
    order, before its reader runs."""

    module: str
    reader: str
    opener: str | None = None
    stream: bool = False


#: The one table of formats: each readable :class:`Format` has exactly one entry, which
#: names its reader and opener; :data:`READERS` and :data:`OPENERS` import them when first
#: used, so a scan (which reads no tensors) imports no reader, numpy or ml_dtypes.  The
#: other members (``DCP``: a folder, not a file; ``UNKNOWN``) are refused.
TABLE: Final[Mapping[Format, FormatEntry]] = MappingProxyType({
    Format.ZIP: FormatEntry("zipped", "read_zip", "open_zip"),
    Format.TORCHSCRIPT: FormatEntry("torchscript", "read_script_state_dict"),
    Format.LEGACY: FormatEntry("legacy_pickle", "read_legacy", stream=True),
    Format.TAR: FormatEntry("legacy_tar", "read_tar", stream=True),
    Format.PT2: FormatEntry("pt2", "read_pt2", "open_pt2"),
    Format.SAFETENSORS: FormatEntry("safetensors.header", "read_safetensors", "open_safetensors"),
})


def _resolved(name: str) -> dict[Format, Any]:
    """:data:`READERS` (``name`` ``"reader"``) or :data:`OPENERS` (``"opener"``), made
    from :data:`TABLE` (and kept) on first use."""
    table = "READERS" if name == "reader" else "OPENERS"
    found: dict[Format, Any] | None = globals().get(table)
    if found is None:
        found = {}
        for fmt, entry in TABLE.items():
            function = getattr(entry, name)
            if function is not None:
                module = importlib.import_module(f"{__name__}.{entry.module}")
                found[fmt] = getattr(module, function)
        globals()[table] = found
    return found


def _readers() -> dict[Format, Reader]:
    """:data:`READERS`, made (and kept) on first use."""
    return _resolved("reader")


def _openers() -> dict[Format, Opener]:
    """:data:`OPENERS`, made (and kept) on first use."""
    return _resolved("opener")


def __getattr__(name: str) -> Any:
    """:data:`READERS`, :data:`OPENERS` and :class:`~.options.ReadOptions`, imported on
    first use."""
    if name == "READERS":
        return _readers()
    if name == "OPENERS":
        return _openers()
    return _lazy.load(__name__, {"ReadOptions": "options"}, name)


#: Why a recognised format without an entry in :data:`TABLE` is refused, where there is
#: more to say than that it is not supported.
REFUSALS: Final[Mapping[Format, str]] = MappingProxyType({
    Format.TORCHSCRIPT_JSON: (
        "TorchScript model.json layout (torch 1.0/1.1) is not supported: the archive's "
        "model.json describes a module in torch.jit.save's first layout, which torch 2.13 "
        "refuses too (torch.jit.load: 'Legacy model format is not supported'); load it "
        "with an older torch and save its state_dict()"),
})


def refuse(detected: Detected) -> NoReturn:
    """Raise the error for a format that has no entry in :data:`TABLE`.

    Raises
    ------
    UnknownFormatError
        No sniffer recognised the leading bytes.
    UnsupportedFeatureError
        A recognised format without an entry.
    """
    if detected.format is Format.UNKNOWN:
        start = f"starts with {detected.head[:8].hex(' ')}" if detected.head else "is empty"
        raise UnknownFormatError(
            f"not a PyTorch checkpoint: the file {start}; "
            "expected a ZIP (PK 03 04), a legacy pickle stream, a tar archive or a "
            "safetensors file")
    raise UnsupportedFeatureError(REFUSALS.get(detected.format)
                                  or f"the {detected.format.value} format is not supported yet")


def read_detected(source: Source, detected: Detected, options: ReadOptions) -> Any:
    """The object ``source`` holds, read by the reader of its ``detected`` format."""
    reader = _readers().get(detected.format)
    if reader is None:
        refuse(detected)
    return reader(source, detected, options)


def open_detected(source: Source, detected: Detected, options: ReadOptions) -> Opened:
    """``source`` opened for lazy reading by the opener of its ``detected`` format; a
    format without one is read whole by its reader (a stream from a source that reads on
    demand is read into memory first: :attr:`Opened.source` is then that copy, and the
    caller still owns and closes ``source``).

    Raises
    ------
    FormatError, UnsafeGlobalError, LimitExceededError, UnsupportedFeatureError
        As the format's reader; :func:`refuse` for a format without an entry.
    """
    entry = TABLE.get(detected.format)
    if entry is None:
        refuse(detected)
    opener = _openers().get(detected.format)
    if opener is not None:
        return opener(source, detected, options)
    from .options import Opened  # here: the face stays lazy (see the module docstring)

    if entry.stream and source.reads_on_demand:
        source = BytesSource(source.read_all(), name=source.name)
    return Opened(source, detected.format, read_detected(source, detected, options),
                  {"format": detected.format.value})


def read(source: Source, options: ReadOptions) -> Any:
    """Detect the format of ``source`` once and read the object it holds.

    Raises
    ------
    FormatError
        The source is damaged or in no known format.
    UnsafeGlobalError
        ``options.policy`` refused a global.
    LimitExceededError, UnsupportedFeatureError
    """
    return read_detected(source, detect_source(source, options.limits), options)
