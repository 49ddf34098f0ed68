"""``torch.export.save`` archives (``.pt2``): their weights and constants, read as data.

Layout (verified against torch 2.13).  A ``.pt2`` archive is a ZIP written by
torch's C++ archive writer (same prefix folder, "FB" alignment padding and
metadata records as :mod:`.zipped`: ``.data/version`` is ``6``, ``byteorder``,
``.data/serialization_id``) whose records are, under the prefix:

* ``archive_format`` — the text ``pt2`` (what detection keys on);
  ``archive_version`` — ``0``, the only version torch 2.13 writes.
* ``models/<model>.json`` — the serialized ExportedProgram (graph, signature).
  ``torch.export.save`` writes one model, named ``model``.  ptfile does not
  read the graph; it never runs anything from the archive.
* ``data/sample_inputs/<model>.pt`` — a ``torch.save`` of the example inputs
  (not read).
* ``data/weights/<model>_weights_config.json`` — a *payload config*:
  ``{"config": {<FQN>: <payload meta>, ...}}`` for every entry of
  ``ExportedProgram.state_dict`` (parameters and persistent buffers), in
  state-dict order.  ``data/constants/<model>_constants_config.json`` is the
  same for ``ExportedProgram.constants`` (lifted tensor constants and
  non-persistent buffers).
* A payload meta is ``{"path_name": str, "is_param": bool, "use_pickle": bool,
  "tensor_meta": {...} | null}``; ``path_name`` is a record in the config's
  folder: ``weight_<i>`` (weights), ``tensor_<i>`` (tensor constants),
  ``custom_obj_<i>``/``opaque_obj_<i>`` (TorchBind / opaque objects, pickled,
  ``tensor_meta`` null: :func:`ptfile.load` refuses them, unpickling them would
  run their classes' code; a metadata read, ``skip_data``, leaves them out, so
  :func:`ptfile.open` and ``inspect`` work: the program's signature lists them).
* ``tensor_meta`` is ``{"dtype": <serde ScalarType int>, "sizes": [SymInt],
  "strides": [SymInt], "storage_offset": SymInt, "requires_grad": bool,
  "device": {"type": str, "index": int | null}, "layout": <serde Layout int>}``
  where a concrete SymInt is ``{"as_int": n}`` (``{"as_expr": ...}`` is
  symbolic: refused).  The ScalarType numbers are the export schema's
  (:data:`SCALAR_TYPES`: 7 is float32, 13 bfloat16...), not c10's; layout 7 is
  strided, the only one read.
* With ``use_pickle`` false the record holds the raw bytes of the tensor's whole
  untyped storage, in the archive's byte order.  Tensors sharing a storage
  (tied weights, views) share one record: each entry is the view ``sizes`` /
  ``strides`` / ``storage_offset`` (in elements) of that record viewed as
  ``dtype``.  An empty record stands for zeros of ``sizes`` (torch writes one
  for an empty tensor).  With ``use_pickle`` true (tensor subclasses) the record
  is a whole nested ``torch.save`` archive: ptfile reads it with the ZIP
  reader (:mod:`.zipped`) and the caller's global policy (by default torch's
  weights-only allowlist), so a subclass outside it is refused; a payload in
  another format is damage.
* Older archives kept the state dict as one ``data/weights/<model>.pt``: refused.

What :func:`read_pt2` returns (and so :func:`ptfile.load`): one flat dict, the
state dict entries (``torch.export.load(f).state_dict``: a
:class:`~ptfile.Parameter` where ``is_param``) then the constants
(``.constants``), by FQN; a name in both is damage.  An archive with several
models is refused.  Each storage's key is its record's path under ``data/``
(``weights/weight_0``, ``constants/tensor_0``), as a ``torch.save`` storage's key
is, so the lazy reader (:func:`ptfile.open`, through :func:`open_pt2`, which reads
with ``skip_data``: no storage bytes) finds its record and file offset.  The bytes of a mapped source are
sliced on first use; otherwise each tensor is a view of the source's bytes, read
when the archive is.  The program itself (``models/<model>.json``) is read only
by ``inspect`` (:mod:`.pt2_program`).  ``map_location`` and
the :func:`ptfile.register_package` handlers apply to each record's storage, at
the device the tensor meta records (``cpu``, ``cuda:0``...), as for ``torch.save``
archives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from .._io.local import BytesSource, Source
from ..archive import Record, ZipReader
from ..errors import FormatError, UnsupportedFeatureError, brief
from ..model import dtypes
from ..model.location import has_packages, restore_location
from ..model.tensor import Parameter, Storage, Tensor
from .detection import Detected, Format, detect_source
from .options import Opened, ReadOptions
from .storages import MappedLocator, record_bytes
from .zipinfo import ZipInfo, read_info
from .zipped import read_zip, zip_meta

__all__ = ["SCALAR_TYPES", "device_of", "model_name", "open_pt2", "read_pt2"]

#: The export schema's ScalarType numbers (``torch/_export/serde/schema.py``) → torch dtype.
SCALAR_TYPES: Final[Mapping[int, str]] = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32",
    8: "float64", 9: "complex32", 10: "complex64", 11: "complex128", 12: "bool",
    13: "bfloat16", 28: "uint16", 29: "float8_e4m3fn", 30: "float8_e5m2",
    31: "float8_e4m3fnuz", 32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32",
    35: "uint64",
}

#: The export schema's Layout number of a strided tensor.
STRIDED: Final = 7
#: The archive versions read.
ARCHIVE_VERSIONS: Final = frozenset({"0"})
#: The payload folders, and the object records no tensor lives in.
_DATA, _WEIGHTS, _CONSTANTS = "data/", "data/weights/", "data/constants/"
_PICKLED_OBJECTS: Final = ("custom_obj_", "opaque_obj_")


class _Archive:
    """One parsed ``.pt2``: its reader, source, metadata and how to make storages."""

    def __init__(self, source: Source, reader: ZipReader, info: ZipInfo,
                 options: ReadOptions) -> None:
        self.source, self.reader, self.info, self.options = source, reader, info, options
        self.lazy = source.map_access is not None and not options.skip_data
        self._locator: MappedLocator | None = None

    def name(self, path: str) -> str:
        return f"{self.info.prefix}/{path}"

    def record(self, path: str) -> Record:
        record = self.reader.get(self.name(path))
        if record is None:
            raise FormatError(f"the .pt2 archive has no {path} record", member=self.name(path))
        return record

    def text(self, path: str, ceiling: int) -> bytes:
        record = self.record(path)
        if record.size > ceiling:
            raise FormatError(f"record is {record.size} bytes, over {ceiling}",
                              member=self.name(path))
        return self.reader.read(record)

    def storage(self, path: str, dtype: dtypes.DType, location: str) -> Storage:
        """The storage of the record ``path`` (``data/weights/weight_0``); its key is the
        path under ``data/`` (``weights/weight_0``), as a ``torch.save`` storage's key is."""
        record = self.record(path)
        key, nbytes, order = path.removeprefix(_DATA), record.size, self.info.byteorder
        if self.options.skip_data:
            return Storage._from_record(None, dtype, location, key, False, order, nbytes)
        if self.lazy:
            if self._locator is None:
                self._locator = MappedLocator(self.reader, self.source, self.name(_DATA))
            return Storage._located_later(self._locator, dtype, location, key, False, order,
                                          nbytes)
        data = record_bytes(self.reader, self.source, record, self.reader.data_offset,
                            self.source.map_access)
        return Storage._from_record(data, dtype, location, key, False, order, nbytes)


