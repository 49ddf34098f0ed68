"""``torch.export`` archives (``.pt2``) as the scanner reads them: by the loader model.

A ``.pt2`` (:mod:`ptfile.formats.pt2`, /work/shared/spec/pt-format.md) holds no
``.pkl`` record, yet ``torch.export.load`` hands some of its records to
``torch.load(weights_only=False)``, unpickles others with ``pickle.loads`` and
loads native code from ``data/aotinductor/``.  Which records is decided by its
payload configs, not by names or bytes: :func:`ptfile.scanning.loaders.zipfamily.
export_load_regions` reads them (the model of every ZIP loader), and the scanner
scans exactly what it lists.  This module names the finding kinds that model
leads to.
"""

from __future__ import annotations

from typing import Final

__all__ = ["NATIVE_CODE", "UNREADABLE_CONFIG"]

#: The finding kind of AOTInductor native code (dangerous whatever it holds).
NATIVE_CODE: Final = "native-code"
#: The anomaly code of a payload config the model could not read (every record is then
#: scanned as one ``torch.load`` may read; ``unknown``).
UNREADABLE_CONFIG: Final = "unreadable-pt2-config"
