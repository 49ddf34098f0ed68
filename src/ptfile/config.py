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
``mmap``                        ``config.load.mmap`` (what ``load(mmap=None)`` does)   ``False``
``skip_data``                   ``serialization.skip_data()`` (inside the ``with``)    ``False``
``materialize_fake_tensors``    ``skip_data(materialize_fake_tensors=...)``            ``False``
=============================  =====================================================  ===========

``load_endianness`` applies only to files without a ``byteorder`` record (written
by torch < 2.1): ``None`` and :attr:`LoadEndianness.LITTLE` read them as
little-endian (torch's default), ``BIG`` as big-endian, ``NATIVE`` as the host's
order.  :class:`LoadEndianness` is a ``str`` enum, so the strings ``"little"``,
``"big"`` and ``"native"`` are accepted and compare equal to its members.

``skip_data`` (set by :class:`skip_data`) makes :func:`ptfile.save` write every
storage record's space without its bytes and :func:`ptfile.load` build tensors
without reading any, as their ``skip_data=True`` arguments do.
``materialize_fake_tensors`` is recorded but changes nothing: torch uses it to save
FakeTensors (tensors with no memory) as if they were real; ptfile has no
FakeTensors, and a data-less storage (``Storage(None, dtype, nbytes=n)``, or one
loaded with ``skip_data``) is written inside ``skip_data`` whatever its value.

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
from enum import Enum
from types import TracebackType
from typing import Any, Final

__all__ = [
    "MAP_PRIVATE",
    "MAP_SHARED",
    "LoadEndianness",
    "Settings",
    "current",
    "get_crc32_options",
    "get_default_load_endianness",
    "get_default_mmap_options",
    "set_crc32_options",
    "set_default_load_endianness",
    "set_default_mmap_options",
    "settings",
    "skip_data",
    "skipping_data",
]

MAP_PRIVATE: Final = getattr(_mmap, "MAP_PRIVATE", 2)
MAP_SHARED: Final = getattr(_mmap, "MAP_SHARED", 1)


class LoadEndianness(str, Enum):
    """The byte order assumed for files without a ``byteorder`` record (torch's enum).

    torch's members have the values 1, 2, 3; ptfile's are the strings that
    ptfile accepted before, so ``LoadEndianness.BIG == "big"``.

    Examples
    --------
    >>> import ptfile
    >>> ptfile.set_default_load_endianness(ptfile.LoadEndianness.BIG)
    >>> ptfile.get_default_load_endianness()
    <LoadEndianness.BIG: 'big'>
    >>> ptfile.get_default_load_endianness() == "big"
    True
    >>> ptfile.set_default_load_endianness(None)
    """

    NATIVE = "native"
    LITTLE = "little"
    BIG = "big"


@dataclass(frozen=True, slots=True)
class Settings:
    """One immutable set of serialization settings."""

    crc32: bool = True
    storage_alignment: int = 64
    byteorder_record: bool = True
    load_endianness: LoadEndianness | None = None
    mmap_flags: int = MAP_PRIVATE
    calculate_storage_offsets: bool = False
    mmap: bool = False
    skip_data: bool = False
    materialize_fake_tensors: bool = False

    def __post_init__(self) -> None:
        if type(self.storage_alignment) is not int or self.storage_alignment < 1:
            raise ValueError(f"storage_alignment must be a positive int, got {self.storage_alignment!r}")
        if self.load_endianness is not None:
            try:
                member = LoadEndianness(self.load_endianness)
            except ValueError:
                raise ValueError(f"load_endianness must be None or one of "
                                 f"{[m.value for m in LoadEndianness]}, "
                                 f"got {self.load_endianness!r}") from None
            object.__setattr__(self, "load_endianness", member)  # frozen: normalise in place
        if self.mmap_flags not in (MAP_PRIVATE, MAP_SHARED):
            raise ValueError("mmap_flags must be ptfile.MAP_PRIVATE or ptfile.MAP_SHARED")

    def missing_byteorder(self) -> str:
        """The byte order assumed for files without a ``byteorder`` record."""
        if self.load_endianness is LoadEndianness.NATIVE:
            return sys.byteorder
        return self.load_endianness.value if self.load_endianness else "little"



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


def set_default_load_endianness(endianness: LoadEndianness | str | None) -> None:
    """Byte order for files without a ``byteorder`` record: None/"little", "big" or "native".

    Parameters
    ----------
    endianness
        A :class:`LoadEndianness`, its value as a string, or ``None`` (little-endian,
        torch's default).

    Raises
    ------
    TypeError
        ``endianness`` is neither (torch raises TypeError too).
    ValueError
        A string that names no byte order.

    Examples
    --------
    >>> import ptfile
    >>> with ptfile.settings(load_endianness="native"):
    ...     ptfile.get_default_load_endianness()
    <LoadEndianness.NATIVE: 'native'>
    """
    if endianness is not None and not isinstance(endianness, str):
        raise TypeError(f"set_default_load_endianness takes a ptfile.LoadEndianness or None, "
                        f"got {type(endianness).__name__}")
    _set(load_endianness=endianness)


def get_default_load_endianness() -> LoadEndianness | None:
    """The byte order assumed for files without a ``byteorder`` record (None: little).

    Examples
    --------
    >>> import ptfile
    >>> ptfile.get_default_load_endianness() is None
    True
    """
    return current().load_endianness


def set_default_mmap_options(flags: int) -> None:
    """``MAP_PRIVATE`` (copy-on-write, the default) or ``MAP_SHARED`` for ``load(mmap=True)``."""
    _set(mmap_flags=flags)


def get_default_mmap_options() -> int:
    """The mmap flags ``load(mmap=True)`` uses."""
    return current().mmap_flags


class skip_data:  # noqa: N801 - torch's name, lower case
    """Context manager: saves and loads inside it skip the storage bytes (torch's
    ``serialization.skip_data``).

    Inside the ``with`` block, :func:`ptfile.save` writes each storage record's
    space without its data (zeros with CRC 0, byte for byte what torch writes
    inside its ``skip_data``; a path target is sparse), and :func:`ptfile.load`
    and :func:`ptfile.load_torchscript` build every tensor (shape, dtype,
    strides, sharing) without reading any storage bytes, as their
    ``skip_data=True`` arguments do.  torch's load allocates each storage
    uninitialised; ptfile allocates nothing: ``Tensor.numpy()`` of such a tensor
    raises :class:`~ptfile.errors.UnsupportedFeatureError`.  The legacy format
    (``_use_new_zipfile_serialization=False``) cannot skip data: saving it
    inside the block raises :class:`~ptfile.errors.SaveError`, as torch raises.

    It sets the ``skip_data`` setting of the current context (see
    :func:`settings`), so it is thread- and task-local, and nests.

    Parameters
    ----------
    materialize_fake_tensors
        torch's switch for saving FakeTensors as real ones.  ptfile has no
        FakeTensors: the value is kept in the settings and changes nothing.

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO()
    >>> with ptfile.skip_data():
    ...     ptfile.save({"w": np.ones((2, 3), "float32")}, buf)
    ...     meta = ptfile.load(io.BytesIO(buf.getvalue()))
    >>> meta["w"].shape, meta["w"].storage.data is None
    (torch.Size([2, 3]), True)
    >>> ptfile.load(io.BytesIO(buf.getvalue()))["w"].numpy().sum()  # zeros were written
    np.float32(0.0)
    """

    def __init__(self, materialize_fake_tensors: bool = False) -> None:
        self.materialize_fake_tensors = materialize_fake_tensors
        self._tokens: list[contextvars.Token[Settings]] = []

    def __enter__(self) -> None:
        changed = replace(_CURRENT.get(), skip_data=True,
                          materialize_fake_tensors=bool(self.materialize_fake_tensors))
        self._tokens.append(_CURRENT.set(changed))

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        _CURRENT.reset(self._tokens.pop())


def skipping_data(skip_data: bool) -> bool:
    """Whether a save or load skips storage bytes: its own argument, or :class:`skip_data`."""
    return skip_data or _CURRENT.get().skip_data