# --------------------------------------------------------------------------- checked JSON

def _field(obj: object, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj or not isinstance(obj[key], kind) \
            or (kind is int and isinstance(obj[key], bool)):
        raise FormatError(f"{where}: expected a {key!r} field of type "
                          f"{getattr(kind, '__name__', kind)}, got {brief(obj, 120)}")
    return obj[key]


def _symint(value: object, where: str) -> int:
    if isinstance(value, dict) and "as_int" not in value:
        raise UnsupportedFeatureError(f"{where}: a symbolic size {brief(value, 80)} (only concrete "
                                      "sizes are read)")
    number: int = _field(value, "as_int", int, where)
    if number < 0:
        raise FormatError(f"{where}: negative size, stride or offset {number}")
    return number


def _ints(meta: object, key: str, where: str) -> tuple[int, ...]:
    items = _field(meta, key, list, where)
    return tuple(_symint(item, f"{where} {key}") for item in items)


def _dtype(meta: object, where: str) -> dtypes.DType:
    code = _field(meta, "dtype", int, where)
    name = SCALAR_TYPES.get(code)
    if name is None:
        raise FormatError(f"{where}: unknown export ScalarType {code}")
    return dtypes.by_name(name)


def device_of(meta: object, where: str) -> str:
    """The location tag (``cpu``, ``cuda:0``) of a ``TensorMeta``'s ``device`` field."""
    device = _field(meta, "device", dict, where)
    kind = _field(device, "type", str, f"{where} device")
    index = device.get("index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
        raise FormatError(f"{where}: device index {brief(index, 40)} is not an int")
    return kind if index is None else f"{kind}:{index}"


def _config(archive: _Archive, path: str) -> dict[str, Any]:
    raw = archive.text(path, archive.options.limits.max_pickle_bytes)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise FormatError(f"payload config is not JSON: {exc}", member=archive.name(path)) \
            from None
    config: dict[str, Any] = _field(doc, "config", dict, path)
    return config


# --------------------------------------------------------------------------- tensors

class _Folder:
    """The tensors of one payload config, each record's storage made once (aliasing kept)."""

    def __init__(self, archive: _Archive, folder: str) -> None:
        self.archive, self.folder = archive, folder
        self.storages: dict[tuple[str, str], Storage] = {}

    def tensor(self, fqn: str, payload: object) -> Any:
        where = f"{self.folder}{fqn!r}"
        path = _field(payload, "path_name", str, where)
        is_param = _field(payload, "is_param", bool, where)
        if _field(payload, "use_pickle", bool, where):
            return self._pickled(path, where)
        meta = _field(payload, "tensor_meta", dict, where)
        layout = _field(meta, "layout", int, where)
        if layout != STRIDED:
            raise UnsupportedFeatureError(f"{where}: layout {layout} (only strided tensors, "
                                          f"layout {STRIDED}, are read)")
        dtype, location = _dtype(meta, where), device_of(meta, where)
        size, stride = _ints(meta, "sizes", where), _ints(meta, "strides", where)
        offset = _symint(_field(meta, "storage_offset", dict, where), f"{where} storage_offset")
        requires_grad = _field(meta, "requires_grad", bool, where)
        storage = self._storage(path, dtype, location, size, where)
        tensor = Tensor(storage, offset, size, stride, dtype=dtype)
        if is_param:
            return Parameter(tensor, requires_grad=requires_grad)
        tensor.requires_grad = requires_grad
        return tensor

    def _storage(self, path: str, dtype: dtypes.DType, location: str, size: tuple[int, ...],
                 where: str) -> Storage:
        storage = self.storages.get((path, dtype.name))
        if storage is not None:
            return storage
        if path.startswith(_PICKLED_OBJECTS) or "/" in path:
            raise FormatError(f"{where}: {brief(path, 80)} is not a tensor record")
        storage = self.archive.storage(self.folder + path, dtype, location)
        options = self.archive.options
        if options.map_location is not None or has_packages():
            storage = restore_location(storage, location, options.map_location)
        if storage.nbytes % dtype.itemsize:
            raise FormatError(f"{where}: record of {storage.nbytes} bytes is not a whole number "
                              f"of {dtype!r} elements", member=self.archive.name(self.folder + path))
        if storage.nbytes == 0:
            storage = self._zeros(path, dtype, location, size)
        self.storages[(path, dtype.name)] = storage
        return storage

    def _zeros(self, path: str, dtype: dtypes.DType, location: str,
               size: tuple[int, ...]) -> Storage:
        numel = 1
        for n in size:
            numel *= n
        nbytes = numel * dtype.itemsize
        ceiling = self.archive.options.limits.max_pickle_bytes
        if nbytes > ceiling:
            raise FormatError(f"empty record {path!r} stands for {nbytes} bytes of zeros, over "
                              f"{ceiling}", member=self.archive.name(self.folder + path))
        key = (self.folder + path).removeprefix(_DATA)
        return Storage._from_record(memoryview(bytearray(nbytes)), dtype, location, key, False,
                                    "little", nbytes)

    def _pickled(self, path: str, where: str) -> Any:
        if path.startswith(_PICKLED_OBJECTS):
            raise UnsupportedFeatureError(
                f"{where} is a pickled TorchBind or opaque object ({path!r}); ptfile reads "
                "tensors only")
        data = self.archive.reader.read(self.archive.record(self.folder + path))
        name = self.archive.name(self.folder + path)
        nested = BytesSource(data, name=name)
        options = self.archive.options
        detected = detect_source(nested, options.limits)
        if detected.format is not Format.ZIP:
            raise FormatError(f"{where}: a pickled payload must be a torch.save archive, "
                              f"found {detected.format.value}", member=name)
        # Read whole: its records are in memory, not in the outer archive's data/ folder.
        return read_zip(nested, detected, replace(options, skip_data=False))


def _read_config(archive: _Archive, folder: str, config_path: str,
                 into: dict[str, Any]) -> None:
    reader = _Folder(archive, folder)
    for fqn, payload in _config(archive, config_path).items():
        if fqn in into:
            raise FormatError(f"{fqn!r} is both a weight and a constant",
                              member=archive.name(config_path))
        if archive.options.skip_data and _is_object(payload):
            continue
        into[fqn] = reader.tensor(fqn, payload)


def _is_object(payload: object) -> bool:
    """A pickled TorchBind / opaque object's entry (not a tensor)."""
    path = payload.get("path_name") if isinstance(payload, dict) else None
    return isinstance(path, str) and path.startswith(_PICKLED_OBJECTS)


def model_name(reader: ZipReader, prefix: str) -> str:
    """The name of the one exported program of the archive (``models/<name>.json``).

    Raises
    ------
    UnsupportedFeatureError
        The archive holds no program or several.
    """
    start = f"{prefix}/models/"
    names = [r.name[len(start):-len(".json")] for r in reader.records
             if r.name.startswith(start) and r.name.endswith(".json")]
    if len(names) != 1 or "/" in names[0]:
        raise UnsupportedFeatureError(f"the .pt2 archive holds {len(names)} models "
                                      f"({', '.join(sorted(names))[:200]}); ptfile reads "
                                      "archives of one exported program")
    return names[0]


_CONFIGS: Final[tuple[tuple[str, str], ...]] = (
    (_WEIGHTS, _WEIGHTS + "{}_weights_config.json"),
    (_CONSTANTS, _CONSTANTS + "{}_constants_config.json"),
)


def read_pt2(source: Source, detected: Detected, options: ReadOptions) -> dict[str, Any]:
    """The weights then the constants of a ``torch.export.save`` archive, by FQN.

    Raises
    ------
    FormatError
        A record is missing, a config is malformed, a view does not fit its record.
    UnsupportedFeatureError
        Several models, a legacy ``<model>.pt`` weights file, a pickled object
        constant, a symbolic size, a non-strided layout, or an unknown archive version.
    UnsafeGlobalError
        A pickled tensor names a global ``options.policy`` refuses.
    """
    reader = detected.zip_reader()
    archive = _Archive(source, reader, read_info(reader, options.settings), options)
    version = archive.text("archive_version", 64).decode("ascii", "replace").strip()
    if version not in ARCHIVE_VERSIONS:
        raise UnsupportedFeatureError(f".pt2 archive_version {brief(version, 20)} (ptfile reads "
                                      f"{', '.join(sorted(ARCHIVE_VERSIONS))})")
    model = model_name(reader, archive.info.prefix)
    if reader.get(archive.name(f"{_WEIGHTS}{model}.pt")) is not None:
        raise UnsupportedFeatureError(f"the .pt2 archive keeps its weights in the legacy "
                                      f"{_WEIGHTS}{model}.pt form; re-save it with torch 2.13")
    out: dict[str, Any] = {}
    for folder, config in _CONFIGS:
        _read_config(archive, folder, config.format(model), out)
    return out



def open_pt2(source: Source, detected: Detected, options: ReadOptions) -> Opened:
    """:func:`read_pt2` without any storage's bytes: the opener of :func:`ptfile.open`.
    The bytes are read from the archive's records on demand (a storage's key is its
    record's path under ``data/``).

    Raises
    ------
    FormatError, UnsupportedFeatureError, UnsafeGlobalError
        As :func:`read_pt2`.
    """
    reader = detected.zip_reader()
    info = read_info(reader, options.settings)
    obj = read_pt2(source, detected, replace(options, skip_data=True))
    return Opened(source, Format.PT2, obj, {**zip_meta(info), "format": Format.PT2.value},
                  archive=reader, info=info)
