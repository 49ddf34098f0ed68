"""The data model of a TorchScript archive, read as data (see :mod:`.torchscript`).

:class:`ScriptObject` is an inert ``__torch__.*`` object (class name plus the
attributes it was saved with), :class:`TorchScriptArchive` is everything an
archive holds, :func:`parse_classes` reads each class's ``__parameters__`` and
``__buffers__`` from ``code/`` by matching lines, and :data:`JIT_GLOBALS` are
ptfile's own stateless versions of the ``torch.jit._pickle`` helpers.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, cast

from ..errors import FormatError, LimitExceededError, brief
from ..limits import DEFAULT_LIMITS, Limits
from ..model.tensor import Tensor

__all__ = ["JIT_GLOBALS", "ScriptClass", "ScriptObject", "TorchScriptArchive", "parse_classes"]

_CLASS_LINE: Final = re.compile(r"^class (\w+)\((\w*)\):\s*$", re.MULTILINE)
_LIST_LINE: Final = re.compile(r"^  (__parameters__|__buffers__) = \[(.*)\]\s*$", re.MULTILINE)
_QUOTED: Final = re.compile(r'"(\w+)"')


class ScriptObject:
    """An inert TorchScript object: its class name and the attributes it was saved with.

    Attributes read as Python attributes (``m.weight``) or through
    :attr:`attributes`.  Objects whose class defines ``__getstate__`` keep that
    state, whatever its type, in :attr:`state`.
    """

    __slots__ = ("state",)
    #: The TorchScript class, e.g. ``__torch__.torch.nn.modules.linear.Linear``.
    qualified_name: ClassVar[str] = "__torch__"

    def __setstate__(self, state: object) -> None:
        if not isinstance(cast(object, self), ScriptObject):  # BUILD on the class itself
            raise FormatError("BUILD applied to a TorchScript class instead of an object")
        object.__setattr__(self, "state", state)

    @property
    def attributes(self) -> dict[str, Any]:
        """The saved attributes (empty when the state is not a dict)."""
        state = getattr(self, "state", None)
        return state if isinstance(state, dict) else {}

    @property
    def is_module(self) -> bool:
        """True for ``nn.Module`` objects (they carry a ``training`` flag)."""
        return "training" in self.attributes

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "state":
            raise AttributeError(name)
        try:
            return self.attributes[name]
        except KeyError:
            raise AttributeError(f"{self.qualified_name} object has no attribute {name!r}") \
                from None

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *map(str, self.attributes)})

    def __repr__(self) -> str:
        return f"<ptfile.ScriptObject {self.qualified_name} ({len(self.attributes)} attributes)>"


@dataclass(frozen=True, slots=True)
class ScriptClass:
    """What a class's code says about state: its parameter and buffer names."""

    is_module: bool
    parameters: tuple[str, ...] = ()
    buffers: tuple[str, ...] = ()


