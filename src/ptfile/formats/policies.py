"""Every ``find_class`` policy, in one place: how the global names a pickle holds become objects.

The restricted unpickler (:mod:`ptfile.picklevm.unpickler`) resolves every
``GLOBAL``/``STACK_GLOBAL``/``INST`` name through the ``find_class`` its caller
gives it.  Which one is a policy decision, and every policy is made here, from
one mechanism (:class:`Overlay`: exact names, then handlers by module root,
then a base policy) over the allowlist and registry of :mod:`ptfile.allowlist.policy`
(which holds the lookups, not the policies):

==================  ==========================================================  ======================
policy              resolves                                                    used by
==================  ==========================================================  ======================
:func:`strict`      torch's weights-only allowlist (:mod:`ptfile.allowlist.rebuild`) and  ``load``, ``open``
                    :func:`ptfile.add_safe_globals`; else ``UnsafeGlobalError``
:func:`fast`        :func:`strict`, with per-load fast ``_rebuild_tensor_v2``   the ZIP bulk path
                    and ``_v3`` (:func:`.storages.fast_tensor_builders`)
:func:`script`      TorchScript's own names (``__torch__.*`` classes as inert   TorchScript archives
                    :class:`~.script_model.ScriptObject` types, the
                    ``torch.jit._pickle`` helpers, ``torch.<ScalarType>Storage``
                    for every dtype), then a base policy
:func:`structural`  the allowlist and registry, else an inert per-load          ``load(structural=True)``
                    stand-in class (:mod:`ptfile.allowlist.structural`)
:func:`plain`       nothing: any global is damage                               legacy header pickles
:func:`numpy_values` :data:`ptfile.NUMPY_GLOBALS` (numpy values as data), then a   a DCP checkpoint's
                    base policy                                                 non-tensor items
:func:`deepspeed`   DeepSpeed's checkpoint classes as inert records             the files of a ZeRO
                    (:mod:`.deepspeed`), then a base policy                     checkpoint
:func:`dcp`         exactly the names a DCP ``.metadata`` holds                 ``ptfile.load_dcp``
                    (:mod:`.dcp_metadata`: torch's dataclasses as per-load
                    records, ``torch.Size``, dtypes, the layout,
                    the path classes of every Python); else
                    ``UnsafeGlobalError``
==================  ==========================================================  ======================

A front door asks for a policy by name (:class:`~.options.Policy`, the ``policy`` of
:class:`~.options.ReadOptions`: strict or structural); a reader makes it with :func:`make`,
which also chooses the fast form of the strict policy for the ZIP bulk path
(``bulk=True``).  No reader tells policies apart by the identity of a function.

Whatever a policy returns, a stream can call and ``BUILD`` on it: policies only
hand out allowlisted objects wrapped against ``BUILD`` (:class:`ptfile.allowlist.policy.CallOnly`),
stateless helpers, or classes made for one load, so nothing a stream does
outlives the load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ..allowlist.policy import NUMPY_GLOBALS, CallOnly, find_allowed, find_strict_class
from ..allowlist.rebuild import StorageType
from ..allowlist.structural import StandInType, make_stand_in
from ..errors import FormatError, PickleStreamError, UnsafeGlobalError, UnsupportedFeatureError
from ..model import dtypes
from . import dcp_metadata
from . import deepspeed as deepspeed_classes
from .options import FindClass, Policy
from .script_model import JIT_GLOBALS, ScriptObject
from .storages import fast_tensor_builders

__all__ = ["Lenient", "Overlay", "StructuralFindClass", "dcp", "deepspeed", "fast", "make", "numpy_values", "plain",
           "script", "strict", "structural"]

#: A handler for the names of one module root: an object, or None to defer to the base.
RootHandler = Callable[[str, str], Any]


class Overlay:
    """A ``find_class`` in layers: ``names`` (exact ``(module, name)`` keys), then the
    handler for the module's root in ``roots`` (None from it defers), then ``base``.

    Examples
    --------
    >>> find = Overlay(plain, names={("m", "f"): len})
    >>> find("m", "f") is len
    True
    """

    __slots__ = ("_base", "_names", "_roots")

    def __init__(self, base: FindClass, names: Mapping[tuple[str, str], Any] | None = None,
                 roots: Mapping[str, RootHandler] | None = None) -> None:
        self._base = base
        self._names = dict(names or {})
        self._roots = dict(roots or {})

    def __call__(self, module: str, name: str) -> Any:
        found = self._names.get((module, name))
        if found is not None:
            return found
        handler = self._roots.get(module.partition(".")[0])
        if handler is not None:
            found = handler(module, name)
            if found is not None:
                return found
        return self._base(module, name)


def strict() -> FindClass:
    """torch's weights-only policy: :func:`ptfile.allowlist.policy.find_strict_class` itself."""
    return find_strict_class


