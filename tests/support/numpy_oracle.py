"""torch as the oracle of numpy values: what torch's weights-only load asks to allowlist, its
two loads, and an exact comparison of numpy values (type, dtype, layout, bits).

Shared by ``test_numpy_globals.py`` and ``test_wild_objects.py``.
"""

from __future__ import annotations

import importlib
import io
import math
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

import ptfile
from oracle import assert_tensor_equal


def torch_asks(path: Path) -> list[str]:
    """The names torch.load(weights_only=True) asks the user to allowlist, one by one."""
    names: list[str] = []
    while True:
        try:
            with torch.serialization.safe_globals([resolve(n) for n in names]):
                torch.load(path, weights_only=True)
        except pickle.UnpicklingError as exc:
            found = re.search(r"GLOBAL (\S+) was not", str(exc)) or \
                re.search(r"but got <class '([^']+)'>", str(exc))
            if found is None:
                raise
            names.append(found.group(1))
            continue
        return names


def resolve(name: str) -> Any:
    module, _, attr = name.rpartition(".")  # torch names builtins without their module
    return getattr(importlib.import_module(module or "builtins"), attr)


def torch_loads(path: Path) -> tuple[Any, Any]:
    """torch's two loads: weights-only with what it asks for allowlisted, and unrestricted."""
    with torch.serialization.safe_globals([resolve(n) for n in torch_asks(path)]):
        restricted = torch.load(path, weights_only=True)
    return restricted, torch.load(path, weights_only=False)


def ptfile_load(path: Path | io.BytesIO, **options: Any) -> Any:
    with ptfile.safe_globals(ptfile.NUMPY_GLOBALS):
        return ptfile.load(path, **options)


def assert_same(p: Any, t: Any, path: str = "") -> None:
    """ptfile's tree equals torch's: numpy values exactly (type, dtype, layout, bits)."""
    if isinstance(t, torch.Tensor):
        assert_tensor_equal(p, t)
    elif isinstance(t, np.ndarray):
        assert type(p) is np.ndarray, path
        assert p.dtype == t.dtype and p.dtype.str == t.dtype.str, path
        assert p.shape == t.shape and p.strides == t.strides, path
        assert (p.flags.c_contiguous, p.flags.f_contiguous, p.flags.writeable) == \
            (t.flags.c_contiguous, t.flags.f_contiguous, t.flags.writeable), path
        assert p.tobytes(order="A") == t.tobytes(order="A"), path
    elif isinstance(t, np.generic):
        assert type(p) is type(t) and p.dtype.str == t.dtype.str, path
        assert p.tobytes() == t.tobytes(), path
    elif isinstance(t, dict):
        assert type(p) is type(t) and list(p) == list(t), path
        for key in t:
            assert_same(p[key], t[key], f"{path}/{key}")
    elif isinstance(t, (list, tuple)):
        assert type(p) is type(t) and len(p) == len(t), path
        for i, (a, b) in enumerate(zip(p, t, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(t, float) and math.isnan(t):
        assert math.isnan(p), path
    else:
        assert type(p) is type(t) and p == t, (path, p, t)
