"""TorchScript archives (``torch.jit.save``), read without running any TorchScript.

Layout (``pt-format.md`` §10; verified against torch 2.13).  A TorchScript
archive is a torch ZIP archive (same writer, prefix, padding and metadata
records as :mod:`.zipped`) that holds a ``constants.pkl`` record:

* ``data.pkl`` — the module tree.  Every module and scripted class object is
  ``GLOBAL '__torch__.<path> <Class>' EMPTY_TUPLE NEWOBJ <state> BUILD`` with the
  attribute dict as state (``training``, ``_is_full_backward_hook``,
  parameters, buffers, submodules, plain attributes).  Tensors are
  ``_rebuild_tensor_v2`` of persistent ids ``('storage', torch.<ScalarType>Storage,
  key, location, numel)``: the storage class is named after c10's ScalarType
  for **every** dtype (``UInt16Storage``, ``Float8_e4m3fnStorage``…), never
  ``UntypedStorage``.  Typed containers go through
  ``torch.jit._pickle.build_{int,double,bool,tensor}list`` and
  ``restore_type_tag(value, 'Dict[str, int]')``.
* ``data/<key>`` — storages of ``data.pkl``; ``constants/<key>`` — storages of
  ``constants.pkl``, a tuple of the code's tensor constants.
* ``code/<path>.py`` — the TorchScript source of each class; the class
  ``__torch__.a.b.C`` is ``class C(...)`` in ``code/__torch__/a/b.py``.  A module
  class lists its parameters and buffers as ``__parameters__ = ["w", ]`` and
  ``__buffers__ = ["b", ]``: the pickle alone cannot tell a parameter from a
  plain tensor attribute.  ``code/*.debug_pkl`` hold source ranges (ignored).
* ``extra/<name>`` — the ``_extra_files`` given to ``torch.jit.save``.

A reader MUST NOT execute TorchScript: ptfile turns every ``__torch__.*`` object
into an inert :class:`ScriptObject` (class name plus attributes), implements the
``torch.jit._pickle`` helpers itself, and reads ``__parameters__``/``__buffers__``
from the code by matching lines, never by evaluating them.  The state dict a
reader returns MUST equal ``torch.jit.load(f).state_dict()``: for each module,
depth first, its parameters then its buffers (attribute order, ``None`` skipped;
non-persistent buffers included, as TorchScript does not record persistence),
then its submodules, with detached tensors (``requires_grad=False``) and an
``_metadata`` of ``{'version': 1}`` per module.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, cast

from .. import dtypes
from .._io import Source
from ..archive import ZipReader
from ..errors import FormatError
from ..picklevm import unpickle
from ..rebuild import StorageType
from ..tensor import Tensor
from .detection import Detected
from .options import FindClass, ReadOptions
from .storages import StorageLoader
from .zipinfo import read_info

__all__ = ["ScriptObject", "TorchScriptArchive", "read_script_state_dict", "read_torchscript"]

_CLASS_LINE: Final = re.compile(r"^class (\w+)\((\w*)\):\s*$", re.MULTILINE)
_LIST_LINE: Final = re.compile(r"^  (__parameters__|__buffers__) = \[(.*)\]\s*$", re.MULTILINE)
_QUOTED: Final = re.compile(r'"(\w+)"')
#: Module trees nest a few levels (real models < 20); deeper is damage or an attack,
#: and this bound keeps the recursive walk far from Python's recursion limit.
MAX_MODULE_DEPTH: Final = 200


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

    def state_dict(self) -> OrderedDict[str, Tensor]:
        """The flat ``name -> tensor`` dict ``torch.jit.load(f).state_dict()`` returns.

        Raises
        ------
        FormatError
            The module tree is cyclic or nested beyond 200 levels.
        """
        out: OrderedDict[str, Tensor] = OrderedDict()
        metadata: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._collect(self.module, "", out, metadata, ())
        out._metadata = metadata  # type: ignore[attr-defined]
        return out

    def _collect(self, module: ScriptObject, prefix: str, out: OrderedDict[str, Tensor],
                 metadata: dict[str, dict[str, int]], path: tuple[int, ...]) -> None:
        if id(module) in path or len(path) > MAX_MODULE_DEPTH:
            raise FormatError(f"the module tree is cyclic or too deep at {prefix!r:.100}")
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
                self._collect(value, f"{prefix}{name}.", out, metadata, (*path, id(module)))

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
                              f"{[t.__name__ for t in self.items]}, got {data!r:.80}")
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


def script_find_class(base: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """``find_class`` for TorchScript pickles: its own names first, then ``base``'s policy.

    ``__torch__.*`` classes become per-load :class:`ScriptObject` subclasses;
    ``torch.<ScalarType>Storage`` names every dtype's storage.
    """
    made: dict[str, type[ScriptObject]] = {}

    def find_class(module: str, name: str) -> Any:
        if module == "__torch__" or module.startswith("__torch__."):
            qualified = f"{module}.{name}"
            if qualified not in made:
                made[qualified] = type(name, (ScriptObject,),
                                       {"__slots__": (), "qualified_name": qualified})
            return made[qualified]
        helper = JIT_GLOBALS.get((module, name))
        if helper is not None:
            return helper
        if module == "torch" and name.endswith("Storage") and name != "UntypedStorage":
            return StorageType("torch", name, dtypes.by_storage(name))
        return base(module, name)

    return find_class


# --------------------------------------------------------------------------- reading

def _texts(reader: ZipReader, folder: str, suffix: str) -> dict[str, bytes]:
    start = f"{reader.prefix}/{folder}/"
    return {r.name[len(start):]: reader.read(r) for r in reader.records
            if r.name.startswith(start) and r.name.endswith(suffix)}


def _decode(code: dict[str, bytes]) -> dict[str, str]:
    try:
        return {path: data.decode("utf-8") for path, data in code.items()}
    except UnicodeDecodeError as exc:
        raise FormatError(f"TorchScript source is not UTF-8: {exc}") from None


def _unpickle_record(reader: ZipReader, name: str, storages: StorageLoader,
                     find_class: FindClass, options: ReadOptions) -> Any:
    full = f"{reader.prefix}/{name}"
    if reader.get(full) is None:
        raise FormatError(f"the TorchScript archive has no {name} record", member=full)
    obj, _ = unpickle(reader.read(full), find_class=find_class, persistent_load=storages,
                      limits=options.limits, encoding=options.encoding)
    return obj


def read_torchscript(source: Source, detected: Detected,
                     options: ReadOptions) -> TorchScriptArchive:
    """Read a TorchScript archive: module tree, constants, code and extra files.

    The storages of ``data.pkl`` (``data/``) and ``constants.pkl``
    (``constants/``) are loaded by the one ZIP storage loader
    (:class:`~ptfile.formats.storages.StorageLoader`): compressed records are
    inflated, a mapped source is sliced on first use, and
    ``calculate_storage_offsets`` applies, as for ``torch.save`` archives.

    Raises
    ------
    FormatError
        A record is missing or malformed; the root is not a TorchScript object.
    StorageError
        A storage record disagrees with its persistent id.
    UnsafeGlobalError
        A global is neither TorchScript's nor allowed by ``options.find_class``.
    """
    reader = detected.zip_reader()
    info = read_info(reader, options.settings)
    policy = script_find_class(options.find_class)
    pickles = {}
    for name, folder in (("data.pkl", "data"), ("constants.pkl", "constants")):
        storages = StorageLoader(reader, source, info, map_location=options.map_location,
                                 skip_data=options.skip_data, folder=folder,
                                 calculate_offsets=options.settings.calculate_storage_offsets)
        pickles[name] = _unpickle_record(reader, name, storages, policy, options)
    module, constants = pickles["data.pkl"], pickles["constants.pkl"]
    if not isinstance(module, ScriptObject) or not isinstance(constants, tuple):
        raise FormatError(f"data.pkl must hold a TorchScript object and constants.pkl a tuple, "
                          f"got {type(module).__name__} and {type(constants).__name__}")
    code = _decode(_texts(reader, "code", ".py"))
    return TorchScriptArchive(module=module, constants=constants, code=code,
                              extra=_texts(reader, "extra", ""), classes=parse_classes(code),
                              version=info.version, byteorder=info.byteorder)


def read_script_state_dict(source: Source, detected: Detected, options: ReadOptions) -> Any:
    """What :func:`ptfile.load` returns for a TorchScript archive: its state dict."""
    return read_torchscript(source, detected, options).state_dict()
