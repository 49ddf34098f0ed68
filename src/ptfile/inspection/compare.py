"""How two checkpoints differ: :func:`diff` compares tensors in bounded chunks, then every
other value and the nesting."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from .._io.local import FileLike
from .._io.remote import StorageOptions
from ..allowlist.structural import StandIn
from ..api import open as open_checkpoint
from ..dcp.reader import DCPReader
from ..errors import (
    PtfileError,
)
from ..formats.inputs import InputKind
from ..limits import Limits
from ..model.tree import containers
from ..model.tree import values as values_of
from ..reader import CheckpointReader
from ..sets import SetReader
from ..zero import ZeroReader

__all__ = ["DiffReport", "diff"]

#: Elements compared per step in :func:`diff` (bounded memory on huge tensors).
DIFF_CHUNK: Final = 1 << 22
Progress = Callable[[int], None]


@dataclass
class DiffReport:
    """What differs between two checkpoints: names only in one of them (tensors and other
    values), tensors whose dtype or shape changed, other values that changed, and the
    largest absolute difference per common tensor."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: dict[str, str] = field(default_factory=dict)
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    #: Non-tensor values (``step``, ``config.lr``) that differ: name -> [a, b], as ``repr``.
    values_changed: dict[str, list[str]] = field(default_factory=dict)
    #: Non-tensor values compared (0 with ``tensors_only``).
    values_compared: int = 0
    #: Containers (non-empty dicts, lists, tuples) whose kind differs or that only one
    #: side has: name -> [kind in a, kind in b], None where absent (``{"model": {"w": t}}``
    #: against ``{"model.w": t}``: ``{"model": ["dict", None]}``).
    structure: dict[str, list[str | None]] = field(default_factory=dict)
    #: The two inputs, as given (None for file objects).
    a: str | None = None
    b: str | None = None

    @property
    def identical(self) -> bool:
        """True when both hold the same names, dtypes, shapes and values, tensors and
        other values alike."""
        return not (self.added or self.removed or self.changed or self.values_changed
                    or self.structure or any(v != 0 for v in self.max_abs_diff.values()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (NaN differences as the string ``"nan"``)."""
        values = {k: (v if not np.isnan(v) else "nan") for k, v in self.max_abs_diff.items()}
        return {"a": self.a, "b": self.b, "identical": self.identical, "added": self.added,
                "removed": self.removed, "changed": self.changed, "max_abs_diff": values,
                "values_changed": self.values_changed,
                "values_compared": self.values_compared, "structure": self.structure}


#: Characters of a value's ``repr`` a diff report keeps.
_VALUE_REPR: Final = 80


def _values(ck: Any) -> dict[str, object]:
    """The checkpoint's non-tensor values by dotted name (a DCP item is read now; a set's
    by part, named as its tensors are)."""
    if isinstance(ck, SetReader):
        prefixed = ck.record.kind is InputKind.TRAINER
        out: dict[str, object] = {}
        for role, part in ck.parts.items():
            found = _values(part) if hasattr(part, "info") else values_of(part)
            out.update({(f"{role}.{k}" if k else role) if prefixed else k: v
                        for k, v in found.items()})
        return out
    if isinstance(ck, DCPReader):  # an item may hold a list or dict: named leaf by leaf
        return {f"{fqn}.{k}" if k else fqn: v
                for fqn in ck.meta.state_dict_metadata if fqn not in ck
                for k, v in values_of(ck.value(fqn)).items()}
    # A structural load's stand-ins are no values (a fresh class per load): their tensors
    # are compared by state-dict name, the rest of the object is not.
    return {k: v for k, v in values_of(ck.object).items() if not isinstance(v, StandIn)}


def _compare_structure(left: Any, right: Any, report: DiffReport) -> None:
    """Containers that differ in kind or that one side lacks (files only: a DCP folder's
    nesting is rebuilt from its planner data, tuples as lists)."""
    if isinstance(left, DCPReader) or isinstance(right, DCPReader):
        return
    a, b = containers(left.object), containers(right.object)
    for name in dict.fromkeys([*a, *b]):
        if a.get(name) != b.get(name):
            report.structure[name] = [a.get(name), b.get(name)]


def _same(x: object, y: object) -> bool:
    """Equal values of one type (NaN equals NaN; arrays element-wise; a value whose ``==``
    fails compares by ``repr``)."""
    if type(x) is not type(y):
        return False
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    try:
        equal: Any = x == y  # an array's == is an array
        return bool(equal) if isinstance(equal, (bool, np.bool_)) else \
            bool(np.all(np.asarray(equal)))
    except Exception:  # noqa: BLE001 - an inert stand-in's or an odd type's comparison
        return repr(x) == repr(y)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _VALUE_REPR else text[:_VALUE_REPR - 1] + "…"


def _compare_values(left: dict[str, object], right: dict[str, object],
                    report: DiffReport) -> None:
    report.removed += [k for k in left if k not in right]
    report.added += [k for k in right if k not in left]
    for name, x in left.items():
        if name in right:
            report.values_compared += 1
            if not _same(x, right[name]):
                report.values_changed[name] = [_short(x), _short(right[name])]


def _max_abs(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    """max |a - b| in float64, in chunks of DIFF_CHUNK elements; NaN where they disagree on NaN."""
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    worst = 0.0
    for start in range(0, flat_a.size, DIFF_CHUNK):
        x = flat_a[start:start + DIFF_CHUNK].astype(np.float64)
        y = flat_b[start:start + DIFF_CHUNK].astype(np.float64)
        delta = np.abs(x - y)
        both_nan = np.isnan(x) & np.isnan(y)
        if np.isnan(delta[~both_nan]).any():
            return float("nan")
        delta[both_nan] = 0.0
        if delta.size:
            worst = max(worst, float(delta.max()))
    return worst


def _compare(a: Any, b: Any, name: str,
             report: DiffReport) -> None:
    x, y = a.info(name), b.info(name)
    if x.dtype != y.dtype or x.shape != y.shape:
        report.changed[name] = f"{x.dtype.name}{list(x.shape)} -> {y.dtype.name}{list(y.shape)}"
        return
    if x.dtype.numpy is None:
        return
    left, right = a.get_tensor(name), b.get_tensor(name)
    if x.dtype.is_complex:
        report.max_abs_diff[name] = max(_max_abs(left.real, right.real),
                                        _max_abs(left.imag, right.imag))
    else:
        report.max_abs_diff[name] = _max_abs(left, right)


def diff(a: FileLike, b: FileLike, *, limits: Limits | None = None,
         progress: Progress | None = None, storage_options: StorageOptions = None,
         tensors_only: bool = False, structural: bool = False) -> DiffReport:
    """Compare two checkpoints: tensor by tensor (dotted names, as :func:`ptfile.open`),
    then every other value (``step``, a config dict's entries, as :func:`ptfile.model.tree.values`
    names them), then the nesting (the containers by name and kind: a nested object and
    its flattening differ).  Any two inputs :func:`ptfile.open` reads compare: a ``.pt`` with its
    ``.safetensors`` conversion, a DCP folder with the file consolidated from it.

    Parameters
    ----------
    a, b
        Paths, seekable binary file objects or URLs (``storage_options`` for both).
    limits
        Ceilings for untrusted input.
    progress
        Called with 1 after each common tensor.
    tensors_only
        Compare tensors only: values other than tensors and the nesting are neither
        compared nor listed as added or removed (a foreign ``.safetensors`` file holds no
        ``step``, and its names are flat).
    structural
        Open pickles that name globals outside the weights-only allowlist with inert
        stand-ins (:func:`ptfile.open`'s ``structural``).

    Returns
    -------
    DiffReport

    Raises
    ------
    FormatError, UnsafeGlobalError, LimitExceededError, UnsupportedFeatureError
        As :func:`ptfile.open`; the message starts with the input that failed.

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> from ptfile.inspection import diff
    >>> x, y = io.BytesIO(), io.BytesIO()
    >>> ptfile.save({"w": np.zeros(2, "f4"), "step": 1}, x)
    >>> ptfile.save({"w": np.ones(2, "f4"), "step": 2}, y)
    >>> report = diff(io.BytesIO(x.getvalue()), io.BytesIO(y.getvalue()))
    >>> report.max_abs_diff, report.values_changed
    ({'w': 1.0}, {'step': ['1', '2']})
    """
    report = DiffReport(a=_named(a), b=_named(b))
    with _opened(a, limits, storage_options, structural) as left, \
            _opened(b, limits, storage_options, structural) as right:
        report.removed = [k for k in left if k not in right]
        report.added = [k for k in right if k not in left]
        for name in left:
            if name in right:
                _compare(left, right, name, report)
                if progress is not None:
                    progress(1)
        if not tensors_only:
            _compare_values(_values(left), _values(right), report)
            _compare_structure(left, right, report)
    return report


def _named(f: FileLike) -> str | None:
    return str(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else None


@contextlib.contextmanager
def _opened(f: FileLike, limits: Limits | None, storage_options: StorageOptions,
            structural: bool) -> Iterator[CheckpointReader | DCPReader | SetReader | ZeroReader]:
    """:func:`ptfile.open`, with the input's name added to the error it raises: a diff
    reads two inputs, and the user must know which one failed."""
    try:
        ck = open_checkpoint(f, limits=limits, storage_options=storage_options,
                             structural=structural)
    except PtfileError as exc:
        name = _named(f)
        if name is not None:
            exc.args = (f"{name}: {exc.args[0]}" if exc.args else name, *exc.args[1:])
            exc.input = name  # type: ignore[attr-defined]  # which of the two, for the CLI
        raise
    with ck:
        yield ck

