"""Random access to samples of a tar shard through its ``.tar.idx`` offsets.

A sample is the run of tar members between two consecutive offsets. Runs of consecutive samples are
read with one ``pread`` and parsed in memory, so no shard is ever scanned to reach an offset.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from energon_ray.errors import ShardReadError

#: ``dir/key.part.ext`` → key ``dir/key``, part ``part.ext`` (the first dot of the last component).
SPLIT_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: Members like ``__meta__`` are not sample parts.
SKIP_META_RE = re.compile(r"__[^/]*__($|/)")


def split_member_name(name: str) -> Optional[Tuple[str, str]]:
    """``"a/b.jpg"`` → ``("a/b", "jpg")``; None for names without a part."""
    match = SPLIT_NAME_RE.match(name)
    return (match.group(1), match.group(2)) if match else None


def parse_sample(
    data: bytes | memoryview, shard: str, index_in_shard: int, part_filter: Optional[Callable[[str], bool]] = None
) -> Tuple[str, Dict[str, bytes], List[str]]:
    """Parse the tar members of one sample from its bytes.

    Returns:
        ``(key, {part: bytes}, member names read)``.

    Raises:
        ShardReadError: if the bytes are not tar members of one sample.
    """
    key: Optional[str] = None
    parts: Dict[str, bytes] = {}
    names: List[str] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if not member.isfile() or SKIP_META_RE.match(member.name):
                    continue
                split = split_member_name(member.name)
                if split is None:
                    continue
                base, part = split
                if key is None:
                    key = base
                elif base != key:
                    raise ShardReadError(
                        f"{shard}: sample #{index_in_shard} mixes keys {key!r} and {base!r}; "
                        f"the .tar.idx does not match the tar (re-run `energon-ray prepare --tar-index-only`)"
                    )
                if part_filter is None or part_filter(part):
                    handle = tar.extractfile(member)
                    parts[part] = handle.read() if handle is not None else b""
                    names.append(member.name)
    except tarfile.TarError as exc:
        raise ShardReadError(f"{shard}: sample #{index_in_shard} is not a valid tar record: {exc}") from None
    if key is None:
        raise ShardReadError(f"{shard}: sample #{index_in_shard} holds no sample files")
    return key, parts, names


class ShardReader:
    """Reads samples of one shard by index; keeps the file open.

    Args:
        path: the tar file.
        name: the shard's name relative to the dataset (used in messages and restore keys).
        offsets: the shard's ``.tar.idx`` values.
    """

    def __init__(self, path: str, name: str, offsets: np.ndarray):
        self.path = path
        self.name = name
        self.offsets = offsets
        self._fd: Optional[int] = None

    def _read(self, start: int, end: int) -> bytes:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as exc:
                raise ShardReadError(f"{self.path}: cannot open shard: {exc}") from None
        data = os.pread(self._fd, end - start, start)
        if len(data) != end - start:
            raise ShardReadError(
                f"{self.path}: truncated shard: wanted bytes [{start}, {end}) but the file ends at "
                f"{start + len(data)}"
            )
        return data

    def read_run(self, first: int, last: int) -> Iterator[Tuple[int, memoryview]]:
        """Yield ``(index, bytes)`` of samples ``first..last`` (inclusive) with a single read."""
        count = len(self.offsets) - 1
        if not (0 <= first <= last < count):
            raise ShardReadError(f"{self.path}: sample range [{first}, {last}] outside 0..{count - 1}")
        base = int(self.offsets[first])
        buf = memoryview(self._read(base, int(self.offsets[last + 1])))
        for i in range(first, last + 1):
            yield i, buf[int(self.offsets[i]) - base : int(self.offsets[i + 1]) - base]

    def read_key(self, index: int) -> str:
        """The key of sample ``index`` (reads only its first header)."""
        start = int(self.offsets[index])
        header = self._read(start, min(start + 512 * 8, int(self.offsets[index + 1])))
        try:
            with tarfile.open(fileobj=io.BytesIO(header), mode="r:") as tar:
                for member in tar:
                    split = split_member_name(member.name)
                    if member.isfile() and split and not SKIP_META_RE.match(member.name):
                        return split[0]
        except tarfile.TarError:
            pass
        raise ShardReadError(f"{self.path}: cannot read the key of sample #{index}")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


def consecutive_runs(indices: Sequence[int]) -> Iterator[Tuple[int, int, int]]:
    """Split positions of ``indices`` into runs of consecutive values: ``(pos, first, last)``.

    Example:
        >>> list(consecutive_runs([3, 4, 5, 9, 10, 2]))
        [(0, 3, 5), (3, 9, 10), (5, 2, 2)]
    """
    pos = 0
    n = len(indices)
    while pos < n:
        first = last = int(indices[pos])
        end = pos + 1
        while end < n and int(indices[end]) == last + 1:
            last += 1
            end += 1
        yield pos, first, last
        pos = end
