"""The rows that flow between stages: one Arrow schema for every stage.

A segment travels as a single ``SEGMENT`` row (so Ray can never split it); the last stage explodes
it into ``ITEM`` rows (one per batch, or per sample without batching), an optional ``LEFTOVER`` row
and a closing ``REPORT`` row. A ``LEFTOVER`` row holds ``(bucket key, batch size, [(position, sub,
sample payload)])`` groups whose samples stay serialized: the trainer pools them without decoding and
a Ray task (``seam_batches``) batches them. An ``ITEM`` row lists the stream positions of the
samples it holds (``positions``): a saved state records what was consumed by position.

A payload is serialized in parts (``serde.dumps_parts``): the pickle stream in ``payload``, and,
when a row holds large tensors, their buffers in ``buffers`` as they lie in the task's memory (a
``list<binary_view>`` column over the tensors' own memory, no copy); Ray copies them into its object
store once, and the trainer maps them there. Only blocks that a plain Ray task returns (``parts``)
or that stay in the process have that column: Ray Data's own block serialization does not take
``binary_view`` columns, so its stages return ``contiguous`` blocks (each payload in one buffer).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from energon_ray.errors import FatalSampleError
from energon_ray.pipeline import serde
from energon_ray.pipeline.policy import StageRun, item_key
from energon_ray.pipeline.views import BUFFERS_TYPE, buffers_chunk, row_buffers
from energon_ray.plan.stream import SegmentSpec

SEGMENT, ITEM, LEFTOVER, REPORT = 0, 1, 2, 3

SCHEMA = pa.schema(
    [
        ("kind", pa.int8()),
        ("worker", pa.int32()),
        ("segment", pa.int64()),
        ("seq", pa.int32()),
        ("source", pa.int32()),
        ("payload", pa.large_binary()),
        ("positions", pa.list_(pa.int64())),
    ]
)
#: ``SCHEMA`` and each row's out-of-band buffers (a block with a row that has any)
SPLIT_SCHEMA = SCHEMA.append(pa.field("buffers", BUFFERS_TYPE))
#: the largest buffer a view can name (int32 sizes); a row with a larger one is joined
_VIEW_MAX = 2**31 - 1
#: Arrow 19 is the first whose ``Array.from_buffers`` takes a ``binary_view`` array's own data
#: buffers (16-18 refuse them): we require it, but where an older one is installed anyway (Ray 2.60
#: takes ≥ 17; a machine's preinstalled pyarrow) each payload stays in one buffer, as before
SPLIT_PAYLOADS = int(pa.__version__.split(".")[0]) >= 19


@dataclasses.dataclass
class SegmentData:
    """A segment between stages: its spec, its samples at the current stage, and its report."""

    spec: SegmentSpec
    #: ``(position, global index, raw sample dict)`` after reading.
    raw: List[Tuple[int, int, Any]] = dataclasses.field(default_factory=list)
    #: ``(position, sub-index, sample)`` after encoding (sub-index > 0 for extra generator outputs).
    encoded: List[Tuple[int, int, Any]] = dataclasses.field(default_factory=list)
    runs: List[StageRun] = dataclasses.field(default_factory=list)
    #: Samples read from the shards (before any stage dropped them).
    samples_read: int = 0
    #: ``(exception type name, message)`` when a stage hit a fatal error; the driver raises it in
    #: plan order (Ray does not carry our exception types across its task errors).
    fatal: Optional[Tuple[str, str]] = None
    #: Read requests (local: preads of sample runs; remote: requests to the store), bytes they
    #: returned, and retries of transient store errors.
    read_requests: int = 0
    read_bytes: int = 0
    read_retries: int = 0
    #: a chained stream (``StageConfig.chained``): what the previous segment of the worker stream
    #: handed on (a ``chained.Carry``), and what this one hands the next
    carry: Any = None
    carry_out: Any = None
    #: a chained unbatched stream: ``(outputs of encode_sample, outputs given)`` of the worker stream
    #: after this segment (``Carry.counts``), as the encode stage counted them
    counted: Optional[Tuple[int, int]] = None


@dataclasses.dataclass
class Report:
    """What the driver learns about a segment besides its items."""

    worker: int
    segment: int
    samples_read: int
    samples_encoded: int
    batches: int
    runs: List[StageRun]
    fatal: Optional[Tuple[str, str]] = None
    #: Ray node the segment ran on (the loader counts segments per node).
    node: Optional[str] = None
    #: The segment's read requests, bytes read and retried store requests (see ``SegmentData``).
    read_requests: int = 0
    read_bytes: int = 0
    read_retries: int = 0
    #: a chained stream: encoded samples of the worker stream before this segment (``samples_encoded``
    #: is then the segment's own)
    outputs_before: Optional[int] = None
    #: a chained stream: the position of the first sample whose outputs the segment hands on to the
    #: next one's first batch (``None``: it hands none on)
    tail_from: Optional[int] = None
    #: a chained stream's batches: ``(outputs of batch, batches given)`` of the worker stream after
    #: this segment; its packs: the four packing hook counts (``Carry.counts``; ``None``: not counted)
    counts: Optional[Tuple[int, ...]] = None
    #: a chained stream's last segment: its last items are the stream's short last batch (or the
    #: items a batch hook made of it), made once the stream ended: Energon's worker meets every
    #: failure after the last full batch before it
    ending_items: int = 0


def _binary_chunk(buffer: pa.Buffer) -> pa.Array:
    offsets = pa.py_buffer(np.array([0, buffer.size], dtype=np.int64))
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), 1, [None, offsets, buffer])


_KIND_NAMES = {SEGMENT: "segment", ITEM: "batch/sample", LEFTOVER: "leftover samples", REPORT: "report"}


class Dumped(NamedTuple):
    """A payload serialized already (``table`` takes it as is): a batch made while its segment was
    still being encoded, serialized at once so its samples are freed (its tensors stay, as the
    payload's buffers)."""

    parts: serde.Parts


def dumped(row: Tuple[int, int, int, int, Any]) -> Dumped:
    """``row``'s payload, serialized now (errors name the row as ``table``'s do)."""
    return Dumped(_dump(row))


def _dump(row: Tuple[int, int, int, int, Any], dumps: Callable[[Any], Any] = serde.dumps_parts) -> Any:
    kind, worker, segment, seq, payload = row
    if isinstance(payload, Dumped):
        return payload.parts
    try:
        return dumps(payload)
    except Exception as exc:
        where = f"segment {segment}" if kind == SEGMENT else f"{_KIND_NAMES.get(kind, kind)} {seq} of segment {segment}"
        culprit, field = _unpicklable(payload, dumps)
        named = _named(culprit)
        raise FatalSampleError(
            f"a hook returned a {type(culprit).__name__} ({f'{named}, ' if named else ''}{where} of worker stream "
            f"{worker}) that cannot be sent to the driver: {f'field {field!r}: ' if field is not None else ''}"
            f"{type(exc).__name__}: {exc}. Return tensors and plain Python objects, not open files, "
            "containers or decoders"
        ) from exc


def _named(item: Any) -> Optional[str]:
    """``sample 'key'``, or for a batch (a list of keys) ``batch of n starting at sample 'key'``."""
    key = item_key(item)
    if key is None:
        key = item.get("__keys__") if isinstance(item, dict) else getattr(item, "__keys__", None)
    if isinstance(key, (list, tuple)):
        return f"batch of {len(key)} starting at sample {key[0]!r}" if key else None
    return None if key is None else f"sample {key!r}"


def _unpicklable(payload: Any, dumps: Callable[[Any], Any]) -> Tuple[Any, Optional[str]]:
    """The item of ``payload`` that does not serialize (a segment's encoded sample, or ``payload``
    itself) and its first top-level field that does not (``None``: none found alone)."""

    def fails(value: Any) -> bool:
        try:
            dumps(value)
        except Exception:
            return True
        return False

    if isinstance(payload, SegmentData):
        payload = next((sample for _, _, sample in payload.encoded if fails(sample)), payload)
    if isinstance(payload, dict):
        fields = payload.items()
    elif dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        fields = ((f.name, getattr(payload, f.name, None)) for f in dataclasses.fields(payload))
    else:
        fields = getattr(payload, "__dict__", {}).items()
    return payload, next((name for name, value in fields if fails(value)), None)


def pack_leftovers(groups: List[Tuple[Any, int, List[Tuple[int, int, Any]]]], worker: int, segment: int) -> List[Any]:
    """Serialize each leftover sample on its own, so the trainer can pool them without decoding; in
    parts (``serde.dumps_parts``): its tensors stay where they lie until Ray copies the block into
    its store (a sample blend's samples are all leftovers: joining each into one buffer took 6-10 %
    of its workers' CPU, stop 59)."""
    return [
        (key, size, [(position, sub, _dump((LEFTOVER, worker, segment, position, sample))) for position, sub, sample in items])
        for key, size, items in groups
    ]


def table(
    rows: List[Tuple[int, int, int, int, Any]], source: int = 0, positions: Optional[List[Optional[List[int]]]] = None
) -> pa.Table:
    """Build a table from ``(kind, worker, segment, seq, payload object)`` tuples of one segment.

    ``source`` is the leaf dataset the segment belongs to; ``positions``, per row, the stream positions
    of an item's samples (``None``: none). Each payload is serialized in parts and wrapped without a
    copy: its large tensors stay where they are (the ``buffers`` column, when a row has any).
    """
    kinds, workers, segments, seqs, payloads = zip(*rows) if rows else ((), (), (), (), ())
    dumped = [_dump(row) for row in rows]
    for i, parts in enumerate(dumped):
        if parts.buffers and (not SPLIT_PAYLOADS or any(b.size > _VIEW_MAX for b in parts.buffers)):
            dumped[i] = serde.Parts(serde.join(parts), [])  # no views (an older Arrow, or too large): one buffer
    n = len(rows)
    columns = [
        _numbers(kinds, pa.int8(), np.int8),
        _numbers(workers, pa.int32(), np.int32),
        _numbers(segments, pa.int64(), np.int64),
        _numbers(seqs, pa.int32(), np.int32),
        _numbers([source] * n, pa.int32(), np.int32),
        pa.chunked_array([_binary_chunk(parts.head) for parts in dumped], pa.large_binary()),
        _lists(positions if positions is not None else [None] * n),
    ]
    if not any(parts.buffers for parts in dumped):
        return pa.Table.from_arrays(columns, schema=SCHEMA)
    columns.append(pa.chunked_array([buffers_chunk(parts.buffers) for parts in dumped], BUFFERS_TYPE))
    return pa.Table.from_arrays(columns, schema=SPLIT_SCHEMA)


def concat(tables: List[pa.Table]) -> Optional[pa.Table]:
    """Blocks one after another in one block (no copy: each keeps its chunks); ``None`` for none.
    A block without a ``buffers`` column gets one of empty lists where another has one."""
    if len(tables) <= 1:
        return tables[0] if tables else None
    if any("buffers" in t.schema.names for t in tables):
        empty = buffers_chunk([])
        tables = [
            t if "buffers" in t.schema.names
            else t.append_column(SPLIT_SCHEMA.field("buffers"), pa.chunked_array([empty] * t.num_rows, BUFFERS_TYPE))
            for t in tables
        ]  # fmt: skip
    return pa.concat_tables(tables)


def contiguous(block: pa.Table) -> pa.Table:
    """``block`` with each payload in one buffer and no ``buffers`` column (a copy of the payloads
    that have buffers): what Ray Data's stages return, as its serialization takes no views."""
    if "buffers" not in block.schema.names:
        return block
    payloads = [serde.join(p) if type(p) is serde.Parts else p for *_, p in iter_rows(block)]
    joined = pa.chunked_array([_binary_chunk(p) for p in payloads], pa.large_binary())
    return block.drop_columns(["buffers"]).set_column(SCHEMA.get_field_index("payload"), SCHEMA.field("payload"), joined)


# Columns are built from numpy buffers: ``pa.array`` of Python values imports pandas (0.2-0.9 s in a
# fresh Ray worker, on the first batch's critical path), these never do.


def _numbers(values: Sequence[int], arrow_type: pa.DataType, dtype: Any) -> pa.Array:
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(np.asarray(values, dtype=dtype))])


