"""The safetensors format: its one header reader, and its tensors as views of the file.

How torch 2.13 reads it
-----------------------
``torch.load(f)`` with ``f`` a ``str`` or ``os.PathLike`` whose name ends in
``.safetensors`` returns ``safetensors.torch.load_file(f, device)``: a plain
``dict[str, Tensor]`` in data order, the file's ``__metadata__`` dropped.  A
``map_location`` string or ``torch.device`` is the device; a dict or a callable is
refused (RuntimeError); ``mmap`` and ``weights_only`` are ignored (only the check
that ``pickle_module`` goes without ``weights_only`` runs first).  A file object, or a
path with another suffix, goes to the pickle loaders, which fail on it.

ptfile decides by content instead (:mod:`.detection`: the 8-byte length, then ``{``
after any JSON whitespace), so it reads more than torch (any file name, file
objects, bytes, URLs), never less, and returns what torch returns: ``{name: Tensor}``
in data order.  A file ptfile wrote (its own ``ptfile.*`` metadata) gives back the
object written: tied names, values and nesting (:mod:`.meta`).  ``map_location`` is applied to the recorded ``cpu`` tag as for every
format (a dict or a callable too); ``mmap`` maps the file as for every format.

The format
----------
::

    u64 little-endian N | N bytes of UTF-8 JSON: the header | data

The header is one JSON object: an optional ``"__metadata__": {str: str}`` (or
null), and per tensor ``name: {"dtype": CODE, "shape": [int, ...],
"data_offsets": [begin, end]}`` with the offsets counted from the first data byte
(``8 + N``) and the data little-endian, C-contiguous.  Writers pad the header with
spaces to a multiple of 8 bytes.  ``CODE`` is one of :data:`CODES` (one element
per itemsize), ``F4`` (:data:`PACKED`: 4-bit elements, two to a byte: torch's
``float4_e2m1fn_x2`` holds a pair, so its shape is the header's with the last
dimension halved), or ``F6_E2M3``/``F6_E3M2`` (no torch dtype: refused, as torch
refuses them).

What is checked, as the safetensors library checks it for torch.load (damage is a
:class:`~ptfile.FormatError`, a ceiling a :class:`~ptfile.LimitExceededError`):

* ``N`` is at most :attr:`Limits.max_safetensors_header_bytes` (safetensors' own
  100 MB by default), and ``8 + N`` is within the input;
* the header is UTF-8 JSON (whitespace around it allowed), an object; the
  metadata is an object of strings;
* each entry is an object with a known dtype, a shape of non-negative ints below
  2**63 and two integer offsets ``begin <= end``; ``end - begin`` is exactly the
  shape's bytes (for ``F4`` the last dimension is even); its rank is within
  :attr:`Limits.max_ndim` and numpy's 64;
* taken in offset order, the entries tile the data exactly: each starts where the
  one before ended, from 0 to the end of the input (no gap, overlap, shared bytes,
  or trailing bytes).

Extra keys in an entry are ignored, as safetensors ignores them.

Why not the ``safetensors`` package: it is an optional extra (ptfile's runtime needs
only numpy and ml_dtypes), ``safe_open`` opens only local paths (ptfile reads file
objects, bytes and URLs by range), and ptfile's readers need the header itself
(each tensor's offset in the file, for :class:`~ptfile.CheckpointReader` and
``inspect``) more than arrays.  The header is a few checks of a small JSON object;
the data are numpy views of the source (of the map, when mapped).

:func:`header_json` is the bounded read of the length and JSON object, for every
safetensors blob ptfile meets (distributed checkpoints' too); :func:`read_header`
adds the entries' checks (:func:`check_header`) for a whole file;
:func:`read_safetensors` is the format's reader in :data:`ptfile.formats.READERS`,
:func:`open_safetensors` its opener in :data:`ptfile.formats.OPENERS`; the one writer
(and index writer) is :mod:`.writer`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..._io.local import Source
from ...errors import FormatError, LimitExceededError, UnsupportedFeatureError, brief
from ...limits import DEFAULT_LIMITS, Limits, applied
from ...model.dtypes import SAFETENSORS_CODES, DType, by_name
from ...model.location import restore_location
from ...model.tensor import Storage, Tensor, check_rank, contiguous_stride
from ..detection import Format
from .meta import restore

if TYPE_CHECKING:
    from ..detection import Detected
    from ..options import Opened, ReadOptions

__all__ = ["CODES", "PACKED", "SHARDING_INFO", "Entry", "Header", "check_header", "header_json",
           "open_safetensors", "read_header", "read_safetensors", "saved_offsets", "to_tensors"]

#: safetensors dtype code → torch dtype name, for codes of one element per itemsize (kept
#: with the dtypes, :data:`ptfile.model.dtypes.SAFETENSORS_CODES`).
CODES: Final = SAFETENSORS_CODES
#: The ``__metadata__`` entry torch's HuggingFaceStorageWriter writes in each file it
#: saves a piece of a tensor to: JSON ``{name: {"saved_offsets": [...]}}``, where each
#: tensor's piece sits in the whole tensor (:func:`saved_offsets`).
SHARDING_INFO: Final = "DCP_SHARDING_INFO"
#: Codes of 4-bit elements packed two to a byte → the torch dtype of one pair.
PACKED: Final[dict[str, str]] = {"F4": "float4_e2m1fn_x2"}
#: Codes safetensors defines that no torch dtype holds (torch.load refuses them too).
_NO_TORCH_DTYPE: Final = frozenset({"F6_E2M3", "F6_E3M2"})
#: The header length's own bytes.
LENGTH_BYTES: Final = 8
#: One past the largest size of a dimension (torch sizes are int64).
_DIM_END: Final = 1 << 63

Read = Callable[[int, int], "bytes | memoryview"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of a header: torch's dtype and shape, and its bytes ``[begin, end)``
    counted from the first data byte."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """The tensor's bytes in the file."""
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class Header:
    """A checked header: the entries in data order (torch.load's), the ``__metadata__``
    (None when the file has none), where the data start and how many bytes they are."""

    entries: dict[str, Entry]
    metadata: dict[str, str] | None
    data_start: int
    data_size: int


