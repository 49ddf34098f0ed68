"""``.pt`` → ``.npz`` with numpy's own writer, one member at a time.

Dtypes numpy cannot load without ``ml_dtypes`` (bfloat16, the float8
family) are widened to float32, which holds them exactly; dtypes with no numpy
equivalent at all (complex32, bits*, sub-byte types) are refused.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import UnsupportedFeatureError
from ..tensor import Tensor

__all__ = ["dump_npz"]


def _array(t: Tensor, name: str) -> np.ndarray[Any, Any]:
    if t.dtype.numpy is None:
        raise UnsupportedFeatureError(f"tensor {name!r}: numpy has no {t.dtype!r}")
    array = t.numpy()
    if array.dtype.kind == "V" or array.dtype.type.__module__.startswith("ml_dtypes"):
        array = array.astype(np.float32)
    return array


def dump_npz(tensors: Mapping[str, Tensor], path: str | os.PathLike[str], *,
             progress: Callable[[int], None] | None = None) -> None:
    """Write ``tensors`` as an ``.npz`` (``np.load`` reads it; keys are the dotted names).

    Raises
    ------
    UnsupportedFeatureError
        A dtype numpy cannot represent.

    Examples
    --------
    >>> import numpy as np, ptfile, tempfile, os
    >>> s = ptfile.Storage(memoryview(np.ones(2, "f4")), ptfile.DTYPES["float32"])
    >>> out = os.path.join(tempfile.mkdtemp(), "w.npz")
    >>> dump_npz({"w": ptfile.Tensor(s, 0, (2,), (1,))}, out)
    >>> np.load(out)["w"].tolist()
    [1.0, 1.0]
    """
    with zipfile.ZipFile(os.fspath(path), "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, t in tensors.items():
            array = _array(t, name)
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
            if progress is not None:
                progress(array.nbytes)
