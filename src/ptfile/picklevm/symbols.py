"""The values of the symbolic pickle machine (:mod:`.symbolic`), and what a walk reports.

Literals stay their Python values; the machine's own kinds are a global named
(:class:`GlobalRef`, :class:`Unresolved`), a tuple that knows its nesting and hash cost
(:class:`Tup`), a call's or persistent id's result (:class:`Result`) and a container
under construction (:class:`Container`).  A walk reports each name used
(:class:`NameUse`) and everything else it saw in one :class:`Trace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Container", "GlobalRef", "NameUse", "Result", "Trace", "Tup", "Unresolved"]


@dataclass(frozen=True, slots=True)
class GlobalRef:
    """A global named by ``GLOBAL``, ``STACK_GLOBAL`` or ``INST``."""

    module: str
    name: str


@dataclass(frozen=True, slots=True)
class Unresolved:
    """A ``STACK_GLOBAL`` whose operands are not both strings."""

    module: object
    name: object


class Tup(tuple):  # type: ignore[type-arg]
    """A symbolic tuple that knows how deeply tuples nest in it, and what hashing it costs
    (``cost``: tuples hashed, shared items counted once per reference)."""

    depth: int = 1
    cost: int = 1


@dataclass(eq=False, slots=True)
class Result:
    """What a call or a persistent id returns: ``func(*args)`` or ``persistent_load(pid)``."""

    func: object
    args: object
    opcode: str
    pos: int


@dataclass(eq=False, slots=True)
class Container:
    """A list, dict, set or frozenset under construction (``kind``); ``items`` for lists/sets."""

    kind: str
    items: list[object] = field(default_factory=list)
    #: Entries of a dict (its keys are not kept).
    entries: int = 0
    #: Items already counted as keys (a list handed to ``set()`` again is not recounted),
    #: and the tuple hashes they cost.
    hashed: int = 0
    key_cost: int = 0


@dataclass(frozen=True, slots=True)
class NameUse:
    """One use of a global name: which opcode, where, and whether the name is known."""

    module: str
    name: str
    opcode: str
    pos: int
    resolved: bool = True


@dataclass(slots=True)
class Trace:
    """Everything :func:`trace` saw.

    Attributes
    ----------
    names : list of NameUse
        Every ``GLOBAL``/``STACK_GLOBAL``/``INST`` (and unresolved ones).
    calls : list of Result
        Every call, in stream order.
    exts : list of (code, pos)
        ``EXT1``/``EXT2``/``EXT4`` codes.
    blobs : list of (bytes, pos)
        Byte-string literals (and latin-1 text literals that start like a
        pickle or a ZIP, or are ASCII and long enough to be base64 or hex of
        one): where nested pickles hide.
    persistent_ids : list of (object, pos)
        Persistent ids handed to ``persistent_load``.
    global_builds : list of NameUse
        ``BUILD`` applied to a global itself (sets attributes on an imported
        object: how names get smuggled past scanners, and how shared objects
        get changed for later loads).
    max_collisions, max_tuple_depth, hash_steps : int
        The hazards described in the module docstring.
    alloc_bytes, objects : int
        What CPython's unpickler would allocate, estimated (module docstring).
    end : int
        Offset after ``STOP``.
    error : str or None
        Why the walk stopped early.
    """

    names: list[NameUse] = field(default_factory=list)
    calls: list[Result] = field(default_factory=list)
    exts: list[tuple[int, int]] = field(default_factory=list)
    blobs: list[tuple[bytes, int]] = field(default_factory=list)
    persistent_ids: list[tuple[object, int]] = field(default_factory=list)
    global_builds: list[NameUse] = field(default_factory=list)
    max_collisions: int = 0
    max_tuple_depth: int = 0
    hash_steps: int = 0
    alloc_bytes: int = 0
    objects: int = 0
    end: int = -1
    error: str | None = None
