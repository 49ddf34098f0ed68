"""Every ceiling ptfile applies to untrusted input, in one frozen dataclass.

Each count, length and offset read from a file is checked against one of these
before it is used or anything is allocated for it.  The defaults admit every
real checkpoint we know of (the largest public ones have ~10^6 tensors and
multi-hundred-GiB storages) while keeping memory bounded by the file size plus
a small constant.

While a pickle is unpickled, the :class:`Limits` it was given are the *active*
ones (:func:`active`, a :class:`contextvars.ContextVar`): the objects built
during unpickling (tensors check ``max_ndim``) read them there instead of every
constructor taking a ``limits`` argument.  Outside any load the defaults apply.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_LIMITS", "Limits", "active", "applied"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Ceilings for untrusted input.  Override any of them with ``Limits(name=value)``."""

    #: Size of one pickle (``data.pkl``).  Real state dicts of a million tensors
    #: pickle to ~100 MiB; 2 GiB leaves a wide margin.
    max_pickle_bytes: int = 2**31
    #: Opcodes in one pickle: a pickle cannot have more opcodes than bytes, so
    #: this only matters when the byte ceiling is raised.
    max_opcodes: int = 2**31
    #: Memo index: a valid memo index is below the number of opcodes seen so
    #: far; anything larger would make the unpickler allocate a huge memo table.
    max_memo_index: int = 2**31
    #: Nesting of MARKs (tuples/lists/dicts under construction at once), and
    #: of tuples in tuples (hashing a tuple recurses in C without a depth
    #: check).  torch state dicts nest < 10 deep; deep nesting is only an attack.
    max_depth: int = 1000
    #: Records in one archive.  torch handles ~10^6-tensor checkpoints.
    max_records: int = 10_000_000
    #: Length of one record name or pickle GLOBAL line.
    max_name_length: int = 65_535
    #: Rank of a tensor.  numpy arrays have at most 64 dimensions, so ranks above
    #: 64 are refused whatever this says (torch 2.13 loads them).
    max_ndim: int = 64
    #: Distinct dict/set keys of one pickle that may share one hash value.
    #: Colliding keys make each insertion probe all earlier ones (quadratic
    #: time: int keys ``k * (2**61 - 1)`` all hash to 0); real files have none.
    max_hash_collisions: int = 1000
    #: Bytes of objects CPython's unpickler may allocate for one pickle, as the scanner
    #: estimates them (:mod:`ptfile.picklevm.symbolic`: every object built, the memo
    #: table, the stack, what allowlisted constructors copy, a length a cut-short literal
    #: claims).  ``load`` and the C unpickler under torch do not copy for a memo ``GET``,
    #: so a pickle costs about 6 bytes of objects per byte (a 10^6-tensor state dict:
    #: ~0.6 GiB); a pickle built to exhaust memory (an ``EMPTY_SET`` per byte, copies of
    #: one big string, ``bytearray(10**10)``, ``LONG_BINPUT 10**9``) goes far past it.
    #: Above it, scan reports a dangerous ``hazard`` (``memory``).
    max_unpickled_bytes: int = 2**32
    #: Tuple hashes the dict and set keys of one pickle may cost in CPython (a tuple's
    #: hash is not cached: a key of shared tuples ``t(n+1) = (tn, tn)`` costs
    #: ``2**n``; CPython 3.11 does ~6*10^7 per second).  Above it, scan reports a
    #: dangerous ``hazard`` (``hash-work``).
    max_hash_steps: int = 10**8
    #: Bytes a compressed (deflated) record may inflate to per compressed byte, plus
    #: 1 MiB.  torch writes no compressed records; a ZIP tool re-packing a checkpoint
    #: shrinks real weights less than 2x, and only long runs of one byte value (zero
    #: buffers) shrink by more.  A zip bomb inflates ~1000x.
    max_inflate_ratio: int = 64
    #: Bytes ptfile downloads whole from a server that cannot serve byte ranges (it
    #: then needs the whole file even for metadata); 0 refuses such servers.
    max_whole_download_bytes: int = 2**36
    #: Length of one safetensors JSON header (:mod:`ptfile.formats.safetensors`): the
    #: safetensors library's own ceiling, which torch.load of a ``.safetensors`` applies.
    max_safetensors_header_bytes: int = 100_000_000
    #: Characters of one TorchScript ``code/`` record that :func:`ptfile.scan` parses
    #: (its bytes decoded; at most its size).  torch writes one record per module class,
    #: a few KiB each; Python's parser takes ~130x the source in memory and ~2.5 s per
    #: MiB.  Above it, the record is ``dangerous`` (not read).
    max_torchscript_code_bytes: int = 2**22
    #: Tokens of one statement of a TorchScript ``code/`` record that :func:`ptfile.scan`
    #: hands to Python's parser.  A chain of 200,000 trailers (``a.b.b.b...``) or unary
    #: operators overflows the C stack of Python 3.10's parser (a crash, measured; 60,000
    #: parse); torch's serialized statements have tens of tokens.  Above it, the record is
    #: ``dangerous`` (not parsed).
    max_torchscript_statement_tokens: int = 20_000
    #: Module visits while a whole pickled ``nn.Module``'s state dict is collected
    #: (:func:`ptfile.state_dict`, :func:`ptfile.open` of ``torch.save(model)``): a
    #: submodule reached by two names is walked once per name, as torch lists it, so a
    #: pickle of shared chains asks for ``2**depth`` visits; real models have fewer than
    #: 10^5 modules.  Above it: ``LimitExceededError``.
    max_module_visits: int = 1_000_000
    #: Nesting of a TorchScript archive's module tree (a submodule's submodule ...): real
    #: models nest fewer than 20 deep, and the walk recurses once per level, so this keeps
    #: it far from Python's recursion limit.  Above it: ``LimitExceededError``.
    max_module_depth: int = 200
    #: Address space reserved for the thread that unpickles one pickle.  Hashing tuples
    #: nested in tuples recurses in C (~256 bytes of stack a level), and a pickle of ``n``
    #: tuple opcodes may nest them ``n`` deep, so a stack sized for that is reserved
    #: (pages are touched only by a real deep recursion): ~64 MiB of pickle at the
    #: default.  Above it: ``LimitExceededError``.
    max_stack_bytes: int = 16 << 30
    #: Depth of payloads inside payloads that :func:`ptfile.scan` follows (a pickle in a
    #: byte string in a pickle, a ZIP after a record's ``STOP`` ...); torch files nest
    #: none.  Deeper: a dangerous ``nested`` finding.
    max_scan_nesting: int = 4
    #: Nested payloads (constants, heads after ``STOP``) :func:`ptfile.scan` scans per
    #: file: each is smaller than what holds it, but a pickle of a million tiny ones
    #: would take minutes.  Beyond it: an ``unknown`` ``limit`` finding (``nested-scans``),
    #: the rest not scanned.
    max_nested_scans: int = 10_000
    #: Places after a record's ``STOP`` (past the pickles that follow it directly) where
    #: :func:`ptfile.scan` tries a pickle or a ZIP; torch writes nothing there.  Beyond
    #: it: an ``unknown`` ``limit`` finding, the rest not searched.
    max_trailing_probes: int = 64
    #: Pickles :func:`ptfile.scan` searches for in one tar member (a legacy tar holds
    #: one per member).  Beyond it: an ``unknown`` ``limit`` finding, the rest not searched.
    max_tar_pickles: int = 4096
    #: Local headers :func:`ptfile.scan` reads in the gaps between a ZIP's records
    #: (``shadow-record`` anomalies; torch leaves no gaps, a hostile file may hold
    #: millions).  Beyond it: an ``unknown`` ``limit`` anomaly, the rest not read.
    max_shadow_records: int = 64
    #: Gap bytes :func:`ptfile.scan` searches for those local headers, over the whole
    #: archive.  Beyond it: an ``unknown`` ``limit`` anomaly, the rest not searched.
    max_shadow_search_bytes: int = 1 << 26
    #: Bytes of a JSON file read as part of a checkpoint folder: a Hugging Face index
    #: (``*.index.json``: tensor names to shard files, :mod:`ptfile.formats.inputs`; a
    #: 400B-parameter model's is under 2 MiB), a ``trainer_state.json``.
    max_json_bytes: int = 1 << 26

DEFAULT_LIMITS: Final = Limits()


_ACTIVE: Final[contextvars.ContextVar[Limits]] = contextvars.ContextVar(
    "ptfile_limits", default=DEFAULT_LIMITS)


#: ``active()``: the limits of the load in progress in this context (the defaults
#: outside one).  The ContextVar's own C-level ``get``, so checks made once per
#: tensor pay no Python call for it.
active: Final[Callable[[], Limits]] = _ACTIVE.get


@contextlib.contextmanager
def applied(limits: Limits) -> Iterator[None]:
    """Make ``limits`` the :func:`active` ones inside a ``with`` block."""
    token = _ACTIVE.set(limits)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
