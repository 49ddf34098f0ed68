"""The one safetensors writer and the one index writer: streaming, byte for byte as the
``safetensors`` package writes.

Every ``.safetensors`` file ptfile writes comes from here: ``ptfile convert`` of one file
or of a sharded checkpoint's shards (:mod:`ptfile.export.safetensors`), and the
consolidation of a distributed checkpoint (:mod:`ptfile.dcp.consolidate`), which assembles
one tensor at a time.  The header is computed from the tensors' names, dtypes and shapes
alone (:func:`plan_file`), then each tensor's bytes are asked for and written in turn
(:func:`write_file`, :func:`save_file`): the memory held is one tensor, whatever the file's
size.  Nothing here needs the ``safetensors`` package.

What is written (safetensors 0.8's ``serialize``; the format is in :mod:`.safetensors`)
---------------------------------------------------------------------------------------
* The tensors in data order: by dtype, in :data:`ORDER` (the package's ``Dtype`` enum,
  widest first), then by name (code point order, which is UTF-8 byte order).
* The header: one compact JSON object (``","`` and ``":"``, no spaces; non-ASCII as
  UTF-8, control characters escaped as ``\\u00XX``, as serde_json and Python's
  :mod:`json` both write them), ``"__metadata__"`` first when there is metadata (an
  empty ``{}`` too, none for ``None``), then ``name: {"dtype", "shape",
  "data_offsets"}`` in data order; padded with spaces to a multiple of 8 bytes.
* The metadata in the order given.  The package writes its metadata in the order of a
  Rust ``HashMap`` (a new order each process), so files with more than one metadata
  entry are equal to its files up to that order; ptfile's order is the caller's, so the
  same object gives the same bytes (deterministic writer).
* The data: each tensor C-contiguous, little-endian, with no padding.

A Hugging Face index (:func:`save_index`): ``{"metadata": {"total_size": <tensor bytes>,
...}, "weight_map": {name: shard file}}``, indented by 2, as ``huggingface_hub``'s
``save_torch_state_dict`` writes it.

Every file is written atomically (a temporary file renamed on success).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Final

import numpy as np

from ..._io.atomic import atomic_file
from ...errors import SaveError, UnsupportedFeatureError
from ...model.dtypes import DType
from .header import CODES, LENGTH_BYTES

__all__ = ["ORDER", "Layout", "Planned", "plan_file", "save_file", "save_index", "write_file"]

#: safetensors' order of dtype codes in a file: widest first (its Rust enum, descending).
ORDER: Final = ("U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16",
                "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "F8_E4M3", "F8_E5M2", "I8", "U8",
                "BOOL")
#: torch dtype name → safetensors code, for every dtype a file can hold.
CODE_OF: Final = {name: code for code, name in CODES.items()}
_RANK: Final = {code: i for i, code in enumerate(ORDER)}
#: The header is padded to a multiple of this many bytes (the data start aligned for
#: every element size up to 8).
HEADER_ALIGNMENT: Final = 8
#: The header's own entry, beside the tensors.
METADATA_KEY: Final = "__metadata__"


@dataclass(frozen=True, slots=True)
class Planned:
    """One tensor to write: its name, torch dtype and shape."""

    name: str
    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """The tensor's bytes in the file."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Layout:
    """A planned file: its header (the 8-byte length included), the tensors in data order,
    and the data's bytes."""

    header: bytes
    order: tuple[Planned, ...]
    data_size: int


