"""``ptfile convert``: pick the conversion from the file names, one file or one shard at a time
(a DCP directory: one tensor at a time, :mod:`ptfile.dcp.consolidate`).

Nothing is changed or left out without a word: the summary :func:`convert` returns
(and ``ptfile convert`` prints, or gives with ``--json``; bulk convert's records carry
it) has ``aliases``, ``dropped`` and ``changed`` (:class:`~ptfile.export.values.Changes`).

* ``.pt`` → ``.pt`` writes the whole object as it was read: nothing is dropped.  With
  ``structural`` (a pickle of objects ptfile only stands in for), the tensors are
  written under their dotted names with the values beside them (a flat dict); a
  whole pickled module gives its ``state_dict()`` (the module itself is listed as
  dropped), and each stand-in object is listed as dropped.
* → ``.safetensors``: non-tensor values go into the header's ``__metadata__`` as JSON
  texts under their dotted names, listed in ``ptfile.values``, beside ``format: pt``
  (:mod:`ptfile.export.values`); values JSON cannot hold are dropped.  Tied tensors
  are stored once (``ptfile.aliases``, the name that sorts first kept).  An object that
  is not a flat state dict keeps its nesting in ``ptfile.structure``; what that cannot
  keep is reported (``key-as-text``, ``container-as-base``, ``flattened``; a tensor whose
  dotted name an earlier one took, dropped).  What the round trip keeps, and the
  reading rule, are :mod:`ptfile.formats.safetensors.meta`'s.
* → ``.npz``: bfloat16 and float8 tensors as their raw bits (uint16/uint8) with the
  dtype in the ``__ptfile__`` notes, or widened to float32 with ``npz_upcast``; tied
  tensors stored once; values in the notes (:mod:`ptfile.export.npz`).
* from ``.safetensors``: the file is read as :func:`ptfile.load` reads it (ptfile's own
  metadata gives back the object written: values, ties, nesting); other
  ``__metadata__`` entries (``format`` aside) carry over to a ``.safetensors`` output
  and are listed as dropped (``__metadata__.<key>``) for the others.
* a sharded checkpoint (``*.index.json``): each shard as one file; the new index lists
  the names each new file holds, and its ``metadata`` the aliases
  (:mod:`ptfile.export.safetensors`); the summary's ``aliases`` are every shard's.
* A DCP directory's non-tensor items have no place in a ``.safetensors`` output or an
  HF folder: they are listed as dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from .. import api
from .._io.local import FileSource
from .._io.paths import is_path, is_url
from .._io.remote import StorageOptions, open_target
from ..allowlist.structural import is_module
from ..dcp.consolidate import convert_dcp
from ..errors import FormatError, UnsupportedFeatureError
from ..formats.inputs import Input, InputKind, resolve_input
from ..formats.safetensors import read_header
from ..formats.safetensors.meta import OWN, STRUCTURE, VALUES, outline_text
from ..model.tensor import Tensor
from ..model.tree import flatten
from ..reader import open as open_checkpoint
from .npz import NOTES, dump_npz
from .safetensors import Shard, SharedPolicy, convert_sharded, dump
from .values import Changes, header_values, split_values, type_name

__all__ = ["convert", "describe", "target_kind"]

#: Output suffix → output kind.
SUFFIXES = {".safetensors": "safetensors", ".npz": "npz", ".pt": "pt", ".pth": "pt",
            ".bin": "pt", ".ckpt": "pt"}


def target_kind(output: str, source: str | Input,
                storage_options: StorageOptions = None) -> str:
    """The kind to write, from the output's suffix (or the index being converted).

    ``source`` is the input's record (:func:`~ptfile.formats.inputs.resolve_input`; a
    path or URL is resolved now, with ``storage_options``).  A checkpoint folder
    converts to ``pt``, ``safetensors`` or ``hf`` (a folder of safetensors shards with
    an index); an index file to the other form's shards, as before.

    Raises
    ------
    UnsupportedFeatureError
        Neither name says what to write.

    Examples
    --------
    >>> target_kind("model.safetensors", "model.pt")
    'safetensors'
    >>> import json, os, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> index = os.path.join(tmp.name, "pytorch_model.bin.index.json")
    >>> with open(index, "w") as fp:
    ...     json.dump({"weight_map": {"w": "pytorch_model-00001-of-00001.bin"}}, fp)
    >>> target_kind("out/", index)  # .bin shards to safetensors shards
    'safetensors'
    >>> tmp.cleanup()
    """
    record = resolve_input(source, storage_options)
    if record.from_index and _dcp_kind(output) == "hf":  # shards to shards, the other form
        return "pt" if record.kind is InputKind.SHARDS else "safetensors"
    if record.is_folder:  # a checkpoint folder: .pt, .safetensors or an HF folder
        return _dcp_kind(output)
    kind = SUFFIXES.get(os.path.splitext(output)[1].lower())
    if kind is None:
        raise UnsupportedFeatureError(f"cannot tell what to write from {output!r}; "
                                      "use --to safetensors|npz|pt")
    return kind


def _dcp_kind(dst: str) -> str:
    """``pt``, ``safetensors`` or ``hf`` (a folder: a trailing separator, an existing
    directory, or no suffix)."""
    if dst.endswith(("/", os.sep)) or os.path.isdir(dst) or not os.path.splitext(dst)[1]:
        return "hf"
    kind = SUFFIXES.get(os.path.splitext(dst)[1].lower())
    if kind not in ("pt", "safetensors"):
        raise UnsupportedFeatureError(f"a DCP checkpoint converts to .pt, .safetensors or a "
                                      f"folder, not {dst!r}")
    return kind


def _carried(src: str, to: str, storage_options: StorageOptions, changes: Changes
             ) -> dict[str, str]:
    """The ``__metadata__`` entries of the safetensors file ``src`` that are neither
    ptfile's own nor values: carried over to a ``.safetensors`` output, listed as dropped
    for the others."""
    with open_checkpoint(src, storage_options=storage_options) as ck:
        meta = ck.metadata()
    values = _listed_values(meta)
    other = {k: v for k, v in meta.items() if k not in OWN and k not in values}
    if to != "safetensors":
        for key, value in other.items():
            changes.drop(f"__metadata__.{key}", type_name(value),
                         f"safetensors header metadata: a .{to} has no place for it")
    return other


def _listed_values(meta: dict[str, str]) -> set[str]:
    """The names ``ptfile.values`` lists (none when it is not a JSON list of names)."""
    try:
        names = json.loads(meta.get(VALUES, "[]"))
    except (ValueError, RecursionError):
        return set()
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def _from_checkpoint(src: str, storage_options: StorageOptions, structural: bool,
                     as_json: bool, changes: Changes
                     ) -> tuple[dict[str, Tensor], dict[str, object], list[str], object]:
    """The tensors of a checkpoint, with their data, its values (:mod:`.values`), the
    names of those holding a tuple, and the object (None for a pickled module, which is
    converted as its state dict)."""
    with open_checkpoint(src, storage_options=storage_options, structural=structural) as ck:
        tensors = ck.load_tensors()
        obj = ck.object
    if is_module(obj):
        changes.drop("", type_name(obj), "a pickled module: only its state_dict() is converted")
        return tensors, {}, [], None
    values, with_tuples = split_values(obj, tensors, changes, as_json=as_json)
    return tensors, values, with_tuples, obj


#: What :func:`_structure` reports for each note of :func:`outline_text`: a change, or
#: (as a tuple) a drop with its type and reason.
_NOTES: Final[dict[str, str | tuple[str, str]]] = {
    "key-as-text": "key-as-text", "container-as-base": "container-as-base",
    "name-taken": ("Tensor", "an earlier tensor has the same dotted name"),
    "reached-twice": ("container", "a container met again under another name (kept once)"),
}


def _structure(obj: object, tensors: dict[str, Tensor], texts: dict[str, str],
               changes: Changes) -> str | None:
    """The ``ptfile.structure`` of a ``.safetensors`` output (None for a state dict or a
    pickled module); what it cannot keep goes into ``changes``."""
    if obj is None:
        return None
    notes: list[tuple[str, str]] = []
    try:
        text = outline_text(obj, tensors, texts, notes)
    except FormatError:
        changes.change("flattened", [""])
        return None
    for note, name in notes:
        how = _NOTES[note]
        if isinstance(how, str):
            changes.change(how, [name])
        else:
            changes.drop(name, *how)
    return text


def convert_file(src: str, dst: str, to: str, shared: SharedPolicy = "dedupe",
                 counted: list[int] | None = None, storage_options: StorageOptions = None,
                 structural: bool = False, npz_upcast: bool = False) -> Changes:
    """Convert one file; return what was left out or changed (module docstring).

    ``src`` and ``dst`` may be URLs (``storage_options`` for both): a URL source
    is fetched with range requests, a URL target is written through its fsspec
    backend (a ``.safetensors``/``.npz`` one is written locally first, then
    uploaded; nothing partial is left on failure).  The number of tensors
    converted is appended to ``counted`` when given.  ``structural`` reads a pickle
    that names globals outside the weights-only allowlist (a whole pickled
    module: its state dict is converted) with inert stand-ins.  ``npz_upcast``
    widens bfloat16/float8 to float32 in an ``.npz`` (default: raw bits).

    Raises
    ------
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, SaveError
        From reading ``src`` or writing ``dst``.
    RemoteError
        A URL could not be read or written.
    """
    changes = Changes()
    other = _carried(src, to, storage_options, changes) if src.endswith(".safetensors") else {}
    if to == "pt" and not structural:  # the whole object: nothing is left out
        obj = api.load(src, mmap=is_path(src), storage_options=storage_options)
        api.save(obj, dst, storage_options=storage_options)
        if counted is not None:
            counted.append(len(flatten(obj)))
        return changes
    tensors, values, with_tuples, obj = _from_checkpoint(src, storage_options, structural,
                                                         to != "pt", changes)
    if counted is not None:
        counted.append(len(tensors))
    if to == "pt":
        api.save({**tensors, **values}, dst, storage_options=storage_options)
        return changes
    with _staged(dst, storage_options) as path:
        if to == "npz":
            _write_npz(tensors, values, with_tuples, path, shared, npz_upcast, changes)
            return changes
        texts = header_values(values, changes, reserved=OWN | set(other))
        metadata = {**other, **texts}
        if texts:
            metadata[VALUES] = json.dumps(list(texts))
        structure = _structure(obj, tensors, texts, changes)
        if structure is not None:
            metadata[STRUCTURE] = structure
        changes.aliases = dump(tensors, path, shared=shared, metadata=metadata) or {}
        changes.change("json", list(texts), to="__metadata__")
        changes.change("tuple-as-list", [n for n in with_tuples if n in texts])
        return changes


def _write_npz(tensors: dict[str, Tensor], values: dict[str, object], with_tuples: list[str],
               path: str, shared: SharedPolicy, upcast: bool, changes: Changes) -> None:
    notes = dump_npz(tensors, path, shared=shared, upcast=upcast, values=values)
    changes.aliases = notes["aliases"]
    changes.change("json", list(values), to=NOTES)
    changes.change("tuple-as-list", with_tuples)
    for kind, table in (("raw-bits", notes["dtypes"]), ("upcast", notes["upcast"])):
        for dtype in dict.fromkeys(table.values()):
            stored = "float32" if kind == "upcast" else \
                ("uint16" if dtype == "bfloat16" else "uint8")
            changes.change(kind, [n for n, d in table.items() if d == dtype],
                           **{"from": dtype, "to": stored})


def _shard(src: str, dst: str, to: str, shared: SharedPolicy, npz_upcast: bool,
           changes: Changes) -> Shard:
    """Convert one shard of a sharded checkpoint; what its new file holds."""
    done = convert_file(src, dst, to, shared, npz_upcast=npz_upcast)
    changes.merge(done)
    if to == "safetensors":
        with open(dst, "rb") as fp:
            header = read_header(FileSource(fp, dst))
        return Shard(list(header.entries), done.aliases, header.data_size)
    with open_checkpoint(dst) as ck:
        tensors = ck.tensors()
    storages = {id(t.storage): t.storage.nbytes for t in tensors.values() if t.storage}
    return Shard(list(tensors), {}, sum(storages.values()))


@contextlib.contextmanager
def _staged(dst: str, storage_options: StorageOptions) -> Iterator[str]:
    """A local path to write ``dst`` to: itself, or a temporary file uploaded to the URL
    once written."""
    if not is_url(dst):
        yield dst
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, os.path.basename(dst.split("?")[0]) or "output")
        yield path
        with open(path, "rb") as local, open_target(dst, storage_options) as remote:
            shutil.copyfileobj(local, remote, _UPLOAD_CHUNK_BYTES)


#: What one write to an upload target takes at a time.
_UPLOAD_CHUNK_BYTES = 8 << 20


def convert(src: str | Input, dst: str, *, to: str, shared: SharedPolicy = "dedupe",
            on_step: Callable[[int], None] | None = None,
            storage_options: StorageOptions = None, structural: bool = False,
            npz_upcast: bool = False, zero: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Convert ``src`` to ``dst`` as ``to``; a ``*.index.json`` source converts every shard.

    Returns
    -------
    dict
        A summary: output, kind, tensors, shards, aliases, dropped, changed (module
        docstring; :func:`describe` words it).

    A DCP directory converts tensor by tensor (:mod:`ptfile.dcp.consolidate`) to ``to``
    ``"pt"``, ``"safetensors"`` or ``"hf"`` (a sharded folder), and so does a DeepSpeed
    ZeRO folder (:mod:`ptfile.zero.convert`), with ``zero``'s options (``tag``,
    ``exclude_frozen``, ``dtype``: :func:`ptfile.zero.convert.convert_zero`'s).

    Raises
    ------
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, SaveError
        From reading or writing.
    """
    record = resolve_input(src, storage_options)
    if storage_options is None:  # a record handed in carries its own
        storage_options = record.storage_options
    if record.kind is InputKind.FOLDER:
        raise record.many_files("convert them in bulk (ptfile.bulk.convert, or --out-prefix)")
    if zero and any(v not in (None, False) for v in zero.values()) \
            and record.kind is not InputKind.ZERO:
        raise UnsupportedFeatureError(f"{', '.join(k for k, v in zero.items() if v)}: options "
                                      f"of DeepSpeed ZeRO folders; {record.label} is "
                                      f"{record.kind.value}")
    if record.kind is InputKind.ZERO:
        from ..zero.convert import convert_zero

        options = {k: v for k, v in (zero or {}).items() if v is not None}
        summary = convert_zero(record, dst, to=to, shared=shared, **options)
        if on_step is not None:
            on_step(1)
        return summary
    if record.is_folder:
        summary = _convert_folder(record, dst, to, shared, npz_upcast, on_step)
        if on_step is not None:
            on_step(1)
        return summary
    src = str(record.location)
    counted: list[int] = []
    changes = convert_file(src, dst, to, shared, counted, storage_options, structural,
                           npz_upcast)
    if on_step is not None:
        on_step(1)
    return {"output": dst, "kind": to, "tensors": sum(counted), "shards": 0,
            **changes.to_dict()}


