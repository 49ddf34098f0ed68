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

from typing import Any

from .._io.local import Source
from ..archive import ZipReader
from ..errors import FormatError
from ..picklevm import unpickle
from .detection import Detected
from .options import FindClass, ReadOptions
from .policies import make, script
from .script_model import ScriptClass, ScriptObject, TorchScriptArchive, parse_classes
from .storages import StorageLoader
from .zipinfo import read_info

__all__ = ["ScriptClass", "ScriptObject", "TorchScriptArchive", "parse_classes",
           "read_script_state_dict", "read_torchscript"]


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
        A global is neither TorchScript's nor allowed by ``options.policy``.
    """
    reader = detected.zip_reader()
    info = read_info(reader, options.settings)
    policy = script(make(options.policy))
    pickles = {}
    for name, folder in (("data.pkl", "data"), ("constants.pkl", "constants")):
        storages = StorageLoader(reader, source, info, map_location=options.map_location,
                                 skip_data=options.skip_data, folder=folder,
                                 pickled_locations=False,
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
    return read_torchscript(source, detected, options).state_dict(options.limits)
