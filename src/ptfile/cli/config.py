"""The ``[tool.ptfile]`` table of ``pyproject.toml``: a repository's scan options, read by
``ptfile scan`` (and so by the pre-commit hook and CI) as if given on the command line.

Found as other tools find theirs: from the current directory up, the first
``pyproject.toml`` that has a ``[tool.ptfile]`` table; the walk stops at a repository's root
(a folder holding ``.git``) or the filesystem's.  ``--no-config`` reads none.

=================  ===========  =============================================================
key                type         as
=================  ===========  =============================================================
``allow``          list of str  ``--allow`` each (``module.name`` or a glob:
                                :mod:`ptfile.scanning.allowing`); the command line's are added
``allow-numpy``    bool         ``--allow-numpy``
``allow-unknown``  bool         ``--allow-unknown``
``exclude``        list of str  ``--exclude`` each (globs of paths a folder scan leaves out),
                                (every bulk command has it)
=================  ===========  =============================================================

```toml
[tool.ptfile]
allow = ["transformers.training_args.*", "transformers.trainer_utils.*"]
allow-numpy = true
```

A key not in the table, a value of another type or a pattern that would pass a dangerous
name is an error (exit 2), never ignored: a gate's configuration is read exactly.  A
boolean the table sets cannot be unset from the command line.  Python 3.10 reads the file
with ``tomli`` (a dependency there), 3.11 and later with the standard ``tomllib``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Final

from ..errors import PtfileError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["KEYS", "ConfigError", "apply", "find_config", "read_config"]

#: Each key of ``[tool.ptfile]``: its type and the ``argparse`` destination it sets.
KEYS: Final[dict[str, tuple[type, str]]] = {
    "allow": (list, "allow"), "allow-numpy": (bool, "allow_numpy"),
    "allow-unknown": (bool, "allow_unknown"), "exclude": (list, "exclude")}


class ConfigError(PtfileError, ValueError):
    """A ``[tool.ptfile]`` table that cannot be read as it is written; ``path`` is its file."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(f"{path}: [tool.ptfile]: {message}")
        self.path = path


def find_config(start: Path | None = None) -> Path | None:
    """The first ``pyproject.toml`` with a ``[tool.ptfile]`` table from ``start`` (the
    current directory) up, not above a repository's root; None when there is none."""
    folder = (start or Path.cwd()).resolve()
    for here in (folder, *folder.parents):
        candidate = here / "pyproject.toml"
        if candidate.is_file() and "ptfile" in _tool_tables(candidate):
            return candidate
        if (here / ".git").exists():
            return None
    return None


def _tool_tables(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fp:
            doc = tomllib.load(fp)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the file: {exc}", path) from exc
    tool = doc.get("tool", {})
    return tool if isinstance(tool, dict) else {}


def read_config(path: Path) -> dict[str, Any]:
    """The checked ``[tool.ptfile]`` table of ``path``.

    Raises
    ------
    ConfigError
        A key not in :data:`KEYS`, or a value of another type (lists of strings only).
    """
    table = _tool_tables(path).get("ptfile", {})
    if not isinstance(table, dict):
        raise ConfigError("not a table", path)
    for key, value in table.items():
        if key not in KEYS:
            raise ConfigError(f"unknown key {key!r} (known: {', '.join(KEYS)})", path)
        kind = KEYS[key][0]
        if not isinstance(value, kind) or (isinstance(value, list) and not all(
                isinstance(v, str) for v in value)):
            raise ConfigError(f"{key} must be {'a list of strings' if kind is list else 'true or false'}",
                              path)
    return table


def apply(args: argparse.Namespace) -> Path | None:
    """Add the options of the ``[tool.ptfile]`` table found (:func:`find_config`) to
    ``args``; returns its file (None when none, or with ``--no-config``)."""
    if getattr(args, "no_config", False):
        return None
    path = find_config()
    if path is None:
        return None
    for key, value in read_config(path).items():
        dest = KEYS[key][1]
        if not hasattr(args, dest):
            print(f"ptfile {args.command}: warning: {path}: [tool.ptfile] {key} is not an "
                  f"option of this ptfile's {args.command}; ignored", file=sys.stderr)
        elif isinstance(value, list):
            setattr(args, dest, [*value, *(getattr(args, dest) or [])])
        else:
            setattr(args, dest, bool(getattr(args, dest)) or value)
    args.config = os.fspath(path)
    return path