def _lists(values: Sequence[Optional[List[int]]]) -> pa.Array:
    """A ``list<int64>`` column; ``None`` entries are nulls."""
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(v) if v is not None else 0 for v in values], out=offsets[1:])
    flat = np.fromiter((x for v in values if v is not None for x in v), dtype=np.int64, count=int(offsets[-1]))
    valid = None
    if any(v is None for v in values):
        valid = pa.py_buffer(np.packbits(np.array([v is not None for v in values], dtype=bool), bitorder="little"))
    items = pa.Array.from_buffers(pa.int64(), len(flat), [None, pa.py_buffer(flat)])
    return pa.ListArray.from_buffers(pa.list_(pa.int64()), len(values), [valid, pa.py_buffer(offsets)], children=[items])


class TableParts:
    """A table as its schema and columns, for a plain Ray task to return; unpickled, it is the table.

    Ray pickles a ``pa.Table`` with a reducer of its own that imports ``pyarrow.compute`` and pandas
    in the worker (0.5 s at a worker's first output, on the first batch's critical path) and runs a
    compute kernel per binary chunk (one per row here). Columns pickle with Arrow's own reducers:
    every buffer out of band (pickle 5), so Ray stores them without a copy and ``ray.get`` maps them.
    """

    __slots__ = ("table",)

    def __init__(self, table: pa.Table):
        self.table = table

    def __reduce__(self):
        return _table_from_parts, (self.table.schema.serialize(), self.table.columns)


