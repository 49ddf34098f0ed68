"""``torch.export`` archives (``.pt2``) as the scanner reads them: the records torch unpickles.

A ``.pt2`` (:mod:`ptfile.formats.pt2`, /work/shared/spec/pt-format.md) holds
no ``.pkl`` record, yet ``torch.export.load`` (torch 2.13,
``torch/export/pt2_archive/_package.py``) unpickles some of its records, or
loads native code from them.  :func:`pt2_role` says which, by name (under the
archive folder):

``pickled`` (torch always unpickles it)
    ``data/constants/custom_obj_<i>`` (``torch._C._pickle_load_obj``: a
    TorchBind object), ``data/constants/opaque_obj_<i>`` (``pickle.loads``:
    an opaque object, any Python class), ``data/sample_inputs/<model>.pt``
    and the legacy ``data/weights/<model>.pt`` / ``data/constants/<model>.pt``
    (``torch.load``).
``maybe`` (torch unpickles it when the payload config says ``use_pickle``, or
    every record of ``data/weights/`` in an AOTInductor package)
    the other records of ``data/weights/`` and ``data/constants/``
    (``weight_<i>``, ``tensor_<i>``): raw tensor bytes, scanned only when they
    read as a pickle or a ZIP (``torch.load(..., weights_only=False)``).
``native`` (dangerous whatever it holds)
    shared libraries and sources under ``data/aotinductor/``: torch loads the
    compiled model (``AOTIModelPackageLoader``) and so runs native code.

JSON configs, ``models/*.json`` and ``extra/`` are data and are not scanned.
"""

from __future__ import annotations

import re
from typing import Final, Literal

__all__ = ["PT2_MARKER", "Role", "pt2_role"]

#: The record (under the archive folder) whose presence makes a ZIP a ``.pt2``.
PT2_MARKER: Final = "archive_format"

Role = Literal["pickled", "maybe", "native"]

#: (pattern on the name under the archive folder, role), first match wins.
_ROLES: Final[tuple[tuple[re.Pattern[str], Role], ...]] = (
    (re.compile(r"data/constants/(?:custom_obj_|opaque_obj_)[^/]*"), "pickled"),
    (re.compile(r"data/sample_inputs/[^/]+\.pt"), "pickled"),
    (re.compile(r"data/(?:weights|constants)/[^/]+\.pt"), "pickled"),
    (re.compile(r"data/(?:weights|constants)/[^/]+"), "maybe"),
    (re.compile(r"data/aotinductor/.+\.(?:so|dll|dylib|pyd|cpp|cu|o)"), "native"),
)
#: Roles of names that are no payload (configs): matched after the prefix is taken off.
_DATA_ONLY: Final = re.compile(r".+\.json")


def pt2_role(name: str) -> Role | None:
    """The role of record ``name`` (prefix included) in a ``.pt2`` archive, or None.

    Examples
    --------
    >>> pt2_role("archive/data/constants/opaque_obj_0"), pt2_role("archive/data/weights/weight_0")
    ('pickled', 'maybe')
    >>> pt2_role("archive/models/model.json") is None
    True
    """
    inner = name.split("/", 1)[-1]
    if _DATA_ONLY.fullmatch(inner):
        return None
    return next((role for pattern, role in _ROLES if pattern.fullmatch(inner)), None)
