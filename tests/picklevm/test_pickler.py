"""The pickle writer is byte-identical to CPython's C pickler (``pickle.dumps``).

The oracle is ``pickle.dumps(x, protocol)`` for builtin graphs, and a C
``pickle.Pickler`` with ``reducer_override``/``persistent_id`` for graphs that
use the reducer and hooks.  torch is only imported by the test that compares
with a real ``data.pkl``.
"""

from __future__ import annotations

import doctest
import io
import math
import pickle
import pickletools
import struct
import sys
import zipfile
from collections import Counter, OrderedDict, defaultdict
from enum import IntEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptfile.errors import SaveError
from ptfile.picklevm import _codes as codes_module
from ptfile.picklevm import emitter as emitter_module
from ptfile.picklevm import pickler as pickler_module
from ptfile.picklevm.pickler import (
    BATCH_SIZE,
    SUPPORTED_PROTOCOLS,
    Global,
    PersistentId,
    Pickler,
    Reduce,
    ViewReduce,
    dumps,
    encode_int,
    global_,
)

PROTOCOLS = sorted(SUPPORTED_PROTOCOLS)
BATCH_SIZES = [0, 1, 2, 3, 999, 1000, 1001, 1999, 2000, 2001, 3000]


def assert_same_as_c(obj: object, protocol: int = 2) -> bytes:
    """Assert ``dumps(obj) == pickle.dumps(obj)`` and return the bytes."""
    expected = pickle.dumps(obj, protocol)
    actual = dumps(obj, protocol)
    if actual != expected:  # show the first difference as opcodes
        pytest.fail(f"ptfile:\n{_dis(actual)}\nCPython:\n{_dis(expected)}")
    return actual


def _dis(data: bytes) -> str:
    out = io.StringIO()
    try:
        pickletools.dis(data, out)
    except ValueError as exc:  # a broken stream still shows what came before
        out.write(f"<{exc}>")
    return out.getvalue()[:4000]


# -- tables ------------------------------------------------------------------------


def test_pickler_opcode_constants_match_pickletools() -> None:
    names = {op.name for op in pickletools.opcodes}
    consts = {k: v for k, v in vars(codes_module).items() if k in names}
    assert len(consts) == 47
    for op in pickletools.opcodes:
        if op.name in consts:
            assert consts[op.name] == op.code.encode("latin-1"), op.name


def test_pickler_batch_size_is_the_c_picklers() -> None:
    assert BATCH_SIZE == pickle._Pickler._BATCHSIZE == 1000  # type: ignore[attr-defined]


def test_pickler_handles_exactly_the_documented_types() -> None:
    builtins = {type(None), bool, int, float, str, bytes, bytearray, tuple, list, dict}
    builtins |= {set, frozenset, complex, OrderedDict, Counter}
    nodes = {Global, Reduce, PersistentId, ViewReduce}
    for protocol in PROTOCOLS:
        handlers = {**emitter_module.HANDLERS, **emitter_module.PROTOCOL_HANDLERS[protocol]}
        assert set(handlers) == builtins | nodes


def test_pickler_doctests() -> None:
    result = doctest.testmod(pickler_module)
    assert result.attempted >= 3
    assert result.failed == 0
    result = doctest.testmod(codes_module)
    assert result.attempted >= 1
    assert result.failed == 0


# -- atoms -----------------------------------------------------------------------

# fmt: off
INTS = [
    0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, -1, -128, -129, -256, -257,
    -(2**15), -(2**31), -(2**31) - 1, 2**63, -(2**63), -(2**63) - 1, 2**64,
    2**2039, 2**2040, -(2**2039), -(2**2040), -(2**2040) - 1, 2**2047 - 1, 2**2048, -(2**2048),
    3**5000, -(3**5000),
]
# fmt: on


