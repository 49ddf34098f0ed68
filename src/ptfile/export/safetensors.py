"""``.pt`` ⇄ ``.safetensors``: one file, or a Hugging Face sharded checkpoint shard by shard.

Writing goes through ptfile's one safetensors writer
(:mod:`ptfile.formats.safetensors.writer`: tensor by tensor, byte for byte what the
``safetensors`` package writes; the package is not needed), so mmapped tensors are
written one at a time and every dtype safetensors has works (bfloat16, float8).

Shared storages are handled explicitly, as ``safetensors.torch.save_model``
does, by a :data:`SharedPolicy`:

* ``"dedupe"`` (default): tensors that are the *same view* of one storage
  (tied weights) are written once, under the name of the group that sorts first
  (``save_model``'s ``sorted(names)[0]``: ``lm_head.weight`` before
  ``model.embed_tokens.weight``), whatever order the names come in; the other names
  are listed in the file's metadata under ``ptfile.aliases`` (JSON ``{alias: kept}``,
  :mod:`ptfile.formats.safetensors.meta`), and ptfile's readers tie them again.
  Partly overlapping views are written as separate contiguous copies.
* ``"copy"``: every name is written, duplicates included (for readers that do not
  read ``ptfile.aliases``).
* ``"error"``: any two names sharing a storage raise :class:`~ptfile.SaveError`.

A sharded checkpoint (:func:`convert_sharded`) converts shard by shard; ties lie
within a shard (each shard is a file of its own), so each shard's file declares its
own aliases.  The new index's ``weight_map`` lists the names each shard file holds
(what a reader of ``safetensors.safe_open`` finds there: under ``"dedupe"``, the
stored names only), and its ``metadata`` holds ``total_size`` (the tensors' bytes, as
``huggingface_hub`` counts them) and every shard's aliases under ``ptfile.aliases``.

Reading maps the file and reads its header with the one safetensors header reader
(:mod:`ptfile.formats.safetensors`, which checks every offset), so each tensor is a
zero-copy view.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np

from .._io.local import MmapSource
from ..errors import FormatError, SaveError
from ..formats.safetensors import CODES, read_header, to_tensors
from ..formats.safetensors.meta import ALIASES
from ..formats.safetensors.writer import Planned, save_file, save_index
from ..model.tensor import Tensor

__all__ = ["Shard", "SharedPolicy", "convert_sharded", "dump", "load_safetensors"]

SharedPolicy = Literal["dedupe", "copy", "error"]
#: The dtypes written (the codes are :mod:`ptfile.formats.safetensors`'s, with the one
#: header reader; CODES stays importable from here for the writers that use it).
WRITABLE: Final = frozenset(CODES.values())


def _contiguous(t: Tensor) -> np.ndarray[Any, Any]:
    """The tensor's values, C-contiguous and little-endian."""
    array = t.numpy()
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.asarray(array, order="C")  # not np.ascontiguousarray: it makes 0-d arrays 1-d


def _view_key(t: Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...], str]:
    return (id(t.storage), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype.name)


def plan(tensors: Mapping[str, Tensor], shared: SharedPolicy = "dedupe") -> dict[str, str]:
    """Names to drop as aliases (``{alias: kept}``) under the shared-storage policy: of
    the names of one view of one storage, the one that sorts first is kept.

    Raises
    ------
    SaveError
        ``shared="error"`` and two names share a storage.

    Examples
    --------
    >>> import numpy as np, ptfile
    >>> s = ptfile.Storage(memoryview(np.zeros(2, "f4")), ptfile.DTYPES["float32"])
    >>> t = ptfile.Tensor(s, 0, (2,), (1,))
    >>> plan({"embed": t, "head": t, "b": ptfile.Tensor(s, 1, (1,), (1,))})
    {'head': 'embed'}
    """
    by_storage: dict[int, list[str]] = {}
    for name, t in tensors.items():
        if t.storage is not None:
            by_storage.setdefault(id(t.storage), []).append(name)
    groups = [names for names in by_storage.values() if len(names) > 1]
    if shared == "error" and groups:
        raise SaveError(f"tensors share storage: {groups[0]}; safetensors cannot express "
                        "sharing (use shared='dedupe' or 'copy')")
    if shared == "copy":
        return {}
    aliases: dict[str, str] = {}
    for names in groups:
        views: dict[tuple[Any, ...], list[str]] = {}
        for name in names:
            views.setdefault(_view_key(tensors[name]), []).append(name)
        for same in views.values():
            kept, *others = sorted(same)
            aliases.update(dict.fromkeys(others, kept))
    return dict(sorted(aliases.items()))


