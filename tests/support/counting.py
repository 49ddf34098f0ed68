"""A read-only file that counts the bytes handed out: what a lazy reader really read."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any


class CountingFile(io.RawIOBase):
    """A read-only file that counts the bytes handed out."""

    def __init__(self, path: Path) -> None:
        self._fp = path.open("rb")
        self.bytes_read = 0
        self.name = str(path)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fp.seek(offset, whence)

    def tell(self) -> int:
        return self._fp.tell()

    def read(self, n: int = -1) -> bytes:
        data = self._fp.read(n)
        self.bytes_read += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._fp.close()
        super().close()