@dataclass(frozen=True)
class TorchScriptArchive:
    """Everything a TorchScript archive holds, as data (see :func:`ptfile.load_torchscript`)."""

    #: The root module, an inert :class:`ScriptObject` tree.
    module: ScriptObject
    #: ``constants.pkl``: the tensor constants the code refers to.
    constants: tuple[Any, ...]
    #: ``code/<path>.py`` sources by path under ``code/``.
    code: dict[str, str]
    #: ``extra/<name>`` files (``_extra_files`` of torch.jit.save) by name.
    extra: dict[str, bytes]
    #: Classes declared in the code, by qualified name.
    classes: dict[str, ScriptClass] = field(repr=False)
    version: int = 0
    byteorder: str = "little"

    def state_dict(self, limits: Limits | None = None) -> OrderedDict[str, Tensor]:
        """The flat ``name -> tensor`` dict ``torch.jit.load(f).state_dict()`` returns.

        Raises
        ------
        FormatError
            The module tree is cyclic.
        LimitExceededError
            The module tree nests deeper than ``limits.max_module_depth``.
        """
        out: OrderedDict[str, Tensor] = OrderedDict()
        metadata: OrderedDict[str, dict[str, int]] = OrderedDict()
        most = (limits or DEFAULT_LIMITS).max_module_depth
        self._collect(self.module, "", out, metadata, (), most)
        out._metadata = metadata  # type: ignore[attr-defined]
        return out

    def _collect(self, module: ScriptObject, prefix: str, out: OrderedDict[str, Tensor],
                 metadata: dict[str, dict[str, int]], path: tuple[int, ...], most: int) -> None:
        if id(module) in path:
            raise FormatError(f"the module tree is cyclic at {brief(prefix, 100)}")
        if len(path) > most:
            raise LimitExceededError("max_module_depth", most, len(path),
                                     f"module tree nesting at {brief(prefix, 100)}")
        metadata[prefix[:-1]] = {"version": 1}
        attrs = module.attributes
        info = self.classes.get(module.qualified_name)
        names = (*info.parameters, *info.buffers) if info is not None else \
            tuple(k for k, v in attrs.items() if isinstance(v, Tensor))
        for name in names:
            value = attrs.get(name)
            if isinstance(value, Tensor):
                out[prefix + name] = Tensor(value.storage, value._offset, value._shape,
                                            value._stride, dtype=value.dtype,
                                            metadata=value.metadata)
        for name, value in attrs.items():
            if isinstance(value, ScriptObject) and self._is_module(value):
                self._collect(value, f"{prefix}{name}.", out, metadata, (*path, id(module)),
                              most)

    def _is_module(self, obj: ScriptObject) -> bool:
        info = self.classes.get(obj.qualified_name)
        return info.is_module if info is not None else obj.is_module


# --------------------------------------------------------------------------- code

def parse_classes(code: dict[str, str]) -> dict[str, ScriptClass]:
    """Classes declared in ``code/`` sources, by matching lines (never evaluating them)."""
    classes: dict[str, ScriptClass] = {}
    for path, text in code.items():
        module = path[: -len(".py")].replace("/", ".")
        starts = list(_CLASS_LINE.finditer(text))
        for i, match in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
            lists = {m.group(1): tuple(_QUOTED.findall(m.group(2)))
                     for m in _LIST_LINE.finditer(text, match.end(), end)}
            classes[f"{module}.{match.group(1)}"] = ScriptClass(
                is_module=match.group(2) == "Module",
                parameters=lists.get("__parameters__", ()),
                buffers=lists.get("__buffers__", ()),
            )
    return classes


# --------------------------------------------------------------------------- globals

class _ListBuilder:
    """``torch.jit._pickle.build_*list``: the list itself, its items checked."""

    __slots__ = ()  # no state a BUILD opcode could change
    items: ClassVar[tuple[type, ...]] = ()

    def __call__(self, data: object) -> list[Any]:
        if not isinstance(data, list) or any(not isinstance(v, self.items) for v in data):
            raise FormatError(f"{type(self).__name__}: expected a list of "
                              f"{[t.__name__ for t in self.items]}, got {brief(data, 80)}")
        return data


class _IntList(_ListBuilder):
    __slots__ = ()
    items = (int,)


class _DoubleList(_ListBuilder):
    __slots__ = ()
    items = (float,)


class _BoolList(_ListBuilder):
    __slots__ = ()
    items = (bool,)


class _TensorList(_ListBuilder):
    __slots__ = ()
    items = (Tensor,)


class _RestoreTypeTag:
    """``torch.jit._pickle.restore_type_tag(value, type_str)``: the value, unchanged."""

    __slots__ = ()

    def __call__(self, value: object, type_str: object = None) -> object:
        return value


#: ``torch.jit._pickle`` helpers, as stateless callables.
JIT_GLOBALS: Final[dict[tuple[str, str], Callable[..., Any]]] = {
    ("torch.jit._pickle", "build_intlist"): _IntList(),
    ("torch.jit._pickle", "build_doublelist"): _DoubleList(),
    ("torch.jit._pickle", "build_boollist"): _BoolList(),
    ("torch.jit._pickle", "build_tensorlist"): _TensorList(),
    ("torch.jit._pickle", "restore_type_tag"): _RestoreTypeTag(),
}
