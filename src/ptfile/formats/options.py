"""What every format reader is asked to do, and what an opener gives back.

Each reader and opener of :mod:`ptfile.formats` takes ``(source, detected, options)``;
the front doors (:func:`ptfile.load`, :func:`ptfile.open`,
:func:`ptfile.load_torchscript`) build one :class:`ReadOptions` from their
arguments, so a setting has one name and one default everywhere.  A reader returns
the object; an opener (the format-level part of :func:`ptfile.open`) returns an
:class:`Opened`: the object without storage bytes and where those bytes are.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ..allowlist.policy import FindClass
from ..config import Settings, current
from ..limits import DEFAULT_LIMITS, Limits
from ..model.location import MapLocation, has_packages

if TYPE_CHECKING:
    from .._io.local import Source
    from ..archive import ZipReader
    from ..model.tensor import Storage
    from .detection import Format
    from .zipinfo import ZipInfo

__all__ = ["FindClass", "Opened", "Policy", "ReadOptions"]


class Policy(enum.Enum):
    """The ``find_class`` policy a read asks for, by name: a reader makes it, fresh for
    the read, with :func:`ptfile.formats.policies.make` (the one home of the policies)."""

    #: torch's weights-only allowlist and :func:`ptfile.add_safe_globals`, else
    #: ``UnsafeGlobalError`` (a reader may serve it with its fast tensor constructors).
    STRICT = "strict"
    #: The allowlist and registry, else an inert per-load stand-in.
    STRUCTURAL = "structural"
    #: STRICT, and numpy values read as data (:data:`ptfile.NUMPY_GLOBALS`'s rebuilders):
    #: a DCP checkpoint's non-tensor items, which torch's DCP loader reads.
    STRICT_NUMPY = "strict, numpy values"
    #: STRUCTURAL, and numpy values read as data.
    STRUCTURAL_NUMPY = "structural, numpy values"
    #: STRICT, and DeepSpeed's checkpoint classes read as inert records
    #: (:mod:`ptfile.formats.deepspeed`): the files of a ZeRO checkpoint.
    STRICT_DEEPSPEED = "strict, deepspeed classes"
    #: STRUCTURAL, and DeepSpeed's checkpoint classes read as inert records.
    STRUCTURAL_DEEPSPEED = "structural, deepspeed classes"

    @classmethod
    def of(cls, *, structural: bool, numpy_values: bool = False) -> Policy:
        """The policy a read's two switches name.

        Examples
        --------
        >>> Policy.of(structural=False, numpy_values=True)
        <Policy.STRICT_NUMPY: 'strict, numpy values'>
        """
        return _POLICIES[structural, numpy_values]


_POLICIES: Final = {(False, False): Policy.STRICT, (True, False): Policy.STRUCTURAL,
                    (False, True): Policy.STRICT_NUMPY, (True, True): Policy.STRUCTURAL_NUMPY}


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How to read a checkpoint.

    Attributes
    ----------
    map_location
        torch's ``map_location`` (tags remapped; data stays in host memory).
    limits
        Ceilings for untrusted input.
    settings
        The serialization settings in force (:mod:`ptfile.config`); by default
        the current context's when the options are made.
    policy
        Which ``find_class`` policy resolves the pickle's globals
        (:mod:`ptfile.formats.policies`); by default torch's weights-only allowlist.
    skip_data
        Build tensors without reading storage bytes.
    encoding
        How legacy (Python 2) pickles decode 8-bit strings: torch's default
        ``"utf-8"``, or ``"latin1"``, ``"bytes"``…
    """

    map_location: MapLocation = None
    limits: Limits = DEFAULT_LIMITS
    settings: Settings = field(default_factory=current)
    policy: Policy = Policy.STRICT
    skip_data: bool = False
    encoding: str = "utf-8"

    @property
    def is_plain(self) -> bool:
        """Nothing remaps storages and the strict policy resolves globals: the case the
        ZIP reader's bulk path (:class:`~ptfile.formats.storages.FastStorages`) serves."""
        return (self.map_location is None and not has_packages()
                and self.policy is Policy.STRICT)


@dataclass(frozen=True, slots=True)
class Opened:
    """One checkpoint file opened for lazy reading: what :func:`ptfile.formats.open_detected`
    gives :func:`ptfile.open`, which wraps it in a :class:`~ptfile.CheckpointReader`.

    Attributes
    ----------
    source
        Where the tensors' bytes are read from: the source opened, or, for a stream
        format read from a source that reads on demand, its bytes read whole.
    format
        The format detected.
    obj
        The object the file holds; its storages carry no bytes when the format has an
        opener, else it is the whole object as :func:`ptfile.load` reads it.
    meta
        :meth:`~ptfile.CheckpointReader.metadata`: strings only.
    archive, info
        The parsed archive and its metadata records (the ZIP kinds with an opener).
    by_row
        The storage loaded from each central directory row (None for the other rows),
        when the loader kept them; their file offsets are then computed in one pass.
    offsets
        The file offset of each storage's first byte, when the format knows it without
        an archive (safetensors).
    """

    source: Source
    format: Format
    obj: Any
    meta: dict[str, str]
    archive: ZipReader | None = None
    info: ZipInfo | None = None
    by_row: Callable[[], Sequence[Storage | None]] = tuple
    offsets: dict[Storage, int] | None = None