def plan_file(tensors: Iterable[Planned], metadata: Mapping[str, str] | None = None
              ) -> Layout:
    """The header and data order of a file of ``tensors`` with ``metadata``.

    Raises
    ------
    UnsupportedFeatureError
        A dtype safetensors cannot hold.
    SaveError
        Two tensors of one name.

    Examples
    --------
    >>> import ptfile
    >>> plan = plan_file([Planned("w", ptfile.DTYPES["float32"], (1,))], {"format": "pt"})
    >>> plan.header[8:]
    b'{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}   '
    """
    entries = []
    for t in tensors:
        code = CODE_OF.get(t.dtype.name)
        if code is None:
            raise UnsupportedFeatureError(f"tensor {t.name!r}: safetensors cannot hold "
                                          f"{t.dtype!r}")
        entries.append((_RANK[code], t.name, code, t))
    entries.sort(key=lambda e: (e[0], e[1]))
    header: dict[str, Any] = {} if metadata is None else {METADATA_KEY: dict(metadata)}
    at = 0
    for _, name, code, t in entries:
        if name in header or name == METADATA_KEY:
            raise SaveError(f"two tensors are named {name!r}" if name in header else
                            f"a tensor cannot be named {name!r} in a safetensors file")
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [at, at + t.nbytes]}
        at += t.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % HEADER_ALIGNMENT)
    return Layout(len(text).to_bytes(LENGTH_BYTES, "little") + text,
                  tuple(e[3] for e in entries), at)


def _raw(data: Any, t: Planned) -> memoryview:
    """``data`` as the ``t.nbytes`` bytes to write."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
    view = memoryview(data).cast("B")
    if view.nbytes != t.nbytes:
        raise SaveError(f"tensor {t.name!r}: {view.nbytes} bytes given for {t.dtype.name} of "
                        f"shape {list(t.shape)} ({t.nbytes} bytes)")
    return view


def write_file(fp: IO[bytes], layout: Layout, fill: Callable[[Planned], Any]) -> None:
    """Write the planned file to ``fp``: the header, then ``fill(t)`` (one tensor's
    little-endian C-order bytes: a numpy array, or a bytes-like object) of each tensor in data order, each
    released before the next is asked for.

    Raises
    ------
    SaveError
        ``fill`` gave another number of bytes than planned.
    """
    fp.write(layout.header)
    for t in layout.order:
        view = _raw(fill(t), t)
        if view.nbytes:
            fp.write(view)
        del view


def save_file(path: str | os.PathLike[str], tensors: Iterable[Planned],
              fill: Callable[[Planned], Any], metadata: Mapping[str, str] | None = None
              ) -> Layout:
    """Write ``tensors`` (their bytes from ``fill``, one at a time) as the safetensors
    file ``path``, atomically; return its layout.

    Raises
    ------
    UnsupportedFeatureError, SaveError
        As :func:`plan_file` and :func:`write_file`.

    Examples
    --------
    >>> import numpy as np, os, ptfile, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "w.safetensors")
    >>> w = np.arange(3, dtype="<f4")
    >>> _ = save_file(path, [Planned("w", ptfile.DTYPES["float32"], (3,))], lambda t: w)
    >>> ptfile.load(path)["w"].numpy().tolist()
    [0.0, 1.0, 2.0]
    >>> tmp.cleanup()
    """
    layout = plan_file(tensors, metadata)
    with atomic_file(os.fspath(path), fsync=False) as fp:
        write_file(fp, layout, fill)
    return layout


def save_index(path: str | os.PathLike[str], weight_map: Mapping[str, str], total_size: int,
               metadata: Mapping[str, Any] | None = None) -> None:
    """Write a Hugging Face index: ``total_size`` (the tensors' bytes) and ``metadata``
    under ``"metadata"``, and the ``weight_map``, atomically.

    Examples
    --------
    >>> import json, os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "model.safetensors.index.json")
    >>> save_index(path, {"w": "model-00001-of-00001.safetensors"}, 12)
    >>> with open(path) as fp:
    ...     json.load(fp)["metadata"]
    {'total_size': 12}
    >>> tmp.cleanup()
    """
    index = {"metadata": {"total_size": total_size, **(metadata or {})},
             "weight_map": dict(weight_map)}
    with atomic_file(os.fspath(path), fsync=False) as fp:
        fp.write(json.dumps(index, indent=2).encode("utf-8"))
