"""``python -m ptfile``: the ``ptfile`` command."""

from __future__ import annotations

import sys

from .cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
