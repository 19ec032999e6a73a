"""``RemoteFile``: a seekable, read-only raw file over one object, read with ranged requests."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from energon_ray.storage.errors import ObjectNotFoundError

if TYPE_CHECKING:
    from energon_ray.storage.path import RemotePath


class RemoteFile(io.RawIOBase):
    """The raw file under :meth:`RemotePath.open`.

    Sequential reads fetch a growing window (1 MiB doubling to 16 MiB), so scanning a tar streams it
    in few requests, while a seek far ahead (over a large member) starts a fresh 1 MiB window there
    instead of downloading the bytes skipped.
    """

    MIN_WINDOW = 1 << 20
    MAX_WINDOW = 16 << 20

    def __init__(self, path: RemotePath):
        super().__init__()
        found = path.head()
        if found is None:
            raise ObjectNotFoundError(str(path), "no such object")
        self.path = path
        self.size, self.etag = found
        self._pos = 0
        self._buf = b""
        self._buf_start = 0
        self._window = self.MIN_WINDOW

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._pos >= self.size or not len(view):
            return 0
        end_of_buf = self._buf_start + len(self._buf)
        if not (self._buf_start <= self._pos < end_of_buf):
            sequential = self._pos == end_of_buf
            self._window = min(self.MAX_WINDOW, self._window * 2) if sequential else self.MIN_WINDOW
            stop = min(self.size, self._pos + max(self._window, len(view)))
            self._buf = self.path.read_range(self._pos, stop - self._pos)
            self._buf_start = self._pos
        at = self._pos - self._buf_start
        n = min(len(view), len(self._buf) - at)
        view[:n] = self._buf[at : at + n]
        self._pos += n
        return n