def _table_from_parts(schema: pa.Buffer, columns: List[pa.ChunkedArray]) -> pa.Table:
    return pa.Table.from_arrays(columns, schema=pa.ipc.read_schema(schema))


def parts(table: Optional[pa.Table]) -> Optional[TableParts]:
    """What a plain task returns for ``table`` (``None`` stays ``None``)."""
    return None if table is None else TableParts(table)


def sources(batch: pa.Table) -> List[int]:
    """The leaf dataset of each row."""
    return batch.column("source").to_pylist()


def positions(batch: pa.Table) -> List[Optional[List[int]]]:
    """The stream positions of each row's samples (``None`` for rows that are not items)."""
    return batch.column("positions").to_pylist()


def iter_rows(batch: pa.Table) -> Iterator[Tuple[int, int, int, int, Any]]:
    """Yield ``(kind, worker, segment, seq, payload)``: a buffer, or ``serde.Parts`` where the row
    has out-of-band buffers; decode payloads with ``serde.loads``."""
    kinds = batch.column("kind").to_pylist()
    workers = batch.column("worker").to_pylist()
    segments = batch.column("segment").to_pylist()
    seqs = batch.column("seq").to_pylist()
    heads = _payload_buffers(batch.column("payload"))
    if "buffers" in batch.schema.names:
        heads = (serde.Parts(head, buffers) if buffers else head for head, buffers in zip(heads, row_buffers(batch.column("buffers"))))
    i = 0
    for payload in heads:
        yield kinds[i], workers[i], segments[i], seqs[i], payload
        i += 1


def _payload_buffers(column: pa.ChunkedArray) -> Iterator[pa.Buffer]:
    """Each row's payload as a slice of its chunk's data buffer (``column[i]`` would copy it)."""
    for chunk in column.chunks:
        if chunk.null_count:
            raise RuntimeError("energon_ray: a row without payload in a pipeline block")
        _, offsets_buf, data = chunk.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int64, count=len(chunk) + 1, offset=chunk.offset * 8)
        for j in range(len(chunk)):
            yield data.slice(int(offsets[j]), int(offsets[j + 1] - offsets[j]))
