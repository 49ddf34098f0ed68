"""Package faces that import their names on first use (PEP 562).

:mod:`ptfile`, :mod:`ptfile.archive` and :mod:`ptfile.formats` name what they offer in a
table (public name → the module of the package that defines it); their module
``__getattr__`` asks :func:`load`, which imports that module the first time the name is
used and keeps the value in the package, so later uses are plain attribute lookups.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["load"]


def load(package: str, exports: Mapping[str, str], name: str) -> Any:
    """``package.name``, imported from ``package.<exports[name]>`` and kept in ``package``.

    Raises
    ------
    AttributeError
        ``name`` is not in ``exports``.
    """
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{package}.{module}"), name)
    setattr(sys.modules[package], name, value)
    return value