def header_json(read: Read, size: int, limits: Limits = DEFAULT_LIMITS,
                what: str = "the safetensors header") -> tuple[dict[str, Any], int]:
    """The header's JSON object and where the data start (``8 + N``), read through
    ``read(offset, n)`` from an input of ``size`` bytes that starts with the blob.

    Raises
    ------
    LimitExceededError
        ``N`` is over ``limits.max_safetensors_header_bytes``.
    FormatError
        Fewer than 8 bytes, ``N`` beyond the input, or not a UTF-8 JSON object.
    """
    if size < LENGTH_BYTES:
        raise FormatError(f"{what}: the input has {size} bytes, fewer than the "
                          f"{LENGTH_BYTES} of the header length", offset=0)
    n = int.from_bytes(bytes(read(0, LENGTH_BYTES)), "little")
    most = limits.max_safetensors_header_bytes
    if n > most:
        raise LimitExceededError("max_safetensors_header_bytes", most, n, what)
    if n > size - LENGTH_BYTES:
        raise FormatError(f"{what} of {n} bytes runs past the end of the input "
                          f"({size} bytes)", offset=0)
    try:
        header = json.loads(bytes(read(LENGTH_BYTES, n)).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"{what} is not UTF-8 JSON: {exc!s:.200}",
                          offset=LENGTH_BYTES) from exc
    if not isinstance(header, dict):
        raise FormatError(f"{what} is a JSON {type(header).__name__}, not an object",
                          offset=LENGTH_BYTES)
    return header, LENGTH_BYTES + n


