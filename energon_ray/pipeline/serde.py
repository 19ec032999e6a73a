"""Serialization of samples and batches between stages: pickle 5 with out-of-band tensor buffers.

CPU tensors travel as numpy buffers appended after the pickle stream (no ``torch.save`` per tensor);
small ones (``INBAND_BYTES``) inside the stream, where a copy costs less than a buffer's bookkeeping.
``loads`` either copies the payload once (stages: tensors own their memory) or, with ``copy=False``
(the trainer), rebuilds tensors as views of the payload itself: a block fetched from Ray's object
store is mapped shared memory, so a batch's tensors reach the trainer without a byte copied.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import struct
import sys
import types
import warnings
from typing import Any, Callable, Dict, List, NamedTuple, Tuple, TypeVar

import cloudpickle
import numpy as np
import pyarrow as pa
import torch

_MAGIC = b"ERS1"
_ALIGN = 64
#: a payload without out-of-band buffers: magic, body length (filled in), no buffers
_NO_BUFFERS_HEADER = struct.pack("<4sII", _MAGIC, 0, 0)
#: tensors of at most this many bytes travel inside the pickle stream, larger ones as out-of-band
#: buffers (views of the payload when loaded with ``copy=False``): a buffer's bookkeeping costs more
#: than copying a small tensor (a tokenized document: dump ~50 → ~35 µs)
INBAND_BYTES = 16 << 10
_NUMPY_DTYPES = {
    torch.uint16, torch.uint32, torch.uint64,
    torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128,
}  # fmt: skip


T = TypeVar("T")

#: whether torch may still warn about a read-only array (it warns once per process: then no more
#: ``catch_warnings``, ~4 µs a tensor, per tensor the trainer maps)
_READ_ONLY_WARNS = [True]


def _tensor_from_numpy(array: np.ndarray) -> torch.Tensor:
    if array.flags.writeable or not _READ_ONLY_WARNS[0]:
        return torch.from_numpy(array)
    # A zero-copy load maps tensors onto Ray's shared memory, which Python sees as read-only although
    # the mapping is writable and private to this block (in-place ops work); torch would warn.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tensor = torch.from_numpy(array)
    if not caught:  # it did not warn: it has warned before, and never will again
        _READ_ONLY_WARNS[0] = False
    for warning in caught:  # anything but torch's user warning goes on as it would have
        if not issubclass(warning.category, UserWarning):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return tensor


def without_read_only_warning(make: Callable[[], T]) -> T:
    """``make()`` (say, torch's ``default_convert`` of an item holding numpy arrays mapped from Ray's
    store) with torch's warning about read-only arrays held back, as ``_tensor_from_numpy`` does: the
    mapping is writable and private to the block. Other warnings go on as they were raised."""
    if not _READ_ONLY_WARNS[0]:
        return make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = make()
    for warning in caught:
        if issubclass(warning.category, UserWarning) and "is not writable" in str(warning.message):
            _READ_ONLY_WARNS[0] = False  # torch warns once per process: never again
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return out


_DTYPES: Dict[str, np.dtype] = {}


def _tensor(buffer: Any, dtype: str, shape: tuple) -> torch.Tensor:
    """A CPU tensor from its out-of-band buffer: a view of the payload (numpy array protocol)."""
    array_dtype = _DTYPES.get(dtype)
    if array_dtype is None:
        array_dtype = _DTYPES[dtype] = np.dtype(dtype)
    return _tensor_from_numpy(np.frombuffer(buffer, dtype=array_dtype).reshape(shape))


def _arrow_buffer(view: Any) -> pa.Buffer:
    return pa.py_buffer(view)


def _tensor_from_bytes(array: np.ndarray, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """Rebuild a tensor numpy has no dtype for (bfloat16, float8…) from its raw bytes."""
    return torch.from_numpy(array).view(dtype).reshape(shape)


#: classes and functions cloudpickle pickles by reference (importable by name) → where that name
#: leads (module, attribute path); with the by-value module registrations they were decided under
_BY_REFERENCE: Dict[Any, Tuple[Any, Tuple[str, ...]]] = {}
_BY_REFERENCE_UNDER: List[frozenset] = [frozenset()]


def _still_named(obj: Any, place: Tuple[Any, Tuple[str, ...]]) -> bool:
    """Whether ``obj``'s module still holds it under its qualified name (a reload or a rebinding
    makes the name lead elsewhere: then cloudpickle decides again)."""
    found = place[0]
    for part in place[1]:
        found = getattr(found, part, None)
    return found is obj


def _by_value_modules() -> frozenset:
    return frozenset(getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", ()))


class _Pickler(cloudpickle.Pickler):
    """cloudpickle (user classes shipped by value come back as the same classes in the driver),
    plus out-of-band buffers for CPU tensors.

    ``reducer_override`` runs for every object that is not a plain builtin (a sample, its tensors,
    their classes), so it answers the common cases itself: a tensor as its buffer, dtype and shape;
    any other instance to pickle's own reduction (what cloudpickle answers too); a class or function
    cloudpickle already found importable by name, by reference while that name still leads to it.
    """

    #: cloudpickle's reducers and copyreg's in one dict (cloudpickle's ChainMap costs a Python-level
    #: lookup for every object that has no reducer), made again when copyreg's registrations change
    dispatch_table: Dict[type, Any] = {}
    _dispatch_size = -1

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is torch.Tensor:
            return self._tensor_reduce(obj)
        if kind is pa.Buffer:  # a nested payload (leftover samples): out of band, never copied
            return _arrow_buffer, (pickle.PickleBuffer(obj),)
        if kind is not types.FunctionType and not issubclass(kind, type):
            return NotImplemented
        try:
            place = _BY_REFERENCE.get(obj)
        except TypeError:  # an unhashable class (a metaclass defining __eq__ only)
            return super().reducer_override(obj)
        if place is not None and _still_named(obj, place):
            return NotImplemented
        reduced = super().reducer_override(obj)
        if reduced is NotImplemented:
            module = sys.modules.get(getattr(obj, "__module__", None) or "")
            if module is not None:
                _BY_REFERENCE[obj] = (module, tuple(obj.__qualname__.split(".")))
        return reduced

    def _tensor_reduce(self, obj: torch.Tensor) -> Any:
        if obj.is_cpu and obj.layout == torch.strided and not obj.requires_grad and obj.dtype in _NUMPY_DTYPES:
            array = obj.detach().contiguous().numpy()
            if array.nbytes <= INBAND_BYTES:  # in the stream: a writable bytearray when loaded
                return _tensor, (bytearray(array.data), array.dtype.str, array.shape)
            return _tensor, (pickle.PickleBuffer(array), array.dtype.str, array.shape)
        if (
            obj.is_cpu
            and obj.layout == torch.strided
            and not obj.requires_grad
            and obj.dtype.itemsize in (1, 2, 4, 8)
            and not obj.dtype.is_complex
        ):
            # bfloat16, float8, …: ship the raw bytes of a contiguous copy (never the whole storage)
            flat = obj.detach().contiguous().reshape(-1)
            carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[obj.dtype.itemsize]
            return _tensor_from_bytes, (flat.view(carrier).numpy(), obj.dtype, tuple(obj.shape))
        return NotImplemented


def _refresh_dispatch_table() -> None:
    own = getattr(cloudpickle.Pickler, "_dispatch_table", None)
    if isinstance(own, dict):
        _Pickler.dispatch_table = {**copyreg.dispatch_table, **own}
    else:  # a cloudpickle without it: its own table as it is
        _Pickler.dispatch_table = cloudpickle.Pickler.dispatch_table
    _Pickler._dispatch_size = len(copyreg.dispatch_table)


_refresh_dispatch_table()


class Parts(NamedTuple):
    """A payload in parts (``dumps_parts``): the header and pickle stream, and the out-of-band
    buffers, each where it lies (a tensor's own memory, or a view of Ray's object store)."""

    head: pa.Buffer
    buffers: List[pa.Buffer]


def dumps_parts(obj: Any) -> Parts:
    """Serialize ``obj`` without copying its large tensors: the pickle stream (with a header naming
    each buffer's size) in one Arrow buffer, and each out-of-band buffer as an Arrow buffer that
    wraps the tensor's memory (it keeps the tensor alive; writing to the tensor changes the payload).

    Example:
        >>> loads(dumps_parts({"x": torch.zeros(8192)}))["x"].shape
        torch.Size([8192])
    """
    stream, buffers = _pickle(obj)
    if not buffers:  # the header written ahead holds: only its body length to fill in
        view = stream.getbuffer()
        struct.pack_into("<I", view, 4, len(view) - len(_NO_BUFFERS_HEADER))
        return Parts(pa.py_buffer(view), [])
    raws = [b.raw() for b in buffers]
    body = stream.getbuffer()[len(_NO_BUFFERS_HEADER) :]
    header = _header(raws, len(body))
    head = pa.allocate_buffer(len(header) + len(body))
    view = memoryview(head).cast("B")
    view[: len(header)] = header
    view[len(header) :] = body
    return Parts(head, [pa.py_buffer(raw) for raw in raws])


def dumps(obj: Any) -> pa.Buffer:
    """Serialize ``obj`` into one Arrow buffer; array buffers follow the pickle, 64-byte aligned.

    The buffer comes from Arrow's memory pool, which recycles memory: no page faults per payload,
    and Arrow tables can wrap it without a copy.

    Example:
        >>> loads(dumps({"x": torch.arange(3)}))["x"].tolist()
        [0, 1, 2]
    """
    return join(dumps_parts(obj))


def join(parts: Parts) -> pa.Buffer:
    """The one-buffer payload of ``parts`` (what ``dumps`` makes of the same object)."""
    if not parts.buffers:
        return parts.head
    head = memoryview(parts.head).cast("B")
    _, body_len, count = struct.unpack_from("<4sII", head, 0)
    start = 12 + 8 * count
    return _joined(head[:start], head[start : start + body_len], [memoryview(b).cast("B") for b in parts.buffers])


def _pickle(obj: Any) -> Tuple[io.BytesIO, List[pickle.PickleBuffer]]:
    """The pickle stream (after room for a header without buffers) and the out-of-band buffers."""
    modules = _by_value_modules()
    if modules != _BY_REFERENCE_UNDER[0]:  # cloudpickle.register_pickle_by_value since: decide again
        _BY_REFERENCE.clear()
        _BY_REFERENCE_UNDER[0] = modules
    if len(copyreg.dispatch_table) != _Pickler._dispatch_size:
        _refresh_dispatch_table()
    buffers: List[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    stream.write(_NO_BUFFERS_HEADER)
    _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    return stream, buffers


def _header(raws: List[memoryview], body_len: int = 0) -> bytes:
    return struct.pack(f"<4sII{len(raws)}Q", _MAGIC, body_len, len(raws), *[r.nbytes for r in raws])


def _joined(header: Any, body: Any, raws: List[memoryview]) -> pa.Buffer:
    """Header, body and buffers in one Arrow buffer, each buffer at a 64-byte aligned offset."""
    positions = []
    total = len(header) + len(body)
    for raw in raws:
        total += -total % _ALIGN
        positions.append(total)
        total += raw.nbytes
    out = pa.allocate_buffer(total)
    view = memoryview(out).cast("B")
    view[: len(header)] = header
    view[len(header) : len(header) + len(body)] = body
    end = len(header) + len(body)
    for pos, raw in zip(positions, raws):
        if pos > end:
            view[end:pos] = bytes(pos - end)
        view[pos : pos + raw.nbytes] = raw.cast("B")
        end = pos + raw.nbytes
    return out


def loads(data: Any, copy: bool = True) -> Any:
    """Inverse of :func:`dumps` and :func:`dumps_parts`; accepts bytes, memoryview, a
    ``pyarrow.Buffer`` or ``Parts``.

    Args:
        data: the payload.
        copy: copy the payload once into pooled memory, so tensors own their data and two loads are
            independent. ``False``: tensors and nested buffers are views of ``data`` and keep it
            alive (no copy at all); numpy arrays are then read-only when ``data`` is.
    """
    # Payloads are what our own stages wrote (``dumps``) inside this job's Ray tasks, never a
    # dataset's files: a dataset's pickles load only under ``trust_dataset_code``.
    if type(data) is Parts:
        if not data.buffers:
            return loads(data.head, copy)
        if copy:  # joining copies every part once: the tensors are views of that private buffer
            return loads(join(data), copy=False)
        view = memoryview(data.head).cast("B")
        body_len, sizes = _read_header(view)
        start = 12 + 8 * len(sizes)
        parts = [memoryview(b).cast("B") for b in data.buffers]
        if [p.nbytes for p in parts] != list(sizes):
            raise ValueError(
                f"payload parts do not match their header: buffers of {[p.nbytes for p in parts]} bytes, header {list(sizes)}"
            )
        return pickle.loads(view[start : start + body_len], buffers=parts)
    source = memoryview(data).cast("B")
    if copy:
        buf = pa.allocate_buffer(source.nbytes)
        view = memoryview(buf).cast("B")
        view[:] = source
    else:
        view = source
    body_len, sizes = _read_header(view)
    pos = 12 + 8 * len(sizes)
    body = view[pos : pos + body_len]
    pos += body_len
    parts = []
    for size in sizes:
        pos += -pos % _ALIGN
        parts.append(view[pos : pos + size])
        pos += size
    return pickle.loads(body, buffers=parts)


def _read_header(view: memoryview) -> Tuple[int, Tuple[int, ...]]:
    """The body length and the out-of-band buffers' sizes of a payload's header."""
    magic, body_len, count = struct.unpack_from("<4sII", view, 0)
    if magic != _MAGIC:
        raise ValueError("payload was not written by energon_ray.pipeline.serde.dumps")
    return body_len, struct.unpack_from(f"<{count}Q", view, 12)
