"""Two costs of CPython's unpickler that no opcode-level rule bounds: hash floods, deep tuples.

Hash flooding
-------------
Distinct dict or set keys that hash alike make every insertion probe all the
earlier ones: ``n`` keys cost ``n**2 / 2`` comparisons (int keys
``k * (2**61 - 1)`` all hash to 0; ``complex`` and tuple keys can be solved for
any hash).  Small ints, strings and bytes cannot flood: ints below ``2**61 - 1``
hash to themselves and str/bytes hashes are randomised per process.  Every
flooding key needs its own *wide* number literal (``LONG1`` of 8 bytes or more,
``LONG4``, ``BINFLOAT``, or protocol 0's text numbers), so
:func:`~ptfile.picklevm.check_stream` counts those, and only a stream with
more of them than ``Limits.max_hash_collisions`` is walked by
:func:`check_number_keys` (the symbolic machine, which hashes every key it can
know without running anything and counts distinct keys per hash value).

Deep tuples
-----------
Hashing a tuple recurses in C with no depth check: a dict key nested some
hundred thousand tuples deep (``TUPLE1`` repeated) overflows the C stack and
kills the process.  A tuple cannot nest deeper than the number of tuple-building
opcodes in its stream, and each nesting level of the recursion takes well under
:data:`STACK_BYTES_PER_LEVEL` bytes.  :func:`call_with_stack` therefore runs the
unpickler inline when the stream's tuple-opcode bytes bound the depth below what
any thread's stack holds, and otherwise in a thread whose stack is sized for the
bound (address space only: pages are touched only by a real deep recursion).
A bound needing more than ``Limits.max_stack_bytes`` is refused.  The result is
then checked (:func:`run_unpickler`): a tuple nested more than
:data:`DEEP_TUPLE_LEVELS` deep inside its containers is refused, because the
caller's own code would crash hashing it.  Only builtin containers are walked,
and only when the stream's bound allows such depth at all (bigger files), so
the check costs a few percent of a large load and nothing on small ones.
"""

from __future__ import annotations

import contextvars
import itertools
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

from ..errors import LimitExceededError
from ..limits import Limits, active
from ._walk import Buffer
from .decoder import genops
from .symbolic import trace

__all__ = ["call_with_stack", "check_hash_work", "check_number_keys", "deepest_tuple",
           "hash_work", "run_unpickler", "stack_bytes_for"]

T = TypeVar("T")

#: C stack bytes per level of tuple hashing (measured ~50-80 on CPython 3.11 x86-64).
STACK_BYTES_PER_LEVEL: Final = 256
#: Stacks at most this big are assumed available inline (threads get 8 MiB by default
#: on Linux; the main thread as much).
INLINE_STACK_BYTES: Final = 2 << 20
_TUPLE_OPCODES: Final = (b"\x85", b"\x86", b"\x87", b"t")
#: Every byte but the tuple opcodes: what ``bytes.translate`` deletes to count them in one
#: pass (3 ms on a 10.9 MB pickle, against 12 ms for four ``count`` passes).
_NOT_TUPLE_OPCODES: Final = bytes(c for c in range(256) if bytes([c]) not in _TUPLE_OPCODES)
_STACK_LOCK: Final = threading.Lock()


def stack_bytes_for(stream: bytes) -> int:
    """C stack the hashing of any tuple the stream can build may need (an upper bound).

    Examples
    --------
    >>> stack_bytes_for(b"\\x80\\x02K\\x01\\x85.")
    256
    """
    levels = len(stream.translate(None, _NOT_TUPLE_OPCODES))
    return levels * STACK_BYTES_PER_LEVEL


def call_with_stack(function: Callable[[], T], stack_bytes: int) -> T:
    """``function()``, on a thread with at least ``stack_bytes`` of C stack when that is large.

    The caller's context variables are visible inside; exceptions propagate.

    Raises
    ------
    LimitExceededError
        The stack would exceed the active ``Limits.max_stack_bytes``
        (:func:`ptfile.limits.active`), or the thread cannot start.
    """
    if stack_bytes <= INLINE_STACK_BYTES:
        return function()
    size = max(stack_bytes + (8 << 20), 32 << 20)
    most = active().max_stack_bytes
    if size > most:
        raise LimitExceededError("max_stack_bytes", most, size,
                                 f"the C stack for {stack_bytes // STACK_BYTES_PER_LEVEL} "
                                 "tuple-building opcodes (each may nest a tuple one deeper)")
    results: list[T] = []
    errors: list[BaseException] = []
    context = contextvars.copy_context()

    def run() -> None:
        try:
            results.append(context.run(function))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    with _STACK_LOCK:  # threading.stack_size is process-wide
        previous = threading.stack_size(size)
        try:
            worker = threading.Thread(target=run, name="ptfile-unpickle", daemon=True)
            worker.start()
        except (RuntimeError, ValueError, MemoryError) as exc:
            raise LimitExceededError("max_depth", 0, stack_bytes // STACK_BYTES_PER_LEVEL,
                                     f"a {size >> 20} MiB unpickling stack ({exc})") from exc
        finally:
            threading.stack_size(previous)
    worker.join()
    if errors:
        raise errors[0]
    return results[0]