def _convert_folder(record: Input, dst: str, to: str, shared: SharedPolicy,
                    npz_upcast: bool, on_step: Callable[[int], None] | None) -> dict[str, Any]:
    """Convert a checkpoint folder's model: a DCP or safetensors folder tensor by tensor,
    ``.bin`` shards shard by shard (to a folder) or merged (to one file), a trainer
    folder's model part alone (its other parts listed as dropped)."""
    dropped: list[dict[str, str]] = []
    if record.kind is InputKind.TRAINER:
        model = record.part("model")
        if model is None:
            raise FormatError(f"{record.label}: a trainer folder without model weights has "
                              "nothing to convert")
        dropped = [{"name": p.role, "type": ", ".join(p.files),
                    "reason": "not the model: convert writes a trainer folder's model"}
                   for p in record.parts if p is not model]
        record = record.alone(model)
    summary = _convert_model(record, dst, to, shared, npz_upcast, on_step)
    summary["dropped"] = [*dropped, *summary.get("dropped", [])]
    return summary


def _convert_model(record: Input, dst: str, to: str, shared: SharedPolicy,
                   npz_upcast: bool, on_step: Callable[[int], None] | None) -> dict[str, Any]:
    """Convert a model folder (``shards`` or ``model``) to ``to``."""
    part = record.parts[0] if record.parts else None
    to_folder = _dcp_kind(dst) == "hf"
    if part is not None and part.index is not None and to_folder and (
            record.kind is InputKind.MODEL or to == "pt"):
        if is_url(record.location) or is_url(dst):
            raise UnsupportedFeatureError("sharded checkpoints convert between local folders; "
                                          "convert each shard's URL on its own")
        return _convert_index(record.path(part.index), dst, to, shared, npz_upcast, on_step)
    if record.kind.is_dcp_readable:
        return convert_dcp(record, dst, to=to, storage_options=record.storage_options)
    if part is None:
        raise FormatError(f"{record.label}: no model weights to convert")
    if to_folder:  # one model file into a folder, as Hugging Face names it
        os.makedirs(dst, exist_ok=True)
        to = "safetensors" if to == "hf" else to
        dst = os.path.join(dst, "model.safetensors" if to == "safetensors" else
                           "pytorch_model.bin")
    if part.form == "file":
        counted: list[int] = []
        changes = convert_file(record.path(part.files[0]), dst, to, shared, counted,
                               record.storage_options, npz_upcast=npz_upcast)
        return {"output": dst, "kind": to, "tensors": sum(counted), "shards": 0,
                **changes.to_dict()}
    return _convert_merged(record, dst, to, shared)


