"""Size bounds for the parts webdataset's handlers would expand without one.

webdataset's ``gzfilter`` inflates a ``.gz`` part whole (``gzip.open(...).read()``), and its basic
handlers parse a ``json``/``txt``/``msgpack`` part, or allocate the array an ``npy`` header declares,
whatever their size: a few kilobytes of gzip (a decompression bomb) or a forged header were enough to
take a worker's memory. The handlers here are the same steps with a bound, ``max_part_bytes``:

- a ``.gz`` part is inflated in chunks of at most :data:`INFLATE_CHUNK` bytes and refused as soon as
  it passes the bound (never inflated whole first); as webdataset's filter, one ``.gz`` is removed and
  the rest of the name decides the decoder;
- a part a basic handler decodes (``json``, ``txt``, ``cls``, ``mp``, ``npy``, ``npz``, …) is refused
  when its bytes pass the bound, an ``npy`` also when its header declares a larger array, an ``npz``
  when its members declare more in all (each the larger of its inflated size, past which zipfile
  reads no member, and its npy header's array).

A refusal is :class:`~energon_ray.errors.MediaTooLargeError` naming the part, its size and the bound;
the loader adds shard and sample key and skips and counts the sample under its error policy.
Images and audio/video are left to their own limits (pixels, duration).
"""

from __future__ import annotations

import gzip
import io
import zipfile
from typing import Any, List, Optional

import numpy as np
import webdataset.autodecode as wds_decode

from energon_ray.errors import MediaTooLargeError

#: Default bound on one part's bytes after decompression (512 MiB): no sane sample part comes near it.
DEFAULT_MAX_PART_BYTES = 512 * 1024 * 1024
#: Most bytes inflated per step of a ``.gz`` part.
INFLATE_CHUNK = 1024 * 1024

_HOW = "raise it with SampleDecoder(max_part_bytes=...) (None: no limit)"


def _refuse(part: str, what: str, limit: int) -> MediaTooLargeError:
    return MediaTooLargeError(f"{part}: {what}, over the limit of {limit:,} bytes per part (max_part_bytes); {_HOW}")


def inflate_gzip(part: str, data: bytes, limit: Optional[int]) -> bytes:
    """The inflated bytes of the gzip ``data`` of ``part``, read in bounded chunks.

    Raises:
        MediaTooLargeError: once more than ``limit`` bytes came out (the rest is never inflated).
        OSError, EOFError: for bytes that are not (complete) gzip, as ``gzip`` raises them.

    Example:
        >>> inflate_gzip("txt.gz", gzip.compress(b"hi"), 10)
        b'hi'
    """
    chunks: List[bytes] = []
    total = 0
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
        while True:
            chunk = stream.read(INFLATE_CHUNK)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if limit is not None and total > limit:
                raise _refuse(part, f"gzip of {len(data):,} bytes inflates to more than {limit:,} bytes", limit)
            chunks.append(chunk)


class GzipPartHandler:
    """webdataset's ``.gz`` pre-handler with a bound: ``Continue`` with the inflated bytes under the
    name without ``.gz``; a part inflating past ``limit`` bytes raises :class:`MediaTooLargeError`."""

    def __init__(self, limit: Optional[int]):
        self.limit = limit

    def __call__(self, key: str, data: bytes) -> Any:
        if not key.endswith(".gz"):
            return None
        return wds_decode.Continue(key[:-3], inflate_gzip(key.lstrip("."), data, self.limit))


def _npy_bytes(stream: Any) -> int:
    """The bytes of the array an ``npy`` header declares (read from ``stream``'s start)."""
    fmt = np.lib.format
    version = fmt.read_magic(stream)
    shape, _, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(stream)
    return int(np.prod(shape, dtype=object)) * dtype.itemsize


def _declared_bytes(ext: str, data: bytes) -> int:
    """The bytes an ``npy``/``npz`` part says it decodes to: an npy header's array; an npz's members,
    each the larger of its inflated size and its npy header's array. A header that does not read
    counts nothing (the decoder then fails on it with its own error)."""
    try:
        if ext == "npy":
            return _npy_bytes(io.BytesIO(data))
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return sum(_member_bytes(archive, info) for info in archive.infolist())
    except Exception:  # not an npy/zip at all: numpy's own error says so when it decodes the part
        return 0


def _member_bytes(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    try:
        with archive.open(info) as member:
            return max(info.file_size, _npy_bytes(member))
    except Exception:  # not an npy member (numpy returns its bytes), encrypted, another compression
        return info.file_size


class BoundedBasicHandler:
    """webdataset's basic handlers (``txt``, ``json``, ``cls``, ``npy``, ``mp``, …) for parts of at
    most ``limit`` bytes (and ``npy``/``npz`` declaring no more); larger ones raise
    :class:`MediaTooLargeError` before they are parsed. Other parts: ``None`` (they stay bytes)."""

    def __init__(self, limit: Optional[int]):
        self.limit = limit

    def __call__(self, key: str, data: bytes) -> Any:
        ext = key.rsplit(".", 1)[-1]
        if ext not in wds_decode.decoders:
            return None
        if self.limit is not None:
            part = key.lstrip(".")
            if len(data) > self.limit:
                raise _refuse(part, f"{len(data):,} bytes", self.limit)
            if ext in ("npy", "npz"):
                declared = _declared_bytes(ext, data)
                if declared > self.limit:
                    raise _refuse(part, f"{declared:,} bytes once decoded (as its headers declare)", self.limit)
        return wds_decode.basichandlers(key, data)
