"""The ``buffers`` column of a block: each row's out-of-band buffers as ``binary_view`` values that
point at the buffers where they lie (a tensor's memory in the task, Ray's object store in the
trainer), so neither building nor reading the column copies them."""

from __future__ import annotations

import struct
from typing import Iterator, List

import numpy as np
import pyarrow as pa

#: the column's type: per row, a list of views
BUFFERS_TYPE = pa.list_(pa.binary_view())
#: a view (Arrow's layout): the value's size, then its first 4 bytes, the data buffer it lies in and
#: its offset there; a value of up to 12 bytes is held in the view itself, after the size
_VIEW = struct.Struct("<i4sii")
_INLINE = 12


def buffers_chunk(buffers: List[pa.Buffer]) -> pa.Array:
    """One row of the column: the list of ``buffers``, each a view over the buffer itself."""
    views = bytearray(_VIEW.size * len(buffers))
    data: List[pa.Buffer] = []
    for i, buffer in enumerate(buffers):
        head = memoryview(buffer).cast("B")[: _INLINE if buffer.size <= _INLINE else 4]
        if buffer.size <= _INLINE:
            struct.pack_into(f"<i{_INLINE}s", views, i * _VIEW.size, buffer.size, bytes(head))
        else:
            _VIEW.pack_into(views, i * _VIEW.size, buffer.size, bytes(head), len(data), 0)
            data.append(buffer)
    child = pa.Array.from_buffers(pa.binary_view(), len(buffers), [None, pa.py_buffer(views)] + data)
    offsets = pa.py_buffer(np.array([0, len(buffers)], dtype=np.int32))
    return pa.ListArray.from_buffers(BUFFERS_TYPE, 1, [None, offsets], children=[child])


def row_buffers(column: pa.ChunkedArray) -> Iterator[List[pa.Buffer]]:
    """Each row's buffers, each a slice of the data buffer its view points at (no copy)."""
    for chunk in column.chunks:
        offsets = _int32s(chunk.offsets).tolist()
        values = chunk.values
        if len(values) == 0:
            yield from ([] for _ in range(len(chunk)))
            continue
        _, views_buf, *data = values.buffers()
        views = memoryview(views_buf).cast("B")
        base = values.offset
        for j in range(len(chunk)):
            out = []
            for v in range(base + offsets[j], base + offsets[j + 1]):
                at = v * _VIEW.size
                size, _, where, offset = _VIEW.unpack_from(views, at)
                if size > _INLINE:
                    out.append(data[where].slice(offset, size))
                else:  # held in the view itself
                    out.append(pa.py_buffer(bytes(views[at + 4 : at + 4 + size])))
            yield out


def _int32s(array: pa.Array) -> np.ndarray:
    """An int32 array's values (``to_numpy`` would import pandas: ~0.5 s on the first batch's path)."""
    return np.frombuffer(array.buffers()[1], dtype=np.int32, count=array.offset + len(array))[array.offset :]
