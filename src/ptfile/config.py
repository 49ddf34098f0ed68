"""torch's serialization settings, torch-free, with the same defaults.

=============================  =====================================================  ===========
ptfile                          torch                                                  default
=============================  =====================================================  ===========
``crc32``                       ``set_crc32_options`` / ``get_crc32_options``          ``True``
``storage_alignment``           ``config.save.storage_alignment``                      ``64``
``byteorder_record``            ``_disable_byteorder_record`` (inverted)               ``True``
``load_endianness``             ``set_default_load_endianness``                        ``None``
``mmap_flags``                  ``set_default_mmap_options`` (MAP_PRIVATE/MAP_SHARED)  ``MAP_PRIVATE``
``calculate_storage_offsets``   ``config.load.calculate_storage_offsets``              ``False``
=============================  =====================================================  ===========

``load_endianness`` applies only to files without a ``byteorder`` record (written
by torch < 2.1): ``None`` and ``"little"`` read them as little-endian (torch's
default), ``"big"`` as big-endian, ``"native"`` as the host's order.

Settings live in a :class:`contextvars.ContextVar`, so :func:`settings` used as a
context manager is thread- and task-local; the ``set_*`` functions change the
current context's value.

>>> import ptfile
>>> with ptfile.settings(crc32=False):
...     ptfile.get_crc32_options()
False
>>> ptfile.get_crc32_options()
True
"""

from __future__ import annotations

import contextlib
import contextvars
import mmap as _mmap
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Final

__all__ = [
    "MAP_PRIVATE",
    "MAP_SHARED",
    "Settings",
    "current",
    "get_crc32_options",
    "get_default_load_endianness",
    "get_default_mmap_options",
    "set_crc32_options",
    "set_default_load_endianness",
    "set_default_mmap_options",
    "settings",
]

MAP_PRIVATE: Final = getattr(_mmap, "MAP_PRIVATE", 2)
MAP_SHARED: Final = getattr(_mmap, "MAP_SHARED", 1)
_ENDIANNESS: Final = (None, "little", "big", "native")


@dataclass(frozen=True, slots=True)
class Settings:
    """One immutable set of serialization settings."""

    crc32: bool = True
    storage_alignment: int = 64
    byteorder_record: bool = True
    load_endianness: str | None = None
    mmap_flags: int = MAP_PRIVATE
    calculate_storage_offsets: bool = False

    def __post_init__(self) -> None:
        if type(self.storage_alignment) is not int or self.storage_alignment < 1:
            raise ValueError(f"storage_alignment must be a positive int, got {self.storage_alignment!r}")
        if self.load_endianness not in _ENDIANNESS:
            raise ValueError(f"load_endianness must be one of {_ENDIANNESS}")
        if self.mmap_flags not in (MAP_PRIVATE, MAP_SHARED):
            raise ValueError("mmap_flags must be ptfile.MAP_PRIVATE or ptfile.MAP_SHARED")

    def missing_byteorder(self) -> str:
        """The byte order assumed for files without a ``byteorder`` record."""
        if self.load_endianness == "native":
            return sys.byteorder
        return self.load_endianness or "little"


# Settings is frozen (immutable), so sharing one default instance is safe.
_CURRENT: Final[contextvars.ContextVar[Settings]] = contextvars.ContextVar(
    "ptfile_settings", default=Settings()  # noqa: B039
)


def current() -> Settings:
    """The settings in force in this context."""
    return _CURRENT.get()


def _set(**changes: Any) -> None:
    _CURRENT.set(replace(_CURRENT.get(), **changes))


@contextlib.contextmanager
def settings(**changes: Any) -> Iterator[Settings]:
    """Change settings inside a ``with`` block only; yields the new settings."""
    token = _CURRENT.set(replace(_CURRENT.get(), **changes))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


def set_crc32_options(compute_crc32: bool) -> None:
    """Write real CRC-32s (``True``, torch's default) or zeros (faster; torch still loads it)."""
    _set(crc32=bool(compute_crc32))


def get_crc32_options() -> bool:
    """Whether saves write CRC-32s."""
    return current().crc32


def set_default_load_endianness(endianness: str | None) -> None:
    """Byte order for files without a ``byteorder`` record: None/"little", "big" or "native"."""
    _set(load_endianness=endianness)


def get_default_load_endianness() -> str | None:
    """The byte order assumed for files without a ``byteorder`` record (None: little)."""
    return current().load_endianness


def set_default_mmap_options(flags: int) -> None:
    """``MAP_PRIVATE`` (copy-on-write, the default) or ``MAP_SHARED`` for ``load(mmap=True)``."""
    _set(mmap_flags=flags)


def get_default_mmap_options() -> int:
    """The mmap flags ``load(mmap=True)`` uses."""
    return current().mmap_flags