def _int_id(value: int) -> str:
    return (
        hex(value) if abs(value) < 2**70 else f"{'-' if value < 0 else ''}{value.bit_length()}bits"
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("value", INTS, ids=_int_id)
def test_pickler_int_matches_c(value: int, protocol: int) -> None:
    assert_same_as_c(value, protocol)
    assert dumps(value)[2:-1] == encode_int(value)


FLOATS = [0.0, -0.0, 1.5, -2.25, 1e308, 5e-324, math.inf, -math.inf, math.nan, -math.nan]


@pytest.mark.parametrize("value", FLOATS)
def test_pickler_float_matches_c(value: float) -> None:
    assert_same_as_c(value)


def test_pickler_float_nan_payload_is_kept() -> None:
    odd_nan = struct.unpack(">d", b"\x7f\xf8\x00\x00\x00\x00\x12\x34")[0]
    assert dumps(odd_nan)[3:11] == b"\x7f\xf8\x00\x00\x00\x00\x12\x34"
    assert_same_as_c(odd_nan)


@pytest.mark.parametrize("value", [None, True, False, [None, True, False, None]])
def test_pickler_singletons_match_c(value: object) -> None:
    assert_same_as_c(value)


STRINGS = ["", "a", "latin1", "é", "€", "\U0001f600", "\ud800", "a\udfffb", "x" * 70000, "\x00\n"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("value", STRINGS, ids=range(len(STRINGS)))
def test_pickler_str_matches_c(value: str, protocol: int) -> None:
    assert_same_as_c(value, protocol)
    assert_same_as_c([value, value, (value,)], protocol)


BYTES = [b"", b"a", b"\xff", bytes(range(256)), b"x" * 255, b"y" * 256, b"z" * 70000]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("value", BYTES, ids=range(len(BYTES)))
def test_pickler_bytes_and_bytearray_match_c(value: bytes, protocol: int) -> None:
    assert_same_as_c(value, protocol)
    assert_same_as_c([value, value, bytearray(value), value], protocol)
    assert_same_as_c(bytearray(value), protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_bytes_reduction_shares_the_c_picklers_objects(protocol: int) -> None:
    # The latin-1 str of a 1-byte bytes is a cached 1-char str, and 'latin1' is the
    # interned literal, so both collide in the memo with equal user strings.
    one = bytes([97])
    assert_same_as_c([one, chr(97), "latin1", b"ab", b"cd", "latin1"], protocol)
    assert_same_as_c(["latin1", b"ab", sys.intern("latin1")], protocol)


# -- containers ------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_small_containers_match_c(protocol: int) -> None:
    shared = ("s", 1)
    od = OrderedDict(a=1, b=[2])
    od.attr = shared  # type: ignore[attr-defined]
    # fmt: off
    for value in [
        (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((),), [], [1], [1, 2], {}, {1: 2}, {1: 2, 3: 4},
        set(), {1}, {1, "a", (2,)}, frozenset(), frozenset({1, 2}),
        1 + 2j, -0.0j, complex(math.nan, math.inf), Counter(), Counter("abracadabra"),
        OrderedDict(), od, [shared, shared, (shared, shared), {"k": shared}], [od, od, {"od": od}],
    ]:
        assert_same_as_c(value, protocol)
    # fmt: on


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("size", BATCH_SIZES)
def test_pickler_list_batches_match_c(size: int, protocol: int) -> None:
    assert_same_as_c(list(range(size)), protocol)
    assert_same_as_c([str(i) for i in range(size)], protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("size", BATCH_SIZES)
def test_pickler_dict_batches_match_c(size: int, protocol: int) -> None:
    data = assert_same_as_c({i: -i for i in range(size)}, protocol)
    empty_batch = b"(u."  # MARK SETITEMS STOP
    assert data.endswith(empty_batch) == (size > 0 and size % 1000 == 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("size", BATCH_SIZES)
def test_pickler_ordered_dict_and_counter_batches_match_c(size: int, protocol: int) -> None:
    od = OrderedDict((str(i), i) for i in range(size))
    assert_same_as_c(od, protocol)
    od.extra = {"x": 1}  # type: ignore[attr-defined]
    assert_same_as_c(od, protocol)
    assert_same_as_c(Counter({str(i): i for i in range(size)}), protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("size", [0, 1, 2, 999, 1000, 1001, 2000])
def test_pickler_set_batches_match_c(size: int, protocol: int) -> None:
    assert_same_as_c(set(range(size)), protocol)
    assert_same_as_c(frozenset(range(size)), protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_memo_switches_to_long_binput_and_long_binget(protocol: int) -> None:
    shared = "shared"
    data = assert_same_as_c([shared, *[str(i) for i in range(300)], shared, (shared,)], protocol)
    assert (b"r" + (256).to_bytes(4, "little") in data) == (protocol < 4)  # 4+: MEMOIZE
    many = [[str(i)] for i in range(300)]
    assert_same_as_c([*many, *many], protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_recursive_containers_match_c(protocol: int) -> None:
    loop: list[object] = []
    loop.append(loop)
    assert_same_as_c(loop, protocol)
    d: dict[str, object] = {}
    d["self"] = d
    assert_same_as_c(d, protocol)
    for size in (1, 2, 3, 4, 7):
        inner: list[object] = []
        tup = (inner, *range(size - 1))
        inner.append(tup)
        assert_same_as_c(tup, protocol)  # POP per item (or POP_MARK) then BINGET
        assert_same_as_c(inner, protocol)
        assert_same_as_c([tup, inner], protocol)
    od: OrderedDict[str, object] = OrderedDict()
    od["me"] = od
    od.me_too = od  # type: ignore[attr-defined]
    assert_same_as_c(od, protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_moderate_nesting_matches_c(protocol: int) -> None:
    nested: object = []
    for i in range(200):
        nested = [nested, (nested, i), {"k": nested}]
    assert_same_as_c(nested, protocol)


def test_pickler_too_deep_nesting_raises_save_error() -> None:
    nested: object = None
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(SaveError, match="nested too deeply"):
        dumps(nested)


# -- hypothesis: arbitrary builtin graphs with shared references -----------------


def _text() -> st.SearchStrategy[str]:
    any_code_point = st.lists(st.integers(0, sys.maxunicode), max_size=6).map(
        lambda cps: "".join(map(chr, cps))
    )
    return st.text(max_size=8) | any_code_point | st.sampled_from(["latin1", "", "a"])


LEAVES: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(INTS),
    st.integers(-(2**3000), 2**3000),
    st.floats(),
    _text(),
    st.binary(max_size=300),
    st.binary(max_size=4).map(bytearray),
    st.complex_numbers(),
)


def _is_hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _build(draw: st.DrawFn, kind: str, pool: list[Any]) -> Any:
    items = draw(st.lists(st.sampled_from(pool), max_size=6))
    keys = [x for x in pool if _is_hashable(x)] or [0]
    pairs = draw(st.lists(st.tuples(st.sampled_from(keys), st.sampled_from(pool)), max_size=6))
    if kind in ("tuple", "list"):
        return tuple(items) if kind == "tuple" else list(items)
    if kind in ("set", "frozenset"):
        chosen = [x for x in items if _is_hashable(x)]
        return set(chosen) if kind == "set" else frozenset(chosen)
    if kind == "counter":
        return Counter({k: draw(st.integers(-5, 5)) for k, _ in pairs})
    if kind == "dict":
        return dict(pairs)
    ordered = OrderedDict(pairs)
    if kind == "odict+attrs":
        ordered.attr = draw(st.sampled_from(pool))  # type: ignore[attr-defined]
    return ordered


KINDS = ["tuple", "list", "dict", "set", "frozenset", "odict", "odict+attrs", "counter"]


@st.composite
def graphs(draw: st.DrawFn) -> Any:
    """Builtins nested up to a few levels, drawing items from a shared pool."""
    pool: list[Any] = draw(st.lists(LEAVES, min_size=1, max_size=6))
    for _ in range(draw(st.integers(0, 10))):
        pool.append(_build(draw, draw(st.sampled_from(KINDS)), pool))
    return pool[-1] if draw(st.booleans()) else pool


@st.composite
def cyclic_graphs(draw: st.DrawFn) -> Any:
    """A graph whose lists and dicts also contain themselves or their parents."""
    graph = draw(graphs())
    holders = [graph] if isinstance(graph, (list, dict)) else []
    holders += [x for x in (graph if isinstance(graph, list) else []) if isinstance(x, list)]
    for holder in holders:
        back = (holder, graph) if draw(st.booleans()) else (holder,) * draw(st.integers(1, 5))
        if isinstance(holder, list):
            holder.append(back)
        else:
            holder["back"] = back
    return graph


@pytest.mark.parametrize("protocol", PROTOCOLS)
@given(graph=graphs())
def test_pickler_matches_c_on_builtin_graphs(graph: Any, protocol: int) -> None:
    assert_same_as_c(graph, protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@given(graph=cyclic_graphs())
def test_pickler_matches_c_on_cyclic_graphs(graph: Any, protocol: int) -> None:
    try:
        pickle.dumps(graph, protocol)
    except RecursionError:  # a cycle through a Counter's fresh dict never ends
        with pytest.raises(SaveError, match="nested too deeply"):
            dumps(graph, protocol)
        return
    assert_same_as_c(graph, protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@given(size=st.sampled_from([999, 1000, 1001, 1999, 2000, 2001]), graph=graphs())
def test_pickler_matches_c_on_large_containers(size: int, graph: Any, protocol: int) -> None:
    pool = graph if isinstance(graph, list) and graph else [graph]
    items = [pool[i % len(pool)] for i in range(size)]
    keyed = {i: items[i] for i in range(size)}
    assert_same_as_c([items, keyed, OrderedDict(keyed), tuple(items)], protocol)


def _same(a: object, b: object) -> bool:
    """Equality with NaN equal to itself, types compared exactly, attributes included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, complex) and isinstance(b, complex):
        return _same(a.real, b.real) and _same(a.imag, b.imag)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return (
            len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a.items(), b.items(), strict=True))
            and _same(getattr(a, "__dict__", None), getattr(b, "__dict__", None))
        )
    if isinstance(a, (set, frozenset)) and isinstance(b, (set, frozenset)):
        return len(a) == len(b) and all(any(_same(x, y) for y in b) for x in a)
    return a == b


@given(graph=graphs())
def test_pickler_round_trips_through_pickle_loads(graph: Any) -> None:
    assert _same(pickle.loads(dumps(graph)), graph)


def test_pickler_keeps_shared_references_on_round_trip() -> None:
    shared = ["x"]
    back = pickle.loads(dumps({"a": shared, "b": (shared,)}))
    assert back["a"] is back["b"][0]


# -- nodes, reducer and persistent_id ----------------------------------------------


class Point:
    """Reduced by default with copyreg.__newobj__ and a state dict."""

    def __init__(self, x: object, y: object) -> None:
        self.x = x
        self.y = y


SHARED_ARGS = (1, "two", [3])


class Pair:
    """Reduced with copyreg.__newobj__ and arguments that are a shared tuple."""

    def __getnewargs__(self) -> tuple[object, ...]:
        return SHARED_ARGS


class Box:
    """Reduced by reducer_override to (Box, (content,)), memoised after REDUCE."""

    def __init__(self, content: object) -> None:
        self.content = content


def module_level_function() -> None:
    """Saved as a GLOBAL by the C pickler."""


def here(name: str) -> Global:
    return global_(__name__, name)


def ptfile_reducer(obj: object) -> Reduce | PersistentId | Global | None:
    """The ptfile equivalent of how the C pickler reduces this module's objects."""
    if type(obj) is Point:
        return Reduce(here("Point"), (), vars(obj), newobj=True)
    if type(obj) is Pair:
        return Reduce(here("Pair"), SHARED_ARGS, newobj=True)
    if type(obj) is Box:
        return Reduce(here("Box"), (obj.content,))
    if obj is module_level_function:
        return here("module_level_function")
    return None


class BoxPickler(pickle.Pickler):
    def reducer_override(self, obj: object) -> Any:
        if type(obj) is Box:
            return (Box, (obj.content,))
        return NotImplemented


def c_dumps(
    obj: object, pickler_class: type[pickle.Pickler] = BoxPickler, protocol: int = 2
) -> bytes:
    buf = io.BytesIO()
    pickler_class(buf, protocol).dump(obj)
    return buf.getvalue()


def test_global_is_interned_and_validated() -> None:
    assert global_("torch", "FloatStorage") is global_("torch", "FloatStorage")
    assert global_("torch", "FloatStorage") == Global("torch", "FloatStorage")
    for module, name in [("", "x"), ("m", ""), ("a\nb", "x"), ("m", "x\n")]:
        with pytest.raises(SaveError, match="newline"):
            global_(module, name)


def test_pickler_writes_globals_once_then_binget() -> None:
    od = global_("collections", "OrderedDict")
    data = dumps([od, od, Global("collections", "OrderedDict")])
    assert (
        data
        == b"\x80\x02]q\x00(ccollections\nOrderedDict\nq\x01h\x01ccollections\nOrderedDict\nq\x02e."
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_reducer_matches_c_newobj_reduce_and_global(protocol: int) -> None:
    point = Point(1, "y")
    box = Box([point, point])
    graph = [point, Pair(), SHARED_ARGS, box, box, module_level_function, module_level_function]
    assert dumps(graph, protocol, reducer=ptfile_reducer) == c_dumps(graph, protocol=protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_reduce_cycle_pops_and_fetches_like_c(protocol: int) -> None:
    content: list[object] = []
    box = Box(content)
    content.append(box)
    assert dumps(box, protocol, reducer=ptfile_reducer) == c_dumps(box, protocol=protocol)
    assert dumps([content, box], protocol, reducer=ptfile_reducer) == c_dumps(
        [content, box], protocol=protocol
    )


class ItemsPickler(pickle.Pickler):
    """Reduces Box objects with list items, dict items and state, like list/dict subclasses."""

    def reducer_override(self, obj: object) -> Any:
        if type(obj) is Box:
            content: Any = obj.content
            items, pairs, state = content
            return (Box, (), state, iter(items), iter(pairs))
        return NotImplemented


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("size", [0, 1, 2, 999, 1000, 1001, 2000, 2001])
def test_pickler_reduce_items_batches_match_c(size: int, protocol: int) -> None:
    items = [str(i) for i in range(size)]
    pairs = [(str(i), i) for i in range(size)]
    for state in (None, {"s": 1}):
        box = Box((items, pairs, state))
        node = Reduce(here("Box"), (), state, items, pairs)
        assert dumps(node, protocol) == c_dumps(box, ItemsPickler, protocol)
        assert dumps(Reduce(here("Box"), (), state, iter(items), iter(pairs))) == dumps(node)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_persistent_id_hook_matches_c(protocol: int) -> None:
    # The hook sees every object; a pid's own elements meet the hook, the pid does not.
    def hook(obj: object) -> object:
        if isinstance(obj, str) and obj.startswith("p:"):
            return ("pid", "p:" + obj[3:]) if len(obj) > 2 else ("pid",)
        return None

    class HookPickler(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return hook(obj)

    graph = {"a": "p:one", "b": ["p:two", ("p:one", 3)], "c": "plain"}
    assert dumps(graph, protocol, persistent_id=hook) == c_dumps(graph, HookPickler, protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_persistent_id_hook_sees_every_object(protocol: int) -> None:
    seen_c: list[type] = []
    seen: list[type] = []

    class RecordingPickler(pickle.Pickler):
        def persistent_id(self, obj: object) -> None:
            seen_c.append(type(obj))

    graph = [1, "s", (2.0, None), {"k": [True]}, OrderedDict(a=1)]
    c_dumps(graph, RecordingPickler, protocol)
    data = dumps(graph, protocol, persistent_id=lambda obj: seen.append(type(obj)))
    assert data == pickle.dumps(graph, protocol)
    # Where the C pickler sees the OrderedDict class, ptfile sees its Global node.
    assert [Global if t is type else t for t in seen_c] == seen


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pickler_persistent_id_node_and_reducer_pid(protocol: int) -> None:
    storage = object()

    class PidPickler(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return ("storage", "0") if obj is storage else None

    graph = [storage, storage, "storage"]
    expected = c_dumps(graph, PidPickler, protocol)

    def to_pid(obj: object) -> PersistentId | None:
        return PersistentId(("storage", "0")) if obj is storage else None

    assert dumps(graph, protocol, reducer=to_pid) == expected
    pids = [PersistentId(("storage", "0")), PersistentId(("storage", "0")), "storage"]
    assert dumps(pids, protocol) == expected


def test_pickler_resets_the_memo_per_dump() -> None:
    pickler = Pickler()
    shared = ["x"]
    assert pickler.dump(shared) == pickler.dump(shared) == pickle.dumps(shared, 2)


# -- errors ----------------------------------------------------------------------


class MyInt(IntEnum):
    ONE = 1


@pytest.mark.parametrize(
    "value",
    [
        object(),
        lambda: None,
        defaultdict(list),
        MyInt.ONE,
        type("S", (str,), {})("s"),
        type("OD", (OrderedDict,), {})(),
        range(3),
        Ellipsis,
        [1, {2: object()}],
    ],
    ids=[
        "object",
        "lambda",
        "defaultdict",
        "IntEnum",
        "str-subclass",
        "odict-subclass",
        "range",
        "Ellipsis",
        "nested",
    ],
)
def test_pickler_unsupported_objects_raise_save_error(value: object) -> None:
    with pytest.raises(SaveError, match="cannot pickle object of type") as info:
        dumps(value)
    assert isinstance(info.value, TypeError)
    with pytest.raises(SaveError, match="reducer returned None"):
        dumps(value, reducer=lambda obj: None)


def test_pickler_save_error_names_the_dict_key() -> None:
    with pytest.raises(SaveError) as info:
        dumps({"fine": 1, "model.weight": [object()]})
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == ["while pickling the value of key 'model.weight'"]


def test_pickler_reducer_returning_something_else_raises() -> None:
    with pytest.raises(SaveError, match="reducer returned tuple"):
        dumps(object(), reducer=lambda obj: (Global, ()))  # type: ignore[arg-type,return-value]


def test_pickler_bad_reduce_nodes_raise_save_error() -> None:
    func = global_("m", "f")
    with pytest.raises(SaveError, match="must be a tuple"):
        dumps(Reduce(func, [1]))  # type: ignore[arg-type]
    with pytest.raises(SaveError, match="2-tuples"):
        dumps(Reduce(func, (), dictitems=[(1, 2, 3)]))  # type: ignore[list-item]
    with pytest.raises(SaveError, match="2-tuples"):
        dumps(Reduce(func, (), dictitems=[[1, 2]]))  # type: ignore[list-item]


def test_pickler_non_ascii_global_needs_protocol_3() -> None:
    node = global_("modulé", "näme")
    with pytest.raises(SaveError, match="protocol 3"):
        dumps(node)
    assert dumps(node, 3) == b"\x80\x03c" + "modulé\nnäme\n".encode() + b"q\x00."


@pytest.mark.parametrize("protocol", [0, 1, 6, -1])
def test_pickler_unsupported_protocols_raise_save_error(protocol: int) -> None:
    with pytest.raises(SaveError, match="protocol"):
        Pickler(protocol)


def test_pickler_persistent_types_limit_the_hook_not_the_output() -> None:
    seen: list[type] = []

    def hook(obj: object) -> object:
        seen.append(type(obj))
        return ("box", obj.content) if type(obj) is Box else None

    graph = [Box(1), "s", (2, Box(3)), {"k": [Box(1)]}, OrderedDict(a=1)]
    for protocol in PROTOCOLS:
        everything = dumps(graph, protocol, persistent_id=hook)
        seen.clear()
        assert dumps(graph, protocol, persistent_id=hook, persistent_types=[Box]) == everything
        assert seen == [Box, Box, Box]


def test_pickler_view_reduce_is_its_reduce() -> None:
    shape = (2, 3)  # shared by two views, as is hooks: both written afresh each time
    hooks: OrderedDict[object, object] = OrderedDict()
    pid = (STORAGE, FLOAT_STORAGE, "0", CPU, 6)
    views = [
        ViewReduce(V2, pid, 0, shape, (3, 1), False, hooks),
        ViewReduce(V2, pid, 2**40, shape, (3, 1), True, hooks),
        ViewReduce(V2, (STORAGE, FLOAT_STORAGE, "1", "cuda:0", 2**70), 300, (), (), False,
                   OrderedDict([(1, 2)])),
        ViewReduce(V2, (STORAGE,), 0, (1, 2, 3, 4, 5), (True,), 1.5, None),  # odd parts
        ViewReduce(V2, (), -1, [1], (1,), None, OrderedDict()),
    ]
    reduces = [view.as_reduce() for view in views]
    for protocol in PROTOCOLS:
        assert dumps([views, views[0], shape], protocol) == dumps(
            [reduces, reduces[0], shape], protocol
        )
    # Without a way to skip the hook, the ViewReduce goes the Reduce way.
    assert dumps(views, persistent_id=lambda obj: None) == dumps(reduces)


# -- torch ---------------------------------------------------------------------

V2 = global_("torch._utils", "_rebuild_tensor_v2")
FLOAT_STORAGE = global_("torch", "FloatStorage")
ORDERED_DICT = global_("collections", "OrderedDict")
STORAGE = "storage"  # torch's constants: one object each, so BINGET after the first use
CPU = "cpu"


def tensor_node(key: str, shape: list[int], stride: list[int], numel: int) -> Reduce:
    """What torch's Tensor.__reduce_ex__ + persistent_id give for a float32 CPU tensor."""
    pid = PersistentId((STORAGE, FLOAT_STORAGE, key, CPU, numel))
    hooks = Reduce(ORDERED_DICT, ())  # a fresh OrderedDict() per tensor
    return Reduce(V2, (pid, 0, tuple(shape), tuple(stride), False, hooks))


def torch_data_pkl(obj: object) -> bytes:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(buf) as archive:
        return archive.read("archive/data.pkl")


def test_pickler_matches_torch_data_pkl_for_a_state_dict() -> None:
    torch = pytest.importorskip("torch")
    expected = torch_data_pkl({f"model.layers.{i}.weight": torch.randn(4) for i in range(1000)})
    graph = {f"model.layers.{i}.weight": tensor_node(str(i), [4], [1], 4) for i in range(1000)}
    assert dumps(graph) == expected


def test_pickler_matches_torch_data_pkl_for_module_state_dict() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    expected = torch_data_pkl(torch.nn.Linear(2, 1).state_dict())
    state: OrderedDict[str, object] = OrderedDict()
    state["weight"] = tensor_node("0", [1, 2], [2, 1], 2)
    state["bias"] = tensor_node("1", [1], [1], 1)
    state._metadata = OrderedDict([("", {"version": 1})])  # type: ignore[attr-defined]
    assert dumps(state) == expected
