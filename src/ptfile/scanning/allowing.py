"""A user's allow-list: the unknown globals a scan should count as allowed.

A gate (``ptfile scan`` in CI, the pre-commit hook) meets checkpoints whose globals are on
no allowlist but are known to their owner: a Trainer's ``training_args.bin`` pickles
``transformers.training_args.TrainingArguments``, its ``rng_state.pth`` holds
``np.random.get_state()``.  ``--allow-unknown`` passes every such name; an
:class:`AllowList` passes exactly the ones named:

* ``names``: patterns matched against a global's ``module.name`` with
  :func:`fnmatch.fnmatchcase` (case-sensitive; ``*`` matches any run of characters, dots
  included, ``?`` one, ``[seq]`` one of a set): ``transformers.training_args.TrainingArguments``
  names one class, ``transformers.training_args.*`` every name of that module (and of its
  submodules).
* ``numpy``: the numpy names ptfile reads as inert data (:data:`ptfile.NUMPY_GLOBALS`:
  ``numpy.ndarray``, ``numpy.dtype``, ``_reconstruct``, ``scalar``, ``bytes``), the names
  numpy arrays, scalars and RNG states are pickled with.  An array of dtype ``object`` is
  a dangerous finding of its own (``numpy-object-array``) and stays one.

**An allow-list never passes a dangerous finding.**  It turns ``unknown`` global findings
into ``allowed`` and touches nothing else: a dangerous global (``os.system``,
``builtins.eval``), an archive anomaly or a hazard keeps its verdict whatever matches it.
A pattern that would match a dangerous name (``posix.system``, ``builtins.eval``,
``os.*``, ``*``) is refused when the allow-list is made (:class:`AllowListError`, the
command line's exit 2): it can only be a mistake, and saying so beats ignoring it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from typing import Final

from ..errors import PtfileError
from .verdicts import DANGEROUS_MODULES, DANGEROUS_NAMES, Finding, ScanResult, Verdict, verdict_of

__all__ = ["ROLE_ALLOWED", "TRAINER_ARGUMENTS", "AllowList", "AllowListError", "role_allowed"]

#: Names a pattern is tried on before it is accepted: a global of each dangerous module
#: and every dangerous name (a pattern matching any is refused).
_PROBES: Final = tuple(sorted({*(f"{m}.system" for m in DANGEROUS_MODULES),
                               *(f"{m}.{n}" for m, n in DANGEROUS_NAMES)}))


@cache
def _numpy_names() -> frozenset[str]:
    """``ptfile.NUMPY_GLOBALS``'s names (imported when asked: the policy imports numpy,
    which a scan of a clean file never needs)."""
    from ..allowlist.policy import NUMPY_GLOBALS

    return frozenset(NUMPY_GLOBALS)


class AllowListError(PtfileError, ValueError):
    """A pattern of an allow-list that would pass a dangerous name; ``pattern`` holds it."""

    def __init__(self, message: str, pattern: str) -> None:
        super().__init__(message)
        self.pattern = pattern


def _dangerous_reading(pattern: str) -> str | None:
    """A dangerous ``module.name`` that ``pattern`` matches, or None."""
    if not any(c in pattern for c in "*?["):
        parts = pattern.split(".")
        for i in range(1, len(parts)):
            module, name = ".".join(parts[:i]), ".".join(parts[i:])
            if verdict_of(module, name) is Verdict.DANGEROUS:
                return pattern
        return None
    return next((probe for probe in _PROBES if fnmatchcase(probe, pattern)), None)


@dataclass(frozen=True)
class AllowList:
    """The unknown globals to count as allowed (see the module docstring).

    Raises
    ------
    AllowListError
        A pattern would match a dangerous name.

    Examples
    --------
    >>> allow = AllowList(("transformers.training_args.*",), numpy=True)
    >>> allow.allows("transformers.training_args", "TrainingArguments"), allow.allows(
    ...     "numpy", "ndarray"), allow.allows("my.net", "Net")
    (True, True, False)
    >>> AllowList(("posix.system",))
    Traceback (most recent call last):
    ...
    ptfile.scanning.allowing.AllowListError: --allow posix.system would pass posix.system, a dangerous name: an allow-list passes unknown globals only
    """

    names: tuple[str, ...] = ()
    numpy: bool = False
    #: What the findings it passes say passed them (default: the option that did).
    reason: str = ""

    def __post_init__(self) -> None:
        for pattern in self.names:
            hit = _dangerous_reading(pattern)
            if hit is not None:
                raise AllowListError(f"--allow {pattern} would pass {hit}, a dangerous name: "
                                     "an allow-list passes unknown globals only", pattern)

    def __bool__(self) -> bool:
        return bool(self.names) or self.numpy

    def allows(self, module: str, name: str) -> bool:
        """Whether the global ``module.name`` is on this list."""
        qualname = f"{module}.{name}"
        return (self.numpy and qualname in _numpy_names()) or \
            any(fnmatchcase(qualname, p) for p in self.names)

    def _why(self, module: str, name: str) -> str:
        if self.reason:
            return self.reason
        qualname = f"{module}.{name}"
        if self.numpy and qualname in _numpy_names():
            return "--allow-numpy"
        return "--allow " + next(p for p in self.names if fnmatchcase(qualname, p))

    def apply(self, result: ScanResult) -> ScanResult:
        """``result`` with each ``unknown`` global on this list made ``allowed`` (its
        message says by what); every other finding as it was."""
        if not self:
            return result
        return dataclasses.replace(result, findings=tuple(map(self._finding, result.findings)))

    def _finding(self, f: Finding) -> Finding:
        if f.kind != "global" or f.verdict is not Verdict.UNKNOWN \
                or not self.allows(f.module, f.name):
            return f
        return dataclasses.replace(f, verdict=Verdict.ALLOWED,
                                   message=f"{f.message} (allowed: {self._why(f.module, f.name)})")


#: The classes ``transformers.Trainer`` pickles into ``training_args.bin`` (its arguments
#: dataclass, the enums and dataclasses it holds, accelerate's state beside them): each is
#: rebuilt by NEWOBJ and BUILD (a dataclass's ``__dict__``) or an enum's value lookup,
#: which set attributes and run none of the file's code; ptfile reads the file
#: structurally (:mod:`ptfile.sets.reader`).  Names outside this list stay ``unknown``.
TRAINER_ARGUMENTS: Final = (
    "transformers.training_args.TrainingArguments",
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
    "transformers.training_args.OptimizerNames",
    "transformers.training_args.ParallelMode",
    "transformers.trainer_utils.SchedulerType",
    "transformers.trainer_utils.IntervalStrategy",
    "transformers.trainer_utils.SaveStrategy",
    "transformers.trainer_utils.HubStrategy",
    "transformers.trainer_utils.FSDPOption",
    "transformers.debug_utils.DebugOption",
    "transformers.trainer_pt_utils.AcceleratorConfig",
    "accelerate.state.PartialState",
    "accelerate.utils.dataclasses.DistributedType",
)

#: What a trainer folder's parts hold by their role (:mod:`ptfile.formats.inputs`), read as
#: data as :mod:`ptfile.sets` reads them: numpy's RNG state in ``rng_state*.pth``, the
#: arguments' classes in ``training_args.bin``, with what a finding says allowed it.  A
#: scan of the folder allows these names in those files only (:func:`role_allowed`); the
#: same names anywhere else, and any other name, keep their verdict.
ROLE_ALLOWED: Final = {
    "rng_state": ((), True, "numpy's RNG state in a trainer folder's rng_state file"),
    "training_args": (TRAINER_ARGUMENTS, False, "transformers.Trainer's arguments"),
}


@cache
def role_allowed(role: str) -> AllowList | None:
    """The :class:`AllowList` of a trainer folder's part of ``role`` (:data:`ROLE_ALLOWED`),
    made when first asked (checking its names asks the allowlist, which imports numpy)."""
    found = ROLE_ALLOWED.get(role)
    return None if found is None else AllowList(found[0], numpy=found[1], reason=found[2])
