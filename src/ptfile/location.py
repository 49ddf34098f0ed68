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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from .tensor import Device, Storage

__all__ = ["MapLocation", "register_package", "restore_location"]

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
