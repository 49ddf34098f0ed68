"""What torch's ZIP loaders read: ``torch.load`` on a ZIP, ``torch.jit.load``, ``torch.export.load``.

Each function below lists the records (:class:`Region`) one loader would unpickle,
hand to ``torch.load``, compile or load as native code, with that loader's
leniency; :func:`zip_regions` merges them (a record two loaders read is one
region naming both).  Specified against torch 2.13's source and checked by
running the loaders on mutated archives (``tests/scanning/test_scan_zip_loaders.py``).

How torch finds a record
------------------------
Every loader here opens the archive with ``torch._C.PyTorchFileReader``
(``caffe2/serialize/inline_container.cc`` over miniz), except the old
``torch.export`` format below, read by Python's ``zipfile``.

* **The archive folder** is the first central directory name up to its first
  ``/`` (none: ``file in archive is not in a subdirectory``).  ``get_record(n)`` and
  ``has_record(n)`` look up ``<folder>/<n>``.
* **Lookups ignore ASCII case**: miniz's ``mz_zip_reader_locate_file`` without
  ``MZ_ZIP_FLAG_CASE_SENSITIVE`` (torch passes no flags) folds ``A-Z`` only, over
  the whole name, folder included.  So ``archive/DATA.PKL``, ``ARCHIVE/data.pkl``
  and ``archive/CODE/__TORCH__.PY`` are what ``data.pkl`` and ``code/__torch__.py``
  find.  There is no other normalisation (``a/../b`` is a name like any other), and
  the record must sit exactly at ``<folder>/<n>``: ``archive/sub/data.pkl`` is not
  ``data.pkl``.  Names equal but for case are one anomaly already
  (``case-colliding-names``): every one of them is listed here.
* **``get_all_records()``** is exact: it lists the names under the folder, byte for
  byte (a name outside it raises ``file in archive is not in a subdirectory``), less
  the folder.  Python code that tests ``name in get_all_records()`` is case-sensitive.
* Opening requires a ``.data/version`` or ``version`` record (case folded) holding a
  supported number.  The model does not rely on torch refusing a file (a missing
  version, a name outside the folder, a config torch chokes on later): it lists what
  each loader reads *if it gets that far*, so scanning never depends on a refusal.

``torch.load`` on a ZIP (:func:`torch_load_regions`)
    ``serialization.load``: a file starting ``PK\\x03\\x04``.  It is a TorchScript
    archive when ``"constants.pkl" in get_all_records()`` (exact case, directly
    under the folder): ``weights_only=True`` then refuses it and
    ``weights_only=False`` hands it to ``torch.jit.load``.  Otherwise ``_load``
    unpickles ``get_record("data.pkl")`` (case folded), with the weights-only
    unpickler or the full one.  ``byteorder``, ``.format_version``,
    ``.storage_alignment`` and ``data/<key>`` are read as bytes, never unpickled.
    So an archive with ``Constants.pkl`` is TorchScript to ``torch.jit.load`` and a
    pickle checkpoint to ``torch.load``, whose full unpickler runs its ``data.pkl``.
``torch.jit.load`` (:func:`jit_load_regions`)
    ``import_ir_module``: ``constants.pkl``, then ``data.pkl`` (case folded; without
    ``constants.pkl`` it raises before reading anything), read by
    torch's C++ unpickler (it imports no Python: a global resolves to a TorchScript
    class or fails), and the sources of the classes they name,
    ``code/<qualified path>.py`` (case folded: ``CODE/__torch__.PY`` is compiled),
    with their ``.debug_pkl`` source ranges (C++ unpickler).  The code runs: methods
    such as ``__setstate__`` are called while loading.  The legacy format
    (``model.json``) also unpickles ``attributes.pkl``.  Every record under
    ``<folder>/code/`` ending in ``.py`` is listed, as any may be asked for.
``torch.jit.mobile._load_for_lite_interpreter`` (:func:`lite_load_regions`)
    The mobile (lite interpreter) loader, ``_load_for_mobile``: an archive with a
    ``bytecode.pkl`` (case folded; without one it raises).  It unpickles
    ``bytecode.pkl``, ``constants.pkl``, ``data.pkl`` and the debug pickles
    (``mobile_debug_handles.pkl``, ``callstack_debug_map.pkl``, every ``.debug_pkl``)
    with torch's C++ unpickler, and never reads ``code/``.  ``bytecode.pkl`` is the
    program: per method its instructions, its **operator table** (``("aten::add",
    "Tensor", 2)``: each resolved among the operators torch registers and called by
    ``OP`` instructions), constants and **types** (``__torch__.torch.classes.<ns>.<C>``
    is a native custom class); the ``__setstate__`` of each object ``data.pkl`` builds
    runs while loading.  It is listed as ``bytecode`` and judged by
    :mod:`ptfile.scanning.lite`.  ``extra/`` records and ``mobile_info.json`` are read as
    bytes into the caller's ``extra_files`` map, never run.  (A lite module in
    torch's flatbuffer format, not a ZIP, is not modelled.)
``torch.export.load`` (:func:`export_load_regions`)
    ``export.load`` calls ``pt2_archive._package.load_pt2``; on a ``RuntimeError``
    (or nothing loaded) it falls back to the torch 2.7 format, read with ``zipfile``.

    * ``.pt2``: ``archive_format`` (case folded) must read ``pt2`` and
      ``archive_version`` ``0``.  The models are the names of ``get_all_records()``
      starting ``models/`` (exact), ``<m>`` being the name less ``models/`` and its
      last five characters.  For each: ``data/sample_inputs/<m>.pt`` goes to
      ``torch.load`` (weights-only first, then ``weights_only=False``); the legacy
      ``data/weights/<m>.pt`` and ``data/constants/<m>.pt`` likewise when listed
      (exact); otherwise the payload configs ``data/weights/<m>_weights_config.json``
      and ``data/constants/<m>_constants_config.json`` (listed exactly, read case
      folded), JSON ``{"config": {fqn: {"path_name", "use_pickle", ...}}}``.  A
      weight whose ``use_pickle`` is true (Python truth: ``1`` and ``"no"`` are
      true) is ``torch.load(..., weights_only=False)`` of the record
      ``os.path.join("data/weights/", path_name)`` (case folded; any subfolder,
      ``..`` included as a name); a constant likewise when its ``path_name``
      starts ``tensor_``; ``custom_obj_*`` goes to ``torch._C._pickle_load_obj``
      (a TorchScript pickle archive), ``opaque_obj_*`` to ``pickle.loads``,
      whatever ``use_pickle`` says.  Records under ``data/aotinductor/`` are an
      AOTInductor package: its shared library is loaded (native code).
    * A config that cannot be read (missing, over ``Limits.max_pickle_bytes``, not
      JSON, not of that shape) makes the model conservative: every other record of
      the archive is listed as one ``torch.load`` might read (``guess``,
      :attr:`ZipModel.guessed`).
    * The old format: when the archive has a record named exactly ``version`` (no
      folder), ``serialized_state_dict.pt``, ``serialized_constants.pt`` and
      ``serialized_example_inputs.pt`` (exact, no folder) go to ``torch.load``
      (weights-only, then ``weights_only=False``).

What no loader reads (records ending ``.pkl`` or ``.debug_pkl`` that no region
lists: another folder's ``data.pkl``) is :attr:`ZipModel.unread`:
the scanner scans them with findings at most ``unknown``.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from ..containers import ZipEntry
from . import EXPORT_LOAD, JIT_LOAD, LITE_LOAD, TORCH_LOAD, TORCH_LOAD_UNSAFE

__all__ = ["How", "Region", "ZipModel", "export_load_regions", "fold", "jit_load_regions",
           "lite_load_regions", "torch_load_regions", "zip_regions"]

#: How a loader reads a record: ``pickle`` (one unpickling of its bytes), ``file``
#: (``torch.load(weights_only=False)`` of its bytes as a whole file: a ZIP, a legacy
#: stream, a tar), ``code`` (TorchScript source compiled and run), ``native``
#: (a shared library loaded), ``guess`` (a record ``torch.load`` may read as a whole
#: file, listed because a payload config could not be read: :attr:`ZipModel.guessed`),
#: ``bytecode`` (the lite interpreter's program: a pickle whose operators it calls).
How = Literal["pickle", "file", "code", "native", "guess", "bytecode"]

#: Record names (under the folder, case folded) ``torch.jit.load`` unpickles.
_JIT_PICKLES: Final = (b"constants.pkl", b"data.pkl", b"attributes.pkl")
#: Record names (under the folder, case folded) the lite interpreter unpickles, besides
#: ``bytecode.pkl`` and every ``.debug_pkl``.
_LITE_PICKLES: Final = (b"constants.pkl", b"data.pkl", b"mobile_debug_handles.pkl",
                        b"callstack_debug_map.pkl")
#: Suffixes of AOTInductor's native code (``data/aotinductor/<model>/``).
_NATIVE: Final = (b".so", b".dll", b".dylib", b".pyd", b".cpp", b".cu", b".o")
#: The old ``torch.export`` format's records that go to ``torch.load`` (exact, no folder).
_OLD_EXPORT: Final = ("serialized_state_dict.pt", "serialized_constants.pt",
                      "serialized_example_inputs.pt")
#: Names whose records are pickles by torch's naming: what :attr:`ZipModel.unread` holds.
_PICKLE_SUFFIXES: Final = (b".pkl", b".debug_pkl")

#: Reads a record's bytes for the model (a config); None when it cannot be read.
Reader = Callable[[ZipEntry], "bytes | None"]


def fold(name: str) -> bytes:
    """``name`` as miniz compares it: its bytes with ASCII letters lowered.

    Examples
    --------
    >>> fold("Archive/DATA.PKL"), fold("É") == "É".encode()
    (b'archive/data.pkl', True)
    """
    return name.encode("utf-8", "surrogateescape").lower()


@dataclass(frozen=True, slots=True)
class Region:
    """A record a loader reads, how, and which loaders."""

    entry: ZipEntry
    how: How
    loaders: tuple[str, ...]


@dataclass(slots=True)
class ZipModel:
    """What every ZIP loader reads in one archive (:func:`zip_regions`).

    Attributes
    ----------
    regions : list of Region
        In central directory order, one per (record, how).
    unread : list of ZipEntry
        Pickle-named records no loader reads.
    guessed : list of str
        Why every record was listed as a possible ``torch.load`` input (a payload
        config the model could not read); empty otherwise.
    jit : bool
        ``torch.jit.load`` finds ``constants.pkl`` or the lite interpreter
        ``bytecode.pkl`` (case folded): the archive is TorchScript to it, and its
        ``__torch__`` names are class references.
    """

    regions: list[Region] = field(default_factory=list)
    unread: list[ZipEntry] = field(default_factory=list)
    guessed: list[str] = field(default_factory=list)
    jit: bool = False


class _Archive:
    """The archive as PyTorchFileReader sees it: the folder, folded and exact lookups."""

    def __init__(self, entries: Sequence[ZipEntry]) -> None:
        self.entries = entries
        named = [e for e in entries if not e.shadow]
        first = named[0].name if named else ""
        self.folder = first.split("/", 1)[0] if "/" in first else ""
        self._folded_folder = fold(self.folder + "/")
        self._by_fold: dict[bytes, list[ZipEntry]] = {}
        for e in entries:
            self._by_fold.setdefault(fold(e.name), []).append(e)
        #: ``get_all_records()``: exact names under the folder, less the folder.
        self.listed = [e.name[len(self.folder) + 1:] for e in named
                       if self.folder and e.name.startswith(self.folder + "/")]

    def get(self, name: str) -> list[ZipEntry]:
        """Every record ``get_record(name)`` may find (case folded, under the folder)."""
        if not self.folder:
            return []
        return self._by_fold.get(self._folded_folder + fold(name), [])

    def under(self) -> Iterable[tuple[ZipEntry, bytes]]:
        """Each record under the folder (case folded) with its folded name less the folder."""
        n = len(self._folded_folder)
        for e in self.entries:
            name = fold(e.name)
            if self.folder and name.startswith(self._folded_folder):
                yield e, name[n:]


def torch_load_regions(entries: Sequence[ZipEntry]) -> list[Region]:
    """The records ``torch.load`` unpickles in a ZIP (module docstring): ``data.pkl``, by
    both unpicklers, unless ``constants.pkl`` (exact) makes it TorchScript, which
    ``weights_only=False`` hands to ``torch.jit.load`` (those records are listed with
    :func:`jit_load_regions`, :data:`TORCH_LOAD_UNSAFE` added)."""
    archive = _Archive(entries)
    if "constants.pkl" in archive.listed:
        return [Region(r.entry, r.how, (TORCH_LOAD_UNSAFE, JIT_LOAD))
                for r in jit_load_regions(entries)]
    return [Region(e, "pickle", (TORCH_LOAD_UNSAFE, TORCH_LOAD))
            for e in archive.get("data.pkl")]


def jit_load_regions(entries: Sequence[ZipEntry]) -> list[Region]:
    """The records ``torch.jit.load`` unpickles or compiles (module docstring):
    ``constants.pkl``, ``data.pkl`` (``attributes.pkl``), and every ``code/**.py``
    and ``code/**.debug_pkl`` under the folder, all case folded; none in an archive
    without ``constants.pkl`` (or the legacy ``model.json``), where it raises first."""
    archive = _Archive(entries)
    if not archive.get("constants.pkl") and not archive.get("model.json"):
        return []  # it opens with constants.pkl (legacy: model.json), or raises
    out = []
    for e, name in archive.under():
        if name in _JIT_PICKLES or (name.startswith(b"code/") and name.endswith(b".debug_pkl")):
            out.append(Region(e, "pickle", (JIT_LOAD,)))
        elif name.startswith(b"code/") and name.endswith(b".py"):
            out.append(Region(e, "code", (JIT_LOAD,)))
    return out


def lite_load_regions(entries: Sequence[ZipEntry]) -> list[Region]:
    """The records ``_load_for_lite_interpreter`` unpickles (module docstring):
    ``bytecode.pkl`` as ``bytecode``, ``constants.pkl``, ``data.pkl`` and the debug
    pickles, all case folded; none in an archive without ``bytecode.pkl``."""
    archive = _Archive(entries)
    if not archive.get("bytecode.pkl"):
        return []  # _load_for_mobile opens with bytecode.pkl, or raises
    out = []
    for e, name in archive.under():
        if name == b"bytecode.pkl":
            out.append(Region(e, "bytecode", (LITE_LOAD,)))
        elif name in _LITE_PICKLES or name.endswith(b".debug_pkl"):
            out.append(Region(e, "pickle", (LITE_LOAD,)))
    return out


def _truthy(value: object) -> bool:
    return bool(value)


def _config(archive: _Archive, name: str, read: Reader) -> dict[str, dict[str, object]] | str:
    """A payload config's entries, or why they cannot be read."""
    found = archive.get(name)
    if not found:
        return f"{name} cannot be found"
    entries: dict[str, dict[str, object]] = {}
    for entry in found:  # names equal but for case: torch reads one of them
        raw = read(entry)
        if raw is None:
            return f"{entry.name} cannot be read (or is over Limits.max_pickle_bytes)"
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            return f"{entry.name} is not JSON ({exc})"
        config = doc.get("config") if isinstance(doc, dict) else None
        if not isinstance(config, dict) or not all(
                isinstance(m, dict) and isinstance(m.get("path_name"), str)
                for m in config.values()):
            return f"{entry.name} is not a payload config"
        entries.update((f"{entry.name}:{k}", v) for k, v in config.items())
    return entries


def export_load_regions(entries: Sequence[ZipEntry], read: Reader,
                        ) -> tuple[list[Region], list[str]]:
    """The records ``torch.export.load`` hands to ``torch.load``, unpickles or loads as
    native code (module docstring), and why the model had to guess (a config it could not
    read: then every record is listed as ``file``)."""
    archive = _Archive(entries)
    out: list[Region] = []
    why: list[str] = []

    def add(found: Iterable[ZipEntry], how: How) -> None:
        out.extend(Region(e, how, (EXPORT_LOAD,)) for e in found)

    if archive.get("archive_format"):
        listed = set(archive.listed)
        for name in archive.listed:
            if not name.startswith("models/"):
                continue
            model = name[len("models/"):-len(".json")]
            add(archive.get(f"data/sample_inputs/{model}.pt"), "file")
            for folder, kind in (("data/weights/", "weights"), ("data/constants/", "constants")):
                legacy = f"{folder}{model}.pt"
                if legacy in listed:
                    add(archive.get(legacy), "file")
                    continue
                config = _config(archive, f"{folder}{model}_{kind}_config.json", read)
                if isinstance(config, str):
                    why.append(config)
                    continue
                for meta in config.values():
                    path = str(meta["path_name"])
                    record = posixpath.join(folder, path)
                    if kind == "constants" and path.startswith("opaque_obj_"):
                        add(archive.get(record), "pickle")
                    elif (kind == "constants" and path.startswith("custom_obj_")) or (
                            _truthy(meta.get("use_pickle"))
                            and (kind == "weights" or path.startswith("tensor_"))):
                        add(archive.get(record), "file")
        for e, folded in archive.under():
            if folded.startswith(b"data/aotinductor/") and folded.endswith(_NATIVE):
                out.append(Region(e, "native", (EXPORT_LOAD,)))
    if any(e.name == "version" for e in entries):  # the old format, read by zipfile
        add((e for e in entries if e.name in _OLD_EXPORT), "file")
    if why:
        done = {id(r.entry) for r in out}
        add((e for e in entries if id(e) not in done and not e.name.endswith("/")), "guess")
    return out, why


def zip_regions(entries: Sequence[ZipEntry], read: Reader) -> ZipModel:
    """Every loader's regions in one archive, merged: one :class:`Region` per record and
    way of reading, naming every loader that reads it that way; and the pickle-named
    records none reads.

    ``read`` gives a record's bytes (the payload configs; bounded by the caller, None when
    unreadable).
    """
    merged: dict[tuple[int, How], list[str]] = {}
    by_id = {id(e): e for e in entries}
    exported, why = export_load_regions(entries, read)
    for region in [*torch_load_regions(entries), *jit_load_regions(entries),
                   *lite_load_regions(entries), *exported]:
        loaders = merged.setdefault((id(region.entry), region.how), [])
        loaders.extend(x for x in region.loaders if x not in loaders)
    order = {id(e): i for i, e in enumerate(entries)}
    regions = [Region(by_id[key], how, tuple(sorted(loaders, key=_LOADER_ORDER.index)))
               for (key, how), loaders in sorted(merged.items(), key=lambda kv: order[kv[0][0]])]
    read_ids = {id(r.entry) for r in regions}
    unread = [e for e in entries if id(e) not in read_ids and fold(e.name).endswith(_PICKLE_SUFFIXES)]
    archive = _Archive(entries)
    return ZipModel(regions, unread, why, jit=bool(archive.get("constants.pkl")
                                                   or archive.get("bytecode.pkl")))


_LOADER_ORDER: Final = (TORCH_LOAD_UNSAFE, TORCH_LOAD, JIT_LOAD, LITE_LOAD, EXPORT_LOAD)