#: Tuples nested deeper than this are refused after unpickling: hashing one later (in
#: the caller's code, on an 8 MiB stack) could overflow the C stack.
DEEP_TUPLE_LEVELS: Final = 50_000
_CONTAINERS: Final = (dict, tuple, list, set, frozenset)


def tuple_height(root: tuple[object, ...], heights: dict[int, int],
                 cap: int | None = None) -> int:
    """Nesting of tuples in tuples under ``root`` (what tuple hashing recurses through).

    With ``cap``, the walk stops as soon as the open path of nested tuples is longer
    than ``cap`` and returns ``cap + 1``: a chain of 10^6 tuples costs ``cap`` steps, not
    10^6.  ``heights`` (the memo shared between calls) is then unfinished; the caller
    refuses the object and drops it.
    """
    stack: list[tuple[tuple[object, ...], bool]] = [(root, False)]
    limit, open_path = (cap if cap is not None else sys.maxsize), 0
    while stack:
        t, done = stack.pop()
        if done:
            open_path -= 1
            heights[id(t)] = 1 + max((heights[id(c)] for c in t if type(c) is tuple), default=0)
        elif id(t) not in heights:
            heights[id(t)] = 0  # tuples alone cannot form cycles: final before the parent
            open_path += 1
            if open_path > limit:
                return limit + 1
            stack.append((t, True))
            stack.extend((c, False) for c in t if type(c) is tuple and id(c) not in heights)
    return heights[id(root)]


def deepest_tuple(root: object, cap: int | None = None) -> int:
    """The deepest tuple nesting in the containers (tuple, list, dict, set) under ``root``.

    With ``cap``, any nesting deeper than ``cap`` returns early, as ``cap + 1``.

    Examples
    --------
    >>> deepest_tuple({"a": [((1,),)]})
    2
    >>> deepest_tuple(((((1,),),),), cap=2)
    3
    """
    seen: set[int] = set()
    heights: dict[int, int] = {}
    deepest, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            parts: tuple[Iterable[object], ...] = (obj, obj.values(), vars(obj).values()) \
                if hasattr(obj, "__dict__") else (obj, obj.values())
        elif isinstance(obj, (tuple, list, set, frozenset)):
            parts = (obj,)
        else:
            continue
        if type(obj) is tuple:
            deepest = max(deepest, tuple_height(obj, heights, cap))
            if cap is not None and deepest > cap:
                return deepest
        kinds = set().union(*(map(type, part) for part in parts))
        if not any(issubclass(kind, _CONTAINERS) for kind in kinds):
            continue  # no container among them (a state dict of 10^5 tensors): C-level check
        for child in itertools.chain(*parts):
            # Only containers have children to walk; anything else would be popped and
            # skipped, so it is never pushed.
            if isinstance(child, _CONTAINERS) and id(child) not in seen:
                seen.add(id(child))
                stack.append(child)
    return deepest


def run_unpickler(load: Callable[[], T], stream: bytes, *, hash_work: bool = False) -> T:
    """``load()`` on a stack sized for ``stream``'s tuples; refuse results nested too deep.

    With ``hash_work``, first refuse a stream whose dict/set keys of shared tuples would
    hash for more than ``Limits.max_hash_steps`` (:func:`check_hash_work`).  The scanner
    asks for it (a CI gate must never hang); ``load`` does not yet: the walk decodes
    every opcode in Python, ~10x a state dict's whole load (torch.load hangs on such a
    key too).  Moving the count into :func:`check_stream`'s exact gear would make it
    cheap enough for ``load``.

    Raises
    ------
    LimitExceededError
        The stack would be too big (see :func:`call_with_stack`), or the result
        holds tuples nested more than :data:`DEEP_TUPLE_LEVELS` deep.
    """
    if hash_work:
        check_hash_work(stream, active())
    stack_bytes = stack_bytes_for(stream)
    result = call_with_stack(load, stack_bytes)
    if stack_bytes // STACK_BYTES_PER_LEVEL > DEEP_TUPLE_LEVELS:
        depth = deepest_tuple(result, DEEP_TUPLE_LEVELS)
        if depth > DEEP_TUPLE_LEVELS:
            raise LimitExceededError("max_depth", DEEP_TUPLE_LEVELS, depth,
                                     "tuples nested in tuples, at least this deep (hashing one would overflow "
                                     "the C stack)")
    return result


