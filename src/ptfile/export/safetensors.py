"""``.pt`` ⇄ ``.safetensors`` through the ``safetensors`` package (ptfile's ``safetensors`` extra).

Writing goes through ``safetensors.serialize_file`` with ``TensorSpec``
pointers, so mmapped contiguous tensors are written without a copy, and
float8/bfloat16 work (safetensors' numpy helper refuses ml_dtypes arrays).

Shared storages are handled explicitly, as ``safetensors.torch.save_model``
does, by a :data:`SharedPolicy`:

* ``"dedupe"`` (default): tensors that are the *same view* of one storage
  (tied weights) are written once; the other names are listed in the file's
  metadata under ``ptfile.aliases`` (JSON ``{alias: kept}``).  Partly
  overlapping views are written as separate contiguous copies.
* ``"copy"``: every name is written, duplicates included.
* ``"error"``: any two names sharing a storage raise :class:`~ptfile.SaveError`.

Reading maps the file and reads its header with the one safetensors header reader
(:mod:`ptfile.formats.safetensors`, which checks every offset), so each tensor is a
zero-copy view.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, Literal

import numpy as np

from .._io.atomic import atomic_file, atomic_path
from .._io.local import MmapSource
from ..errors import FormatError, SaveError, UnsupportedFeatureError
from ..formats.safetensors import CODES, read_header, to_tensors
from ..model.tensor import Tensor

__all__ = ["SharedPolicy", "convert_sharded", "dump", "load_safetensors"]

SharedPolicy = Literal["dedupe", "copy", "error"]
#: The dtypes written (the codes are :mod:`ptfile.formats.safetensors`'s, with the one
#: header reader; CODES stays importable from here for the writers that use it).
WRITABLE: Final = frozenset(CODES.values())


def _safetensors() -> Any:
    try:
        import safetensors
    except ImportError as exc:
        raise UnsupportedFeatureError("converting to safetensors needs the safetensors "
                                      "package: pip install safetensors (ptfile's safetensors extra)") from exc
    return safetensors


def _contiguous(t: Tensor, name: str) -> np.ndarray[Any, Any]:
    if t.dtype.name not in WRITABLE:
        raise UnsupportedFeatureError(f"tensor {name!r}: safetensors cannot hold {t.dtype!r}")
    array = t.numpy()
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.asarray(array, order="C")  # not np.ascontiguousarray: it makes 0-d arrays 1-d


def _view_key(t: Tensor) -> tuple[int, int, tuple[int, ...], tuple[int, ...], str]:
    return (id(t.storage), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype.name)


def plan(tensors: Mapping[str, Tensor], shared: SharedPolicy = "dedupe") -> dict[str, str]:
    """Names to drop as aliases (``{alias: kept}``) under the shared-storage policy.

    Raises
    ------
    SaveError
        ``shared="error"`` and two names share a storage.

    Examples
    --------
    >>> import numpy as np, ptfile
    >>> s = ptfile.Storage(memoryview(np.zeros(2, "f4")), ptfile.DTYPES["float32"])
    >>> t = ptfile.Tensor(s, 0, (2,), (1,))
    >>> plan({"a": t, "b": t})
    {'b': 'a'}
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
        first: dict[tuple[Any, ...], str] = {}
        for name in names:
            kept = first.setdefault(_view_key(tensors[name]), name)
            if kept != name:
                aliases[name] = kept
    return aliases


def dump(tensors: Mapping[str, Tensor], path: str | os.PathLike[str], *,
         shared: SharedPolicy = "dedupe", metadata: Mapping[str, str] | None = None) -> dict[str, str]:
    """Write ``tensors`` as one ``.safetensors`` file; return the aliases dropped.

    Parameters
    ----------
    tensors
        Dotted names → ptfile tensors with data (e.g. from :func:`ptfile.open`).
    path
        The output file.
    shared
        The shared-storage policy (module docstring).
    metadata
        Extra header metadata; ``format: pt`` is added as transformers expects.

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
    st = _safetensors()
    aliases = plan(tensors, shared)
    keep: list[np.ndarray[Any, Any]] = []
    specs = {}
    for name, t in tensors.items():
        if name in aliases:
            continue
        array = _contiguous(t, name)
        keep.append(array)
        specs[name] = st.TensorSpec(dtype=t.dtype.name, shape=list(array.shape),
                                    data_ptr=array.ctypes.data, data_len=array.nbytes)
    meta = {"format": "pt", **(metadata or {})}
    if aliases:
        meta["ptfile.aliases"] = json.dumps(aliases, sort_keys=True)
    with atomic_path(os.fspath(path)) as tmp:  # safetensors writes to a path of its own
        st.serialize_file(specs, tmp, metadata=meta)
    del keep
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


def convert_sharded(index: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                    shared: SharedPolicy = "dedupe",
                    convert_shard: Callable[[str, str, str], dict[str, str]],
                    on_shard: Callable[[str], None] | None = None) -> str:
    """Convert a sharded checkpoint shard by shard (bounded memory); return the new index path.

    ``index`` is ``pytorch_model.bin.index.json`` (→ safetensors) or
    ``model.safetensors.index.json`` (→ ``.bin``).  ``convert_shard(src, dst,
    to)`` converts one file and returns the aliases it dropped; dropped names
    leave the new ``weight_map``.

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
    renamed: dict[str, str] = {}
    dropped: set[str] = set()
    for shard in dict.fromkeys(weight_map.values()):
        renamed[shard] = shard_name(shard, to)
        dropped |= set(convert_shard(os.path.join(folder, shard),
                                     os.path.join(out, renamed[shard]), to))
        if on_shard is not None:
            on_shard(shard)
    new_map = {k: renamed[v] for k, v in weight_map.items() if k not in dropped}
    total = sum(os.path.getsize(os.path.join(out, f)) for f in set(new_map.values()))
    name = "model.safetensors.index.json" if to == "safetensors" else "pytorch_model.bin.index.json"
    target = os.path.join(out, name)
    with atomic_file(target, fsync=False) as fp:
        fp.write(json.dumps({"metadata": {"total_size": total}, "weight_map": new_map},
                            indent=2).encode("utf-8"))
    return target


def iter_shards(index: str) -> Iterator[str]:
    """The shard files an index names, in first-use order."""
    yield from dict.fromkeys(_read_index(index).values())
