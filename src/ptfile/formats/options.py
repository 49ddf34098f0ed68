"""What every format reader is asked to do: one typed options object.

Each reader of :mod:`ptfile.formats` takes ``(source, detected, options)``; the
front doors (:func:`ptfile.load`, :func:`ptfile.open`,
:func:`ptfile.load_torchscript`) build one :class:`ReadOptions` from their
arguments, so a setting has one name and one default everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..allowlist.policy import FindClass, find_strict_class
from ..config import Settings, current
from ..limits import DEFAULT_LIMITS, Limits
from ..model.location import MapLocation, has_packages

__all__ = ["FindClass", "ReadOptions"]


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
    find_class
        The global-resolution policy (:mod:`ptfile.allowlist.policy`); by default
        torch's weights-only allowlist.
    skip_data
        Build tensors without reading storage bytes.
    encoding
        How legacy (Python 2) pickles decode 8-bit strings: torch's default
        ``"utf-8"``, or ``"latin1"``, ``"bytes"``…
    """

    map_location: MapLocation = None
    limits: Limits = DEFAULT_LIMITS
    settings: Settings = field(default_factory=current)
    find_class: FindClass = find_strict_class
    skip_data: bool = False
    encoding: str = "utf-8"

    @property
    def is_plain(self) -> bool:
        """Nothing remaps storages and the default policy resolves globals: the case the
        ZIP reader's bulk path (:class:`~ptfile.formats.storages.FastStorages`) serves."""
        return (self.map_location is None and not has_packages()
                and self.find_class is find_strict_class)