def check_number_keys(data: Buffer, start: int, limits: Limits) -> None:
    """Refuse a stream whose dict/set keys flood one hash value, or whose keys nest too deep.

    Raises
    ------
    LimitExceededError
        More than ``limits.max_hash_collisions`` distinct keys share a hash value
        (``max_hash_collisions``), or tuples nest deeper than ``limits.max_depth``.
    """
    info = trace(data, start, limits=limits)
    if info.max_collisions > limits.max_hash_collisions:
        raise LimitExceededError("max_hash_collisions", limits.max_hash_collisions,
                                 info.max_collisions,
                                 f"dict/set keys sharing one hash value in the pickle at {start:#x}")


_SHARING_OPCODES: Final = (b"h", b"j", b"g", b"2")  # BINGET, LONG_BINGET, GET, DUP
_KEYED: Final = frozenset({"SETITEM", "SETITEMS", "DICT", "ADDITEMS", "FROZENSET", "APPEND",
                           "APPENDS", "LIST"})
_CALLS: Final = frozenset({"REDUCE", "NEWOBJ", "NEWOBJ_EX", "OBJ", "INST", "BUILD"})
_POPS: Final = {"POP": 1, "STACK_GLOBAL": 2, "BINPERSID": 1}
_PUSH_NOTHING: Final = frozenset({"PROTO", "FRAME", "STOP", "READONLY_BUFFER", "POP"})


def hash_work(stream: bytes, cap: int) -> int:
    """Tuple hashes CPython may make unpickling ``stream`` (an upper bound), or ``cap + 1``.

    Hashing a tuple hashes each of its items and caches nothing
    (``Objects/tupleobject.c``): a tuple costs 1 plus its items' costs, an item
    shared by memo ``GET``/``DUP`` counted once per reference.  Each tuple's cost is
    computed once, as it is built (linear in the stream), and the walk adds the
    cost of every item put into a dict, set, frozenset or list (a list may be handed
    to ``set()``) and of every call's arguments (a call may hash them).  Streams
    without a tuple opcode or without a memo fetch cannot share a tuple: 0.
    """
    if not any(code in stream for code in _TUPLE_OPCODES) \
            or not any(code in stream for code in _SHARING_OPCODES):
        return 0
    limit = cap + 1
    stack: list[int] = []  # the hash cost of each stack item (0: not a tuple)
    marks: list[int] = []
    memo: dict[object, int] = {}
    total = 0
    for op in genops(stream):
        name = op.opcode.name
        at = marks[-1] if marks and op.opcode.pops_mark else None
        if name == "MARK":
            marks.append(len(stack))
        elif name in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE"):
            n = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "EMPTY_TUPLE": 0}.get(name)
            begin = len(stack) - n if n is not None else (marks.pop() if marks else 0)
            cost = min(1 + sum(stack[max(begin, 0):]), limit) if name != "EMPTY_TUPLE" else 0
            del stack[max(begin, 0):]
            stack.append(cost)
            if cost > cap:
                return limit
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo.get(op.arg, 0))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[op.arg] = stack[-1] if stack else 0
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else 0
        elif name == "DUP":
            stack.append(stack[-1] if stack else 0)
        elif name in _KEYED or name in _CALLS:
            if at is not None:
                marks.pop()
                items, begin = stack[at:], at
            else:
                n = {"SETITEM": 2, "APPEND": 1, "BUILD": 1, "REDUCE": 1, "NEWOBJ": 1,
                     "NEWOBJ_EX": 2}.get(name, 0)
                items, begin = stack[len(stack) - n:] if n else [], max(len(stack) - n, 0)
            work = sum(items[0::2]) if name in ("SETITEM", "SETITEMS", "DICT") else sum(items)
            total = min(total + work, limit)
            if total > cap:
                return limit
            del stack[begin:]
            if name in _CALLS:
                if name in ("REDUCE", "NEWOBJ", "NEWOBJ_EX") and stack:
                    stack.pop()  # the callable
                if name != "BUILD":
                    stack.append(min(work, limit))  # a tuple subclass may hash its items
            elif name in ("DICT", "FROZENSET", "LIST"):
                stack.append(0)
        elif at is not None:  # POP_MARK
            marks.pop()
            del stack[at:]
        else:
            pops = _POPS.get(name, 0)
            if pops:
                del stack[max(len(stack) - pops, 0):]
            if name not in _PUSH_NOTHING:
                stack.append(0)
    return total


def check_hash_work(stream: bytes, limits: Limits) -> None:
    """Refuse a stream whose unpickling may hash tuples more than ``limits.max_hash_steps``
    times (:func:`hash_work`): a key of shared tuples runs for ``2**levels`` steps.

    Raises
    ------
    LimitExceededError
        ``max_hash_steps``.
    """
    work = hash_work(stream, limits.max_hash_steps)
    if work > limits.max_hash_steps:
        raise LimitExceededError("max_hash_steps", limits.max_hash_steps, work,
                                 "tuple hashes (at least) the dict/set keys of shared tuples "
                                 "would cost")