def fast() -> FindClass:
    """:func:`strict`, with this load's fast tensor constructors (wrapped against ``BUILD``
    like the allowlist's own functions, so a stream meets the same refusals on both)."""
    builders = {key: CallOnly(fn) for key, fn in fast_tensor_builders().items()}
    return Overlay(find_strict_class, names=builders)


def plain(module: str, name: str) -> Any:
    """The policy of pickles that hold plain values only: every global is damage.

    Raises
    ------
    FormatError
        Always.
    """
    raise FormatError(f"this pickle holds only plain values, not the global {module}.{name}")


class _ScriptClasses:
    """``__torch__.*`` names: one inert :class:`ScriptObject` subclass per name and load."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[str, type[ScriptObject]] = {}

    def __call__(self, module: str, name: str) -> type[ScriptObject] | None:
        if module != "__torch__" and not module.startswith("__torch__."):
            return None
        qualified = f"{module}.{name}"
        cls = self._made.get(qualified)
        if cls is None:
            cls = self._made[qualified] = type(name, (ScriptObject,),
                                               {"__slots__": (), "qualified_name": qualified})
        return cls


def _script_storage(module: str, name: str) -> StorageType | None:
    """``torch.<ScalarType>Storage``: TorchScript names every dtype's storage class so."""
    if module == "torch" and name.endswith("Storage") and name != "UntypedStorage":
        return StorageType("torch", name, dtypes.by_storage(name))
    return None


def script(base: FindClass) -> FindClass:
    """TorchScript's names (per load), then ``base``'s policy."""
    return Overlay(base, names=JIT_GLOBALS,
                   roots={"__torch__": _ScriptClasses(), "torch": _script_storage})


class Lenient(CallOnly):
    """An allowlisted function that, given arguments it cannot rebuild, records the call.

    A whole-model pickle may hand ptfile's rebuild functions stand-ins (a tensor
    subclass, a nested tensor): the strict policy refuses those, the structural
    one keeps the call as a :class:`~ptfile.StandIn` of the global's name.
    Limits and storage damage still raise.
    """

    __slots__ = ("_record",)
    _record: StandInType

    def __new__(cls, function: CallOnly, record: StandInType) -> Lenient:  # noqa: PYI034
        self = super().__new__(cls, function.func)
        self._record = record
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.func(*args, **kwargs)
        except (PickleStreamError, UnsupportedFeatureError, TypeError):
            return self._record(*args, **kwargs)


class StructuralFindClass:
    """``find_class`` of the structural policy: allowlist/registry, else a per-load stand-in.

    Examples
    --------
    >>> find = StructuralFindClass()
    >>> find("os", "system")
    <stand-in class os.system>
    >>> find("os", "system") is find("os", "system")
    True
    """

    def __init__(self) -> None:
        self._made: dict[tuple[str, str], StandInType] = {}
        self._lenient: dict[tuple[str, str], Lenient] = {}

    def _stand_in(self, module: str, name: str) -> StandInType:
        cls = self._made.get((module, name))
        if cls is None:
            cls = self._made[module, name] = make_stand_in(module, name)
        return cls

    def __call__(self, module: str, name: str) -> Any:
        found = find_allowed(module, name)
        if found is None:
            return self._stand_in(module, name)
        if not isinstance(found, CallOnly):
            return found
        lenient = self._lenient.get((module, name))
        if lenient is None:
            lenient = Lenient(found, self._stand_in(module, name))
            self._lenient[module, name] = lenient
        return lenient


def structural() -> FindClass:
    """The structural policy, fresh for one load."""
    return StructuralFindClass()


