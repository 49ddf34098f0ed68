"""What ``torch.load`` unpickles of a legacy stream, and ``pickle.load`` of any file.

Specified against torch 2.13's ``torch/serialization.py`` and CPython 3.11's
``pickle`` (the C unpickler); every claim is checked by
``tests/scanning/test_scan_tar_loaders.py``, which runs the real loaders.

``torch.load`` (``load``, then ``_legacy_load``)
    A file that does not start with ``PK\\x03\\x04`` (``_is_zipfile`` reads the
    first four bytes, nothing else) goes to ``_legacy_load``.  When the file
    object has a ``fileno()`` and is at offset 0 (a path, an ``open()`` file), it
    first tries the tar loader (:mod:`.tar`); on any ``tarfile.TarError`` it
    seeks back to 0.  A file object without ``fileno()`` (``io.BytesIO``) never
    tries the tar loader.  Then it calls ``pickle_module.load(f)`` five times in
    a row on the same file:

    1. the magic number: anything else raises ``RuntimeError`` (nothing more is read);
    2. the protocol version: anything but ``1001`` raises;
    3. ``sys_info``: never looked at;
    4. the object (``UnpicklerWrapper``, whose ``persistent_load`` builds storages);
    5. the storage keys; after them come raw storage bytes, read with
       ``_set_from_file``, never unpickled.

    A payload runs in whichever of these pickles it sits, protocols 0 to 5 alike
    (the pickle's own opcodes run before torch compares its value).  The
    weights-only default (``torch.load(f)``) reads the same pickles with its
    allowlist unpickler.
``pickle.load(f)``
    The one pickle at byte 0.

Where the next pickle starts
    The unpickler reads a protocol 4+ ``FRAME`` whole before it runs the opcodes
    in it.  A file without ``peek`` (``io.BytesIO``, an unbuffered ``FileIO``:
    torch's tar members) is then left at the frame's end, even when ``STOP``
    comes earlier in the frame; a buffered file (``open(path, "rb")``: torch.load
    of a path) is left just after ``STOP``.  So a pickle whose frame outlasts its
    ``STOP`` is followed by two next pickles, one per reader: both are listed.

What the model cannot tell
    Whether pickle 1 is the magic number (or pickle 2 the protocol version)
    when it is not a literal (a call's result may compare equal): the next
    pickles are listed then, as torch may read them.  Where a pickle ends when
    ptfile's walk cannot read it: the scanner reports that pickle as unreadable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from ...allowlist.structural import StandIn, make_stand_in
from ...errors import PtfileError
from ...limits import Limits
from ...picklevm import check_stream, unpickle
from ...picklevm.decoder import genops
from . import PICKLE_LOAD, TORCH_LOAD, TORCH_LOAD_UNSAFE

__all__ = ["CANNOT_TELL", "LEGACY_MAGIC", "LEGACY_PICKLES", "LEGACY_PROTOCOL_VERSION",
           "Region", "evaluate", "legacy_stream", "next_starts"]

#: The pickles ``_legacy_load`` reads in a row: magic, protocol, sys_info, object, keys.
#: A fact of torch, not a ceiling: the scanner reads as many at the start of a legacy
#: stream and after a record's ``STOP`` (:mod:`ptfile.scanning.stream`).
LEGACY_PICKLES: Final = 5
#: ``torch.serialization.MAGIC_NUMBER`` and ``PROTOCOL_VERSION``.
LEGACY_MAGIC: Final = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL_VERSION: Final = 1001
_FRAME: Final = b"\x95"


class _CannotTell:
    """The value of a pickle the model cannot know without running it."""

    def __repr__(self) -> str:
        return "CANNOT_TELL"


#: :func:`evaluate`'s value when the pickle builds something only running it would tell.
CANNOT_TELL: Final = _CannotTell()


@dataclass(frozen=True, slots=True)
class Region:
    """A pickle a loader would unpickle: at ``start`` of the bytes given, read by ``loaders``.

    ``label`` says which (``#0``... for a stream's pickles, ``count``, ``entry 3``...
    inside a tar member).
    """

    start: int
    label: str
    loaders: tuple[str, ...]


class _StandIns:
    """``find_class``/``persistent_load`` handing out inert stand-ins (:mod:`ptfile.allowlist.structural`)."""

    def __init__(self) -> None:
        self._classes: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if key not in self._classes:
            self._classes[key] = make_stand_in(module, name)
        return self._classes[key]

    def persistent_load(self, pid: object) -> Any:
        return self.find_class("<persistent_load>", "id")(pid)


def _inert(value: object, budget: list[int]) -> bool:
    """Whether ``value`` holds no call's result (a stand-in instance), looked at
    ``budget`` objects deep at most."""
    stack, seen = [value], set()  # each container once: a list may hold itself 10**5 times
    while stack:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        item = stack.pop()
        if isinstance(item, StandIn):
            return False
        if isinstance(item, (tuple, list, set, frozenset, dict)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if len(stack) > budget[0]:
                return False  # more to look at than the budget allows
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                stack.extend(item)
    return True


#: Objects :func:`evaluate` looks at in a value, at most (else: :data:`CANNOT_TELL`).  Not
#: a ceiling on input: past it the model reads the value as unknown and lists every pickle
#: torch may read next (the cautious reading), so it costs precision, never a finding.
MAX_VALUE_OBJECTS: Final = 100_000


def evaluate(data: bytes, start: int, limits: Limits) -> tuple[object, int]:
    """The value of the pickle at ``data[start:]`` and where it ends, without running it.

    Globals come back as inert stand-in classes (their ``module`` and ``name``
    say which); a value that holds a call's result, or a pickle ptfile's
    unpickler cannot read, is :data:`CANNOT_TELL`.  The end is -1 when the
    pickle cannot be walked at all.
    """
    hooks = _StandIns()
    try:
        value, end = unpickle(data, hash_work=True, find_class=hooks.find_class,
                              persistent_load=hooks.persistent_load, limits=limits,
                              start=start, encoding="utf-8", errors="surrogateescape")
    except PtfileError:
        try:
            return CANNOT_TELL, check_stream(data, limits, start=start).end
        except PtfileError:
            return CANNOT_TELL, -1
    return (value if _inert(value, [MAX_VALUE_OBJECTS]) else CANNOT_TELL), end


def next_starts(data: bytes, start: int, end: int, limits: Limits) -> tuple[int, ...]:
    """Where the next pickle starts after the one at ``start`` that ends at ``end``: just
    after ``STOP``, and at the end of the frame ``STOP`` is in when that comes later
    (module docstring)."""
    if _FRAME not in data[start:end]:
        return (end,)
    frame_end = -1
    try:
        for op in genops(data, start, limits=limits):
            if op.opcode.name == "FRAME":
                frame_end = op.pos + 9 + int(op.arg)  # type: ignore[call-overload]
    except PtfileError:
        return (end,)
    return (end, frame_end) if frame_end > end else (end,)


def _stream(data: bytes, limits: Limits, count: int, loaders: Callable[[int], tuple[str, ...]],
            expected: dict[int, object], label: str = "#") -> list[Region]:
    """The pickles read in a row from byte 0: at most ``count``; pickle ``i`` must equal
    ``expected[i]`` (when the model can tell) for the next to be read."""
    regions: list[Region] = []
    starts: Iterable[int] = (0,)
    for i in range(count):
        following: list[int] = []
        for start in starts:
            regions.append(Region(start, f"{label}{i}", loaders(i)))
            if i + 1 == count or start >= len(data):
                continue
            value, end = evaluate(data, start, limits)
            want = expected.get(i, CANNOT_TELL)
            if end < 0 or (want is not CANNOT_TELL and value is not CANNOT_TELL
                           and not (type(value) is int and value == want)):
                continue  # torch raises here, or the pickle cannot be walked
            following.extend(at for at in next_starts(data, start, end, limits)
                             if at < len(data) and at not in following)
        # Each pickle has at most two next starts (a frame may fork them: module
        # docstring), so the last of LEGACY_PICKLES steps has at most 16: all are kept.
        starts = following
        if not starts:
            break
    return regions


def legacy_stream(data: bytes, limits: Limits) -> list[Region]:
    """The pickles ``torch.load`` unpickles of a legacy stream (``data``: the file's first
    bytes), in order: five in a row from byte 0 (module docstring).  The first is also
    ``pickle.load``'s."""
    def loaders(i: int) -> tuple[str, ...]:
        both = (TORCH_LOAD_UNSAFE, TORCH_LOAD)
        return (*both, PICKLE_LOAD) if i == 0 else both

    return _stream(data, limits, LEGACY_PICKLES, loaders,
                   {0: LEGACY_MAGIC, 1: LEGACY_PROTOCOL_VERSION})
