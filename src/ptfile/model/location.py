"""Location tags: ``map_location`` and the ``register_package`` registry, torch-free.

torch records each storage's device as a tag (``'cpu'``, ``'cuda:0'``, ``'mps'``…).
ptfile always holds the data in host memory, so restoring a location means
deciding which tag the loaded :class:`~ptfile.Storage` carries:

* ``map_location=None`` keeps the recorded tag;
* a string (or :class:`~ptfile.Device`) replaces every tag;
* a dict maps recorded tags to new ones (tags it doesn't name are kept);
* a callable ``f(storage, location)`` may return a Storage (used as is), a tag,
  or ``None`` (fall through to the registry).

The registry mirrors ``torch.serialization.register_package``: handlers with a
lower priority run first; a deserializer returning a non-None Storage wins.
The optional torch bridge registers handlers that map tags to real devices.

Saving, :func:`pid_location` gives the tag object each persistent id carries.
The pickler memoises a str by identity (``BINPUT`` the first time an object is
written, ``BINGET`` after), so which object matters for the bytes.  torch builds
every persistent id with ``location_tag(storage)``: an unindexed tag
(``'cpu'``, ``'mps'``, ``'meta'``) is a constant, one object memoised once; an
indexed tag (``'cuda:0'``) is built afresh at each call, so every persistent id
writes it out again, even for a storage met before.  A checkpoint whose tag
function returned one object (issue 11: ``'cuda:0'`` memoised) keeps that
pattern through a load: the pickle's own str objects stay on the storages
(``Storage._pickled_location``), shared where the pickle memoised the tag, one
per storage where it did not; the loaders drop the mark of a storage whose
repeated persistent id carried a fresh object.  A tag the load remapped, or
that the caller set, follows torch's rule.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from .tensor import Device, Storage

__all__ = ["MapLocation", "pid_location", "register_package", "restore_location"]

Tagger = Callable[[Any], str | None]
Deserializer = Callable[[Storage, str], Storage | None]
MapLocation = Union[None, str, Device, Mapping[str, str], Callable[[Storage, str], Any]]  # noqa: UP007 - a runtime alias on 3.10


@dataclass(order=True, frozen=True)
class _Package:
    priority: int
    tagger: Tagger = field(compare=False)
    deserializer: Deserializer = field(compare=False)


_PACKAGES: list[_Package] = []
_LOCK = threading.Lock()


def register_package(priority: int, tagger: Tagger, deserializer: Deserializer) -> None:
    """Register handlers for location tags, as ``torch.serialization.register_package``.

    ``tagger(obj)`` returns a tag for objects the package knows (used when saving
    foreign objects) or None; ``deserializer(storage, location)`` returns a
    Storage for tags it handles, or None.
    """
    with _LOCK:
        _PACKAGES.append(_Package(priority, tagger, deserializer))
        _PACKAGES.sort()


def has_packages() -> bool:
    """True once any package was registered (the fast path skips the registry otherwise)."""
    return bool(_PACKAGES)


def location_tag(obj: Any) -> str | None:
    """The tag the first registered tagger gives ``obj`` (None when no package knows it)."""
    for package in _PACKAGES:
        tag = package.tagger(obj)
        if tag is not None:
            return tag
    return None


def _registry_restore(storage: Storage, location: str) -> Storage:
    for package in _PACKAGES:
        result = package.deserializer(storage, location)
        if result is not None:
            return result
    storage.location = location
    return storage


def restore_location(storage: Storage, location: str, map_location: MapLocation) -> Storage:
    """Apply ``map_location`` to a freshly loaded storage recorded at ``location``."""
    if map_location is None:
        return _registry_restore(storage, location)
    if isinstance(map_location, (str, Device)):
        return _registry_restore(storage, str(map_location))
    if isinstance(map_location, Mapping):
        return _registry_restore(storage, str(map_location.get(location, location)))
    result = map_location(storage, location)
    if isinstance(result, Storage):
        return result
    if isinstance(result, (str, Device)):
        return _registry_restore(storage, str(result))
    return _registry_restore(storage, location)


def pid_location(storage: Storage) -> str:
    """The location str for a persistent id of ``storage``, as torch's ``location_tag`` gives it.

    An unindexed tag is the interned constant; an indexed one is the str the
    loaded pickle held while the storage still carries it (memoised where the
    file memoised it), else a new str object at each call (see the module
    docstring).

    Examples
    --------
    >>> from ptfile.model.dtypes import UINT8
    >>> storage = Storage(None, UINT8, location="cuda:0")
    >>> pid_location(storage) == pid_location(storage) == "cuda:0"
    True
    >>> pid_location(storage) is pid_location(storage)
    False
    """
    location = storage.location
    if ":" not in location:
        return sys.intern(location)
    if location is storage._pickled_location:
        return location
    return "".join(list(location))  # a new str object each time, as torch's _backend_tag builds it