def dump(tensors: Mapping[str, Tensor], path: str | os.PathLike[str], *,
         shared: SharedPolicy = "dedupe", metadata: Mapping[str, str] | None = None) -> dict[str, str]:
    """Write ``tensors`` as one ``.safetensors`` file, one tensor at a time; return the
    aliases dropped.

    Parameters
    ----------
    tensors
        Dotted names → ptfile tensors with data (e.g. from :func:`ptfile.open`).
    path
        The output file.
    shared
        The shared-storage policy (module docstring).
    metadata
        Extra header metadata; ``format: pt`` comes first, as transformers expects.

    Returns
    -------
    dict
        ``{alias: kept}`` for every name not written.

    Raises
    ------
    SaveError, UnsupportedFeatureError
        Shared storages under ``shared="error"``; a dtype safetensors lacks.

    Examples
    --------
    >>> import numpy as np, ptfile, tempfile, os
    >>> s = ptfile.Storage(memoryview(np.ones(2, "f4")), ptfile.DTYPES["float32"])
    >>> tmp = tempfile.TemporaryDirectory()
    >>> out = os.path.join(tmp.name, "w.safetensors")
    >>> dump({"w": ptfile.Tensor(s, 0, (2,), (1,))}, out)
    {}
    >>> tmp.cleanup()
    """
    aliases = plan(tensors, shared)
    planned = [Planned(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()
               if name not in aliases]
    meta = {"format": "pt", **(metadata or {})}
    if aliases:
        meta[ALIASES] = json.dumps(aliases, sort_keys=True)
    save_file(path, planned, lambda p: _contiguous(tensors[p.name]), meta)
    return aliases


# --------------------------------------------------------------------------- reading


def load_safetensors(path: str | os.PathLike[str]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors (zero-copy views of a read-only map) and metadata of a ``.safetensors`` file.

    Raises
    ------
    FormatError, LimitExceededError, UnsupportedFeatureError
        A damaged header, offsets outside the file, or an unknown dtype.

    Examples
    --------
    >>> import numpy as np, ptfile, tempfile, os
    >>> s = ptfile.Storage(memoryview(np.ones(2, "f4")), ptfile.DTYPES["float32"])
    >>> tmp = tempfile.TemporaryDirectory()
    >>> out = os.path.join(tmp.name, "w.safetensors")
    >>> _ = dump({"w": ptfile.Tensor(s, 0, (2,), (1,))}, out)
    >>> load_safetensors(out)[0]["w"].numpy().tolist()
    [1.0, 1.0]
    >>> tmp.cleanup()
    """
    source = MmapSource(path, "r")
    header = read_header(source)
    data = source.view(header.data_start, header.data_size, "the safetensors data")
    return to_tensors(header, data), dict(header.metadata or {})


# --------------------------------------------------------------------------- sharded


def shard_name(name: str, to: str) -> str:
    """Hugging Face's shard naming: ``pytorch_model-00001-of-00002.bin`` ⇄ ``model-…safetensors``.

    Examples
    --------
    >>> shard_name("pytorch_model-00001-of-00002.bin", "safetensors")
    'model-00001-of-00002.safetensors'
    >>> shard_name("model-00001-of-00002.safetensors", "pt")
    'pytorch_model-00001-of-00002.bin'
    """
    stem = name.rsplit(".", 1)[0]
    if to == "safetensors":
        return stem.replace("pytorch_model", "model", 1) + ".safetensors"
    return ("pytorch_" + stem if stem.startswith("model") else stem) + ".bin"


def _read_index(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as fp:
            index = json.load(fp)
    except ValueError as exc:
        raise FormatError(f"{path}: not a JSON index: {exc}") from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and "/" not in v and v not in ("", ".", "..")
            for k, v in weight_map.items()):
        raise FormatError(f"{path}: weight_map must map names to shard file names")
    return weight_map


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard converted: the names its new file holds, the aliases it declares
    (``{alias: kept}``, names stored once under ``kept``), and its tensors' bytes."""

    names: Sequence[str]
    aliases: Mapping[str, str]
    nbytes: int


def convert_sharded(index: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                    convert_shard: Callable[[str, str, str], Shard],
                    on_shard: Callable[[str], None] | None = None) -> str:
    """Convert a sharded checkpoint shard by shard (bounded memory); return the new index path.

    ``index`` is ``pytorch_model.bin.index.json`` (→ safetensors) or
    ``model.safetensors.index.json`` (→ ``.bin``).  ``convert_shard(src, dst, to)``
    converts one file and says what the new file holds (:class:`Shard`).  The new
    index (module docstring) lists each name under the file that holds it, in the old
    index's order (names it did not list after them), with every alias a safetensors
    shard declares under ``ptfile.aliases`` in its ``metadata``.

    Raises
    ------
    FormatError
        The index is not a Hugging Face index.
    """
    index = os.fspath(index)
    to = "pt" if index.endswith(".safetensors.index.json") else "safetensors"
    weight_map = _read_index(index)
    folder, out = os.path.dirname(index), os.fspath(out_dir)
    os.makedirs(out, exist_ok=True)
    holder: dict[str, str] = {}
    aliases: dict[str, str] = {}
    total = 0
    for shard in dict.fromkeys(weight_map.values()):
        renamed = shard_name(shard, to)
        done = convert_shard(os.path.join(folder, shard), os.path.join(out, renamed), to)
        holder.update(dict.fromkeys(done.names, renamed))
        aliases.update(done.aliases)
        total += done.nbytes
        if on_shard is not None:
            on_shard(shard)
    new_map = {name: holder[name] for name in dict.fromkeys([*weight_map, *holder])
               if name in holder}
    name = "model.safetensors.index.json" if to == "safetensors" else "pytorch_model.bin.index.json"
    target = os.path.join(out, name)
    declared = {ALIASES: dict(sorted(aliases.items()))} if aliases and to == "safetensors" else {}
    save_index(target, new_map, total, declared)
    return target


def iter_shards(index: str) -> Iterator[str]:
    """The shard files an index names, in first-use order."""
    yield from dict.fromkeys(_read_index(index).values())
