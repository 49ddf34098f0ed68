"""``.pt`` → ``.npz`` with numpy's own writer, one member at a time.

Every tensor is a member ``<dotted name>.npy`` (``np.load(f)[name]``).  Dtypes numpy
holds only through ``ml_dtypes`` (bfloat16 and the float8 family) are written as
their **raw bits** by default: a ``uint16`` (bfloat16) or ``uint8`` (float8) array,
and the dtype in the notes; ``upcast=True`` (``ptfile convert --npz-upcast``) widens
them to float32 instead, which holds every value exactly.  Dtypes with no numpy
equivalent at all (complex32, bits*, sub-byte types) are refused.

Shared storages follow the same :data:`~ptfile.export.safetensors.SharedPolicy` as a
``.safetensors`` output: ``"dedupe"`` writes a tied tensor (the same view of one
storage) once and records the alias, ``"copy"`` writes every name, ``"error"``
refuses.

**The notes.**  Whatever a plain ``np.load`` would not know is in one more member,
``__ptfile__``: a 0-d str array holding a JSON object, present only when there is
something to note::

    {"dtypes": {name: "bfloat16", ...},     # raw bits: view the array as this dtype
     "upcast": {name: "bfloat16", ...},     # widened to float32 from this dtype
     "aliases": {alias: kept, ...},         # not written: the same data as ``kept``
     "values": {name: value, ...}}          # non-tensor values (:mod:`.values`)

The dtype names are ``ml_dtypes``' (the same as torch's).  To rebuild::

    import json, ml_dtypes, numpy as np
    with np.load("model.npz") as z:
        notes = json.loads(z["__ptfile__"].item()) if "__ptfile__" in z else {}
        arrays = {k: z[k] for k in z.files if k != "__ptfile__"}
    for name, dtype in notes.get("dtypes", {}).items():
        arrays[name] = arrays[name].view(getattr(ml_dtypes, dtype))
    for alias, kept in notes.get("aliases", {}).items():
        arrays[alias] = arrays[kept]
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable, Mapping
from typing import Any, Final

import numpy as np

from .._io.atomic import atomic_file
from ..errors import SaveError, UnsupportedFeatureError
from ..model.tensor import Tensor
from .safetensors import SharedPolicy, plan

__all__ = ["NOTES", "dump_npz"]

#: The member (and ``np.load`` key) holding the notes.
NOTES: Final = "__ptfile__"
#: The unsigned integer type of each width, for raw bits.
_RAW: Final = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def _array(t: Tensor, name: str, upcast: bool, notes: dict[str, dict[str, Any]]
           ) -> np.ndarray[Any, Any]:
    if t.dtype.numpy is None:
        raise UnsupportedFeatureError(f"tensor {name!r}: numpy has no {t.dtype!r}")
    array = t.numpy()
    if array.dtype.kind == "V" or array.dtype.type.__module__.startswith("ml_dtypes"):
        if upcast:
            notes["upcast"][name] = t.dtype.name
            return array.astype(np.float32)
        raw = _RAW.get(array.dtype.itemsize)
        if raw is None:
            raise UnsupportedFeatureError(f"tensor {name!r}: no raw-bits form for {t.dtype!r}; "
                                          "upcast=True widens it to float32")
        notes["dtypes"][name] = t.dtype.name
        return np.asarray(array, order="C").view(raw)
    return array


def dump_npz(tensors: Mapping[str, Tensor], path: str | os.PathLike[str], *,
             shared: SharedPolicy = "dedupe", upcast: bool = False,
             values: Mapping[str, object] | None = None,
             progress: Callable[[int], None] | None = None) -> dict[str, dict[str, Any]]:
    """Write ``tensors`` as an ``.npz`` (``np.load`` reads it; keys are the dotted names);
    return the notes (module docstring; empty parts included).

    ``values`` (JSON-able, :func:`ptfile.export.values.split_values`) go into the notes.

    Raises
    ------
    UnsupportedFeatureError
        A dtype numpy cannot represent.
    SaveError
        Shared storages under ``shared="error"``; a tensor named ``__ptfile__``.

    Examples
    --------
    >>> import numpy as np, ptfile, tempfile, os
    >>> s = ptfile.Storage(memoryview(np.ones(2, "f4")), ptfile.DTYPES["float32"])
    >>> tmp = tempfile.TemporaryDirectory()
    >>> out = os.path.join(tmp.name, "w.npz")
    >>> dump_npz({"w": ptfile.Tensor(s, 0, (2,), (1,))}, out)["dtypes"]
    {}
    >>> np.load(out)["w"].tolist()
    [1.0, 1.0]
    >>> tmp.cleanup()
    """
    if NOTES in tensors:
        raise SaveError(f"a tensor is named {NOTES!r}, the .npz member that holds ptfile's notes")
    notes: dict[str, dict[str, Any]] = {"dtypes": {}, "upcast": {},
                                        "aliases": plan(tensors, shared),
                                        "values": dict(values or {})}
    with (atomic_file(os.fspath(path), fsync=False) as fp,
          zipfile.ZipFile(fp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf):
        for name, t in tensors.items():
            if name in notes["aliases"]:
                continue
            array = _array(t, name, upcast, notes)
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
            if progress is not None:
                progress(array.nbytes)
        written = {k: v for k, v in notes.items() if v}
        if written:
            with zf.open(f"{NOTES}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.array(json.dumps(written)),
                                          allow_pickle=False)
    return notes
