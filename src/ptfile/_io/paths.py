"""The one place that tells a URL from a local path.

A URL is a scheme (RFC 3986 letters) and ``://``; every scheme but ``file`` is read by
fsspec (:mod:`ptfile._io.remote`, whose :func:`~ptfile._io.remote.local_path` turns a
``file://`` URL into its path).  Anything else that is a ``str`` or an
``os.PathLike`` is a local path.
"""

from __future__ import annotations

import os
import re
from typing import Final

__all__ = ["is_path", "is_url", "url_scheme"]


#: A URL: a scheme (RFC 3986 letters) and ``://``.
_URL: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def url_scheme(f: object) -> str | None:
    """The scheme of a URL string (``"s3"`` for ``"s3://b/k"``), else None.

    Examples
    --------
    >>> url_scheme("hf://user/repo/model.bin"), url_scheme("/tmp/model.pt")
    ('hf', None)
    """
    if not isinstance(f, str):
        return None
    match = _URL.match(f)
    return match.group(1).lower() if match else None


def is_url(f: object) -> bool:
    """True for a URL that fsspec must read (:mod:`ptfile._io.remote`): any scheme but
    ``file``, whose URLs name local paths."""
    scheme = url_scheme(f)
    return scheme is not None and scheme != "file"


def is_path(f: object) -> bool:
    """True for local paths: ``os.PathLike`` and ``str`` arguments that are not URLs."""
    return isinstance(f, os.PathLike) or (isinstance(f, str) and not is_url(f))
