"""What each of torch's loaders reads: the one model ``ptfile scan`` scans by.

``ptfile.load`` reads a checkpoint strictly and refuses what it cannot vouch for.
The scanner must not: its promise is about torch's readers, which are lenient
(names looked up ignoring case, tar headers accepted by their checksum, any key
types, reading on past records ptfile would refuse).  So for each real loader one
function here lists the byte ranges **that loader** would unpickle or run, with
that loader's leniency, and the scanner scans exactly those (a range two loaders
read is scanned once, its findings naming both).  Where the model cannot tell
what a loader would do with a record, the scanner reports it (``unknown`` or
``dangerous``), never passes it.

================================  =========================================  ==============
loader (:data:`LOADERS`)          what it unpickles or runs                  module
================================  =========================================  ==============
``torch.load`` on a ZIP           ``data.pkl`` and every record it names     :mod:`.zipfamily`
``torch.jit.load``                ``constants.pkl``, ``data.pkl``, the       :mod:`.zipfamily`
                                  ``code/`` sources it compiles
``_load_for_lite_interpreter``    ``bytecode.pkl`` (its operator table and   :mod:`.zipfamily`
                                  types), ``constants.pkl``, ``data.pkl``,
                                  the debug pickles
``torch.export.load``             records its configs mark ``use_pickle``,   :mod:`.zipfamily`
                                  opaque and custom constants, native code
``torch.load`` on a legacy tar    ``sys_info``, ``storages``, ``tensors``,    :mod:`.tar`
                                  ``pickle`` members, as ``tarfile`` reads
``torch.load`` on a stream        the five pickles at byte 0 (legacy)        :mod:`.stream`
``pickle.load``                   the pickle at byte 0 (and a second load's) :mod:`.stream`
================================  =========================================  ==============

Each finding of a scan carries the loaders that would run it
(:attr:`ptfile.scanning.Finding.loaders`, ``--json``'s ``loaders``).
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXPORT_LOAD", "JIT_LOAD", "LITE_LOAD", "LOADERS", "PICKLE_LOAD", "TORCH_LOAD",
           "TORCH_LOAD_UNSAFE"]

#: ``torch.load(f)``: weights-only, torch 2.6's default; it imports only its allowlist.
TORCH_LOAD: Final = "torch.load"
#: ``torch.load(f, weights_only=False)``: the full unpickler; what runs code.
TORCH_LOAD_UNSAFE: Final = "torch.load(weights_only=False)"
#: ``torch.jit.load(f)`` (and ``torch.load`` of a TorchScript archive, which hands it there).
JIT_LOAD: Final = "torch.jit.load"
#: ``torch.jit.mobile._load_for_lite_interpreter(f)``: the mobile (lite) interpreter.
LITE_LOAD: Final = "torch.jit.mobile._load_for_lite_interpreter"
#: ``torch.export.load(f)``.
EXPORT_LOAD: Final = "torch.export.load"
#: ``pickle.load(f)`` of the whole file.
PICKLE_LOAD: Final = "pickle.load"
#: Every loader the model knows, in the order findings list them.
LOADERS: Final = (TORCH_LOAD_UNSAFE, TORCH_LOAD, JIT_LOAD, LITE_LOAD, EXPORT_LOAD,
                   PICKLE_LOAD)
