"""The inline dict-items loop (picklevm/pairs.py) writes what the generic handlers write.

The reference is the same graph pickled with a persistent_id hook that answers
None for everything: the hook must then see every object, so neither the
inline loop nor the one-step ViewReduce writer runs, and every node goes the
generic way (``ViewReduce.as_reduce``), which the pickler tests check against
CPython's C pickler.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptfile.errors import SaveError
from ptfile.picklevm import pairs
from ptfile.picklevm.pickler import Global, PersistentId, Reduce, ViewReduce, dumps, global_

V2 = global_("torch._utils", "_rebuild_tensor_v2")
FLOAT = global_("torch", "FloatStorage")
HALF = global_("torch", "HalfStorage")
STORAGE = "storage"
CPU = "cpu"


class Box:
    """Stands for a tensor: the reducer turns it into whatever ``result`` says."""

    def __init__(self, result: Any) -> None:
        self.result = result


def reducer(obj: object) -> object:
    if type(obj) is Box:
        return obj.result
    return None


def same_as_generic(graph: object, protocol: int = 2) -> bytes:
    fast = dumps(graph, protocol, reducer=reducer)
    generic = dumps(graph, protocol, reducer=reducer, persistent_id=lambda obj: None)
    assert fast == generic
    return fast


def other_object(text: str) -> str:
    """A str equal to ``text`` but not the same object (not interned)."""
    copy = "".join(list(text))
    assert copy is not text
    return copy


def view(key: str, *, shape: Any = (4,), stride: Any = (1,), offset: Any = 0, flag: Any = False,
         tail: Any = None, storage: Global = FLOAT, location: str = CPU, numel: Any = 4,
         func: Global = V2) -> ViewReduce:
    return ViewReduce(func, (STORAGE, storage, key, location, numel), offset, shape, stride, flag,
                      OrderedDict() if tail is None else tail)


def test_pairs_state_dict_of_views_is_the_generic_bytes() -> None:
    shape, stride = (2, 3), (3, 1)  # shared tuples, as a loaded checkpoint shares them
    graph = {f"layer.{i}.weight": Box(view(str(i), shape=shape, stride=stride, numel=6))
             for i in range(2500)}
    same_as_generic(graph)


def test_pairs_shared_keys_values_and_storages_are_fetched() -> None:
    key = "shared"  # one storage key str in many pids: BINGET after the first
    boxes = [Box(view(key, offset=i, numel=400)) for i in range(300)]
    graph: dict[object, object] = {f"k{i}": box for i, box in enumerate(boxes)}
    graph["again"] = boxes[5]  # a value met before: BINGET
    graph[key] = boxes[6]  # the storage key str as a dict key
    graph["first a key"] = 1
    graph["then a pid item"] = Box(view("first a key"))  # the same (interned) str
    graph["last"] = Box(view("x", shape=(1, 2, 3, 4, 5), stride=(120, 60, 20, 5, 1), numel=300))
    for protocol in (2, 3):
        same_as_generic(graph, protocol)


def test_pairs_other_keys_values_and_results_go_the_generic_way() -> None:
    boxes = {
        **{f"pad{i}": i for i in range(300)},  # memo indices past 256 first
        "list": [1, 2, Box(view("0"))],
        1: Box(view("1")),
        (1, 2): "tuple key",
        "reduce": Box(Reduce(global_("collections", "OrderedDict"), ())),
        "global": Box(global_("torch", "float32")),
        "pid": Box(PersistentId(("storage", FLOAT, "2", CPU, 1))),
        "odd shape": Box(view("3", shape=[4])),
        "empty shape": Box(view("4", shape=(), stride=())),
        "float in shape": Box(view("5", shape=(4.0,))),
        "big offset": Box(view("6", offset=2**40, numel=2**70)),
        "negative offset": Box(view("7", offset=-1)),
        "int flag": Box(view("8", flag=1)),
        "full tail": Box(view("9", tail=OrderedDict(a=1))),
        "none tail": Box(ViewReduce(V2, (STORAGE, FLOAT, "10", CPU, 4), 0, (4,), (1,), True, None)),
        "new global": Box(view("11", storage=HALF, location="cuda:0", func=global_("m", "f"))),
        "short pid": Box(ViewReduce(V2, (STORAGE,), 0, (4,), (1,), False, OrderedDict())),
        "int pid": Box(ViewReduce(V2, 7, 0, (4,), (1,), False, OrderedDict())),
        "empty pid": Box(ViewReduce(V2, (), 0, (4,), (1,), False, OrderedDict())),
        "pid of objects": Box(ViewReduce(V2, (STORAGE, (1, 2), 3.5), 0, (4,), (1,), False,
                                         OrderedDict())),
        "surrogate \udc80": Box(view("\udc81")),
        "é": Box(view("ü")),
    }
    for protocol in (2, 3):
        same_as_generic(boxes, protocol)


def test_pairs_tails_with_an_instance_dict_are_the_generic_bytes() -> None:
    touched: OrderedDict[object, object] = OrderedDict()
    assert not touched.__dict__  # made on this read: an empty instance dict, still a plain tail
    named: OrderedDict[object, object] = OrderedDict()
    named.note = 1  # type: ignore[attr-defined]  # state: written with BUILD
    tails = {"touched": touched, "named": named, "plain": OrderedDict()}
    graph = {f"pad{i}": i for i in range(300)}
    graph |= {name: Box(view(str(i), tail=tail)) for i, (name, tail) in enumerate(tails.items())}
    for protocol in (2, 3):
        fast = same_as_generic(graph, protocol)
        untouched = graph | {"touched": Box(view("0"))}
        assert fast == dumps(untouched, protocol, reducer=reducer)
        views = [box.result for box in graph.values() if type(box) is Box]
        assert dumps(views, protocol) == dumps([v.as_reduce() for v in views], protocol)


def test_pairs_and_views_leave_tails_without_an_instance_dict() -> None:
    # Reading __dict__ would attach an empty dict to every tail (10^5 in a checkpoint).
    tails: list[OrderedDict[object, object]] = [OrderedDict() for _ in range(4)]
    graph = {f"pad{i}": i for i in range(300)}
    graph |= {f"t{i}": Box(view(str(i), tail=tail)) for i, tail in enumerate(tails)}
    dumps(graph, reducer=reducer)
    dumps([view(str(i), tail=tail) for i, tail in enumerate(tails)])
    assert not any(gc.get_referents(tail) for tail in tails)


def test_pairs_views_alike_are_the_generic_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Views written from a template (the first view of their size tuple, here the
    # shared default (4,) of view()) and every way of not being alike it.
    layouts: list[int] = []

    def like_layout(*args: Any) -> Any:
        layouts.append(args[-1])
        return real(*args)

    real = pairs._like_layout
    monkeypatch.setattr(pairs, "_like_layout", like_layout)
    other = (2, 3)
    graph: dict[str, object] = {f"pad{i}": i for i in range(300)}
    for i in range(20):  # two shapes in turn: a template each
        graph[f"w{i}"] = Box(view(f"w{i}"))
        graph[f"b{i}"] = Box(view(f"b{i}", shape=other, stride=(3, 1), numel=6))
    for i in range(3):  # the fresh str elsewhere in the pid
        graph[f"first{i}"] = Box(ViewReduce(V2, (f"f{i}", FLOAT, STORAGE, CPU, 6), 0, other,
                                            (3, 1), False, OrderedDict()))
        graph[f"last{i}"] = Box(ViewReduce(V2, (STORAGE, FLOAT, CPU, 6, f"l{i}"), 0, other,
                                           (3, 1), False, OrderedDict()))
    unlike = {
        "storage met before": view("w3"),
        "equal str, other object": view("u0", location=other_object(CPU)),
        "other class": view("u1", storage=HALF),
        "equal numel, other object": view("u2", numel=int("4")),
        "flag": view("u4", flag=True),
        "int flag": view("u5", flag=0),
        "offset": view("u6", offset=1),
        "equal stride, other object": view("u7", stride=(int("1"),)),
        "float stride": view("u8", stride=(1.0,)),
        "full tail": view("u9", tail=OrderedDict(a=1)),
        "two fresh strs": view("u10", location=other_object("cuda:0")),
        "four items": ViewReduce(V2, (STORAGE, FLOAT, "u11", CPU), 0, (4,), (1,), False,
                                 OrderedDict()),
        "six items": ViewReduce(V2, (STORAGE, FLOAT, "u12", CPU, 4, 4), 0, (4,), (1,), False,
                                OrderedDict()),
        "tuple item": view("u13", numel=(4,)),
        "other func": view("u14", func=global_("m", "g")),
        "alike again": view("u15"),
    }
    for at, item in enumerate((STORAGE, FLOAT, CPU, 4)):  # each fixed item: an equal other
        copy = other_object(item) if type(item) is str else \
            Global(item.module, item.name) if type(item) is Global else int(str(item))
        pid = [STORAGE, FLOAT, CPU, 4]
        pid[at] = copy
        pid.insert(2, f"u{at + 16}")
        unlike[f"other item {at}"] = ViewReduce(V2, tuple(pid), 0, (4,), (1,), False,
                                                OrderedDict())
    graph |= {name: Box(node) for name, node in unlike.items()}
    graph |= {f"again {name}": graph[name] for name in ("w5", "b5", "first1", "last2")}
    for protocol in (2, 3):
        same_as_generic(graph, protocol)
    assert set(layouts) == {2, 3}  # the fresh strs' lengths: the templates were used


def test_pairs_a_value_that_memoises_itself_is_a_cycle() -> None:
    box = Box(None)
    inner: list[object] = [box]  # memoised before the box: the box meets itself through it
    box.result = ViewReduce(V2, (STORAGE, inner, "0", CPU, 4), 0, (4,), (1,), False, OrderedDict())
    graph = {f"pad{i}": i for i in range(300)} | {"cycle": box}
    same_as_generic(graph)


def test_pairs_errors_name_the_key() -> None:
    graph = {f"pad{i}": i for i in range(300)} | {"bad": Box(None)}
    with pytest.raises(SaveError) as info:
        dumps(graph, reducer=reducer)
    assert "while pickling the value of key 'bad'" in "".join(getattr(info.value, "__notes__", []))
    with pytest.raises(SaveError) as info:
        dumps(graph | {"bad": object()}, reducer=reducer)
    assert "'bad'" in "".join(getattr(info.value, "__notes__", []))


def test_pairs_reducer_errors_name_the_key() -> None:
    def failing(obj: object) -> object:
        raise SaveError("no")

    graph = {f"pad{i}": i for i in range(300)} | {"bad": Box(None)}
    with pytest.raises(SaveError) as info:
        dumps(graph, reducer=failing)
    assert "'bad'" in "".join(getattr(info.value, "__notes__", []))


_parts = st.sampled_from(["0", "1", "shared", "storage", "cpu"])
_shapes = st.sampled_from([(4,), (2, 3), (1, 2, 3, 4), (), (4.0,), [4], (2**40,)])


@st.composite
def _values(draw: st.DrawFn) -> object:
    kind = draw(st.sampled_from(["view", "view", "view", "int", "str", "reduce", "none"]))
    if kind == "view":
        return Box(view(draw(_parts), shape=draw(_shapes), stride=draw(_shapes),
                        offset=draw(st.sampled_from([0, 5, 300, -2, 2**33])),
                        flag=draw(st.sampled_from([False, True, 0])),
                        storage=draw(st.sampled_from([FLOAT, HALF])),
                        location=draw(st.sampled_from([CPU, "cuda:1"]))))
    if kind == "int":
        return draw(st.integers(-(2**40), 2**40))
    if kind == "str":
        return draw(_parts)
    if kind == "reduce":
        return Box(Reduce(global_("collections", "OrderedDict"), ()))
    return None


@pytest.mark.parametrize("pad", range(225, 262))
def test_views_across_the_binput_boundary(pad: int) -> None:
    # Memo indices reach 256 somewhere inside the last views: each PUT must be
    # BINPUT below 256 and LONG_BINPUT from 256 on, wherever the boundary falls
    # (index 255 for the args tuple was once written as LONG_BINPUT).
    graph: dict[str, object] = {f"pad{i}": i for i in range(pad)}
    graph["0"] = Box(Reduce(global_("collections", "OrderedDict"), ()))
    graph[""] = Box(view("0", shape=(4,), stride=(4,)))
    graph["x"] = Box(view("1", shape=(2, 3), stride=(3, 1), numel=6, offset=300))
    same_as_generic(graph)
    same_as_generic({f"p{i}": i for i in range(pad)} | {"v": Box(view("k"))})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(_parts, st.text(max_size=4), st.integers(0, 3)), _values()),
                max_size=400), st.integers(0, 300))
def test_pairs_random_dicts_are_the_generic_bytes(items: list[tuple[Any, Any]], pad: int) -> None:
    graph: dict[Any, Any] = {f"pad{i}": i for i in range(pad)}
    graph.update(items)
    same_as_generic(graph)