#: :data:`ptfile.NUMPY_GLOBALS` by ``(module, name)``, as :class:`Overlay` looks names up.
_NUMPY_NAMES: Final = {(qualified.rpartition(".")[0], qualified.rpartition(".")[2]): value
                       for qualified, value in NUMPY_GLOBALS.items()}


def numpy_values(base: FindClass) -> FindClass:
    """``base``'s policy with numpy values read as data (:data:`ptfile.NUMPY_GLOBALS`'s inert
    rebuilders, never numpy's pickle code): how a DCP checkpoint's non-tensor items are
    read, which torch's DCP loader unpickles with ``weights_only=False``.

    Examples
    --------
    >>> numpy_values(strict())("numpy", "dtype") is NUMPY_GLOBALS["numpy.dtype"]
    True
    """
    return Overlay(base, names=_NUMPY_NAMES)



def _not_dcp(module: str, name: str) -> Any:
    raise UnsafeGlobalError(
        f"{module}.{name} is not one of the names a torch.distributed.checkpoint .metadata "
        "file holds; ptfile refuses it", module=module, name=name)


def dcp() -> FindClass:
    """The ``.metadata`` policy of DCP directories, fresh for one load: torch's DCP dataclasses
    as :class:`~.dcp_metadata.Record` classes made for this load, and its few helpers.

    Examples
    --------
    >>> find = dcp()
    >>> find("torch", "Size")((2, 3))
    (2, 3)
    >>> try:
    ...     find("os", "system")
    ... except UnsafeGlobalError as error:
    ...     print(error.module, error.name)
    os system
    """
    names: dict[tuple[str, str], Any] = {
        key: type(key[1], (dcp_metadata.Record,), {"__slots__": (), "name": key[1]})
        for key in dcp_metadata.DCP_CLASSES}
    names.update({("torch", d.name): d for d in dtypes.DTYPES.values()})
    names.update({
        ("torch", "Size"): CallOnly(dcp_metadata.size),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"):
            CallOnly(dcp_metadata.mem_format),
        ("torch.serialization", "_get_layout"): CallOnly(dcp_metadata.layout),
    })
    names.update({(p.module, p.name): CallOnly(p.join) for p in dcp_metadata.PATH_CLASSES})
    return Overlay(_not_dcp, names=names)


def deepspeed(base: FindClass) -> FindClass:
    """``base``'s policy with DeepSpeed's checkpoint classes read as inert data, fresh for
    one load (:mod:`.deepspeed`): how a ZeRO checkpoint's files are read.

    Examples
    --------
    >>> find = deepspeed(strict())
    >>> find("deepspeed.runtime.zero.config", "ZeroStageEnum")(2)
    2
    >>> find("deepspeed.utils.tensor_fragment", "fragment_address")
    <class 'ptfile.formats.deepspeed.fragment_address'>
    """
    names: dict[tuple[str, str], Any] = dict(deepspeed_classes.record_classes())
    names[deepspeed_classes.ZERO_STAGE] = CallOnly(deepspeed_classes.zero_stage)
    return Overlay(base, names=names)


#: Each named policy: its ``find_class`` maker, and the maker of its bulk form (the ZIP
#: reader's fast tensor constructors; the structural policy has none).
_MAKERS: dict[Policy, tuple[Callable[[], FindClass], Callable[[], FindClass]]] = {
    Policy.STRICT: (strict, fast),
    Policy.STRUCTURAL: (structural, structural),
    Policy.STRICT_NUMPY: (lambda: numpy_values(strict()), lambda: numpy_values(strict())),
    Policy.STRUCTURAL_NUMPY: (lambda: numpy_values(structural()),
                              lambda: numpy_values(structural())),
    Policy.STRICT_DEEPSPEED: (lambda: deepspeed(strict()), lambda: deepspeed(fast())),
    Policy.STRUCTURAL_DEEPSPEED: (lambda: deepspeed(structural()),
                                  lambda: deepspeed(structural())),
}


def make(policy: Policy, *, bulk: bool = False) -> FindClass:
    """The ``find_class`` of the named ``policy``, fresh for one read; ``bulk``: its form
    for the ZIP reader's bulk path (:func:`fast` for the strict policy).

    Examples
    --------
    >>> make(Policy.STRICT) is strict()
    True
    >>> isinstance(make(Policy.STRUCTURAL, bulk=True), StructuralFindClass)
    True
    """
    return _MAKERS[policy][bulk]()