def _convert_merged(record: Input, dst: str, to: str, shared: SharedPolicy) -> dict[str, Any]:
    """``.bin`` shards merged into one file (the names in the index's order)."""
    from ..sets import open_set

    changes = Changes()
    with open_set(record) as ck:
        tensors = ck.load_tensors()
        if to == "pt":
            api.save(tensors, dst)
        elif to == "safetensors":
            with _staged(dst, record.storage_options) as path:
                changes.aliases = dump(tensors, path, shared=shared) or {}
        else:
            raise UnsupportedFeatureError(f"a sharded model converts to .pt, .safetensors or "
                                          f"a folder, not {to!r}")
    return {"output": dst, "kind": to, "tensors": len(tensors), "shards": 0,
            **changes.to_dict()}


def _convert_index(index: str, dst: str, to: str, shared: SharedPolicy, npz_upcast: bool,
                   on_step: Callable[[int], None] | None) -> dict[str, Any]:
    """Shards to shards of the other form, one shard at a time (bounded memory)."""
    changes = Changes()
    out = convert_sharded(
        index, dst, convert_shard=lambda a, b, kind: _shard(a, b, kind, shared, npz_upcast,
                                                           changes),
        on_shard=lambda _: on_step(1) if on_step else None)
    with open(out, encoding="utf-8") as fp:
        weight_map = json.load(fp)["weight_map"]
    return {"output": out, "kind": f"sharded {to}",
            "tensors": len(set(weight_map) | set(changes.aliases)),
            "shards": len(set(weight_map.values())), **changes.to_dict()}