def _text(value: str, what: str) -> str:
    """``value``, refused when it holds a lone surrogate (JSON escapes allow them, UTF-8
    does not, and safetensors refuses them)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FormatError(f"{what} {brief(value, 80)} is not valid Unicode") from exc
    return value


def _metadata(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise FormatError("the safetensors __metadata__ is not an object of strings")
    return {_text(k, "a metadata key"): _text(v, "a metadata value") for k, v in value.items()}


def _entry(name: str, value: object) -> Entry:
    """One header entry, checked on its own (the tiling is checked over all of them)."""
    what = f"safetensors tensor {name!r}"
    if not isinstance(value, dict):
        raise FormatError(f"{what}: its entry is a JSON {type(value).__name__}, not an object")
    code, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if not isinstance(code, str):
        raise FormatError(f"{what}: dtype {brief(code, 40)} is not a dtype code")
    if code in _NO_TORCH_DTYPE:
        raise UnsupportedFeatureError(f"{what}: dtype {code} has no torch dtype")
    dtype_name = CODES.get(code) or PACKED.get(code)
    if dtype_name is None:
        raise FormatError(f"{what}: dtype {brief(code, 40)} is not a safetensors dtype code")
    if not isinstance(shape, list) or not all(
            type(d) is int and 0 <= d < _DIM_END for d in shape):
        raise FormatError(f"{what}: shape {brief(shape, 80)} is not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
        raise FormatError(f"{what}: data_offsets {brief(offsets, 80)} are not [begin, end] "
                          "with 0 <= begin <= end")
    check_rank(len(shape), f"the rank of {what}")
    dtype = by_name(dtype_name)
    numel = math.prod(shape)
    if code in PACKED:
        if not shape or shape[-1] % 2:
            raise FormatError(f"{what}: {code} shape {shape} needs an even last dimension "
                              f"(torch's {dtype_name} holds pairs)")
        nbytes, shape = numel // 2, [*shape[:-1], shape[-1] // 2]
    else:
        nbytes = numel * dtype.itemsize
    begin, end = offsets
    if end - begin != nbytes:
        raise FormatError(f"{what}: data_offsets [{begin}, {end}] hold {end - begin} bytes; "
                          f"{code} of shape {value['shape']} is {nbytes} bytes")
    return Entry(_text(name, "a tensor name"), dtype, tuple(shape), begin, end)


def check_header(header: dict[str, Any], data_start: int, size: int,
                 limits: Limits = DEFAULT_LIMITS) -> Header:
    """The entries of a header read by :func:`header_json`, each checked, and checked to
    tile the ``size - data_start`` data bytes exactly.

    Raises
    ------
    FormatError, LimitExceededError, UnsupportedFeatureError
        As the module docstring lists.
    """
    meta = _metadata(header.get("__metadata__"))
    with applied(limits):
        entries = sorted((_entry(name, value) for name, value in header.items()
                          if name != "__metadata__"), key=lambda e: (e.begin, e.end))
    at, data_size = 0, size - data_start
    for e in entries:
        if e.begin != at:
            how = "overlap the tensor before" if e.begin < at else "leave a gap after byte"
            raise FormatError(f"safetensors tensor {e.name!r}: data_offsets [{e.begin}, "
                              f"{e.end}] {how} {at} (tensors must tile the data in order)",
                              offset=data_start + e.begin)
        at = e.end
    if at != data_size:
        raise FormatError(f"the safetensors tensors cover {at} data bytes, but the input "
                          f"holds {data_size} after its header", offset=data_start + at)
    return Header({e.name: e for e in entries}, meta, data_start, data_size)


def read_header(source: Source, limits: Limits = DEFAULT_LIMITS) -> Header:
    """The checked header of the safetensors file ``source`` (reads the header only).

    Raises
    ------
    FormatError, LimitExceededError, UnsupportedFeatureError
        As the module docstring lists.
    """
    what = "the safetensors header"
    header, start = header_json(lambda at, n: source.pread(at, n, what), source.size,
                                limits, what)
    return check_header(header, start, source.size, limits)


def to_tensors(header: Header, data: memoryview | None,
            map_location: Any = None) -> dict[str, Tensor]:
    """Each entry as a contiguous tensor on a storage of its own, keyed by its name:
    a view of ``data`` (the data bytes), or with no data when ``data`` is None."""
    out: dict[str, Tensor] = {}
    for name, e in header.entries.items():
        storage = Storage(None if data is None else data[e.begin:e.end], e.dtype, key=name,
                          untyped=e.dtype.is_v3, nbytes=e.nbytes)
        storage = restore_location(storage, "cpu", map_location)
        out[name] = Tensor(storage, 0, e.shape, contiguous_stride(e.shape), dtype=e.dtype)
    return out


def read_safetensors(source: Source, detected: Detected, options: ReadOptions) -> Any:
    """What ``torch.load`` returns for a ``.safetensors`` file: ``{name: Tensor}`` in data
    order, views of the source's bytes (of the map, when mapped); no data with
    ``skip_data``.  A file ptfile wrote gives back the object written to it
    (:mod:`.meta`).

    Raises
    ------
    FormatError, LimitExceededError, UnsupportedFeatureError
        As the module docstring lists.
    """
    header = read_header(source, options.limits)
    data = None if options.skip_data else source.view(header.data_start, header.data_size,
                                                      "the safetensors data")
    return restore(to_tensors(header, data, options.map_location), header.metadata,
                   options.limits)


def open_safetensors(source: Source, detected: Detected, options: ReadOptions) -> Opened:
    """The opener of :func:`ptfile.open`: the header read and checked, no tensor bytes;
    each tensor's file offset, for its bytes to be read on demand.  The metadata is the
    file's ``__metadata__`` (``{}`` without one), as ``safe_open`` gives it.

    Raises
    ------
    FormatError, LimitExceededError, UnsupportedFeatureError
        As the module docstring lists.
    """
    from ..options import Opened  # here: a scan of a safetensors file imports no policy

    header = read_header(source, options.limits)
    tensors = to_tensors(header, None)
    offsets = {t.storage: header.data_start + header.entries[name].begin
               for name, t in tensors.items() if t.storage is not None}
    obj = restore(tensors, header.metadata, options.limits)
    return Opened(source, Format.SAFETENSORS, obj, header.metadata or {}, offsets=offsets)


def saved_offsets(header: dict[str, Any], where: str) -> dict[str, list[int]]:
    """Where each tensor of a header (its JSON object) sits in the whole tensor, by its
    :data:`SHARDING_INFO` (torch's HuggingFaceStorageWriter), or at zeros without one: the
    one reader of that entry, for the DCP readers of both kinds of safetensors chunk.

    Raises
    ------
    FormatError
        The entry is not JSON, not an object, or lacks a tensor's ``saved_offsets`` list.

    Examples
    --------
    >>> saved_offsets({"__metadata__": {"DCP_SHARDING_INFO": '{"w": {"saved_offsets": [2]}}'},
    ...                "w": {"shape": [2]}}, "f")
    {'w': [2]}
    >>> saved_offsets({"w": {"shape": [2, 3]}}, "f")
    {'w': [0, 0]}
    """
    meta = header.get("__metadata__") or {}
    try:
        text = meta.get(SHARDING_INFO)
        sharding = None if text is None else json.loads(text)
    except (AttributeError, ValueError, TypeError, RecursionError) as exc:
        raise FormatError(f"the {SHARDING_INFO} of {where} is damaged") from exc
    if sharding is not None and not isinstance(sharding, dict):
        raise FormatError(f"the {SHARDING_INFO} of {where} is not a JSON object")
    out: dict[str, list[int]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            saved = sharding[name]["saved_offsets"] if sharding is not None \
                else [0] * len(entry["shape"])
        except (KeyError, TypeError) as exc:
            raise FormatError(f"the {SHARDING_INFO} of {where} has no saved_offsets for "
                              f"{brief(name, 80)}") from exc
        if not isinstance(saved, list):
            raise FormatError(f"the saved_offsets of {brief(name, 80)} in {where} are not "
                              "a list")
        out[name] = saved
    return out
