"""The tuple-depth check after unpickling stops at its cap instead of walking a whole chain."""

from __future__ import annotations

import pickle

from hypothesis import given
from hypothesis import strategies as st

from ptfile.picklevm.hazards import (
    DEEP_TUPLE_LEVELS,
    STACK_BYTES_PER_LEVEL,
    deepest_tuple,
    stack_bytes_for,
    tuple_height,
)

#: The opcodes that build a tuple: TUPLE1, TUPLE2, TUPLE3, TUPLE.
_TUPLE_CODES = (pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3, pickle.TUPLE)


@given(st.binary(max_size=2000))
def test_stack_bytes_count_every_tuple_opcode_byte(stream: bytes) -> None:
    """The stack bound counts every byte that could be a tuple opcode, wherever it lies."""
    levels = sum(stream.count(code) for code in _TUPLE_CODES)
    assert stack_bytes_for(stream) == levels * STACK_BYTES_PER_LEVEL


def test_stack_bytes_of_a_real_pickle() -> None:
    stream = pickle.dumps([(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((),)], protocol=2)
    assert stack_bytes_for(stream) == 5 * STACK_BYTES_PER_LEVEL


def _chain(n: int) -> tuple[object, ...]:
    t: tuple[object, ...] = (0,)
    for _ in range(n - 1):
        t = (t,)
    return t


def test_tuple_height_is_exact_without_cap() -> None:
    assert tuple_height(_chain(500), {}) == 500
    shared = _chain(3)
    assert tuple_height((shared, (shared,), 1), {}) == 5


def test_tuple_height_stops_after_cap_steps() -> None:
    heights: dict[int, int] = {}
    assert tuple_height(_chain(200_000), heights, cap=100) == 101
    # the walk touched cap + 1 tuples, not the 200,000 of the chain
    assert len(heights) == 101


def test_tuple_height_under_cap_is_exact() -> None:
    assert tuple_height(_chain(100), {}, cap=100) == 100


def test_deepest_tuple_returns_early_inside_containers() -> None:
    tree = {"a": [1, 2], "b": [{"c": _chain(DEEP_TUPLE_LEVELS + 10)}]}
    assert deepest_tuple(tree, cap=DEEP_TUPLE_LEVELS) == DEEP_TUPLE_LEVELS + 1
    assert deepest_tuple(tree) == DEEP_TUPLE_LEVELS + 10
    assert deepest_tuple({"x": [(1, (2,))]}, cap=5) == 2