#: How many names a line of :func:`describe` shows before "and N more".
_SHOWN: Final = 8


def _names(names: list[str]) -> str:
    shown = ", ".join(n or "(the whole object)" for n in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


#: What a ``changed`` group of each kind counts (tensors when not listed).
_COUNTED: Final = {"json": "value", "tuple-as-list": "value", "key-as-text": "entry",
                   "container-as-base": "container", "flattened": "object"}


def describe(summary: dict[str, Any]) -> list[str]:
    """The lines ``ptfile convert`` prints for a summary's ``changed`` and ``dropped``.

    Examples
    --------
    >>> print("".join(describe({
    ...     "changed": [{"change": "json", "to": "__metadata__", "names": ["step"]}],
    ...     "dropped": [{"name": "blob", "type": "bytes", "reason": "JSON cannot hold it"}]})))
      changed: 1 value stored as JSON text in __metadata__: step
      dropped: blob (bytes): JSON cannot hold it
    <BLANKLINE>
    """
    lines = []
    for group in summary.get("changed", []):
        names, change = group["names"], group["change"]
        count = f"{len(names)} {_COUNTED.get(change, 'tensor')}" \
                f"{'' if len(names) == 1 else 's'}"
        what = {"json": f"stored as JSON text in {group.get('to')}",
                "tuple-as-list": "holding tuples, stored as JSON lists",
                "key-as-text": "keyed by other than str, int, float, bool or None: the key "
                               "stored as text",
                "container-as-base": "of a dict, list or tuple subclass, stored as its base",
                "flattened": "nested too deep: stored flat, by dotted name",
                "raw-bits": f"{group.get('from')} stored as {group.get('to')} (raw bits; "
                            f"the dtype is in {NOTES})",
                "upcast": f"{group.get('from')} widened to {group.get('to')}"}.get(change, change)
        lines.append(f"  changed: {count} {what}: {_names(names)}\n")
    lines.extend(f"  dropped: {d['name'] or '(the whole object)'} ({d['type']}): {d['reason']}\n"
                 for d in summary.get("dropped", []))
    return lines
