"""The batching stages (no Ray imports): ``BatchSamples``: encoded samples → exact batches of
``batch_size`` (or packs, or groups) → ``batch`` → ``encode_batch``; the samples that do not fill a
batch leave as a ``LEFTOVER`` row for the driver to join (``seam_stages`` batches them, or a blend's
drawn samples, in a Ray task). ``EncodeAndBatch``: ``EncodeSamples`` and ``BatchSamples`` in one call,
batches made (``EagerBatches``) as soon as their samples are encoded.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, List, Mapping, Optional, Tuple, Union

import pyarrow as pa

from energon_ray.errors import FatalSampleError
from energon_ray.pipeline import rows, serde
from energon_ray.pipeline.batcher import Batcher
from energon_ray.pipeline.chained import Carry
from energon_ray.pipeline.grouping import Grouper
from energon_ray.pipeline.packing import Packer
from energon_ray.pipeline.stages import EncodeSamples, StageConfig, _configs, _one_source, output_table
from energon_ray.task_encoder.base import TaskEncoder, is_overridden
from energon_ray.task_encoder.context import worker_slot


class BatchSamples:
    """Stage 2: cut a segment's encoded samples into batches; emit items, leftovers and a report."""

    def __init__(self, config: Union[StageConfig, Mapping[int, StageConfig]]):
        self.configs = _configs(config)
        #: set by the Ray edge to the node this stage runs on (reported per segment)
        self.node: Optional[str] = None
        #: the last segment's packing buffer left open (a chained stream's carry)
        self._open_buffer: List[Any] = []
        #: a chained stream's packing hook counts after the last segment (``Packer.counts``; ``None``: not counted)
        self._pack_counts: Optional[List[int]] = None

    def __call__(self, batch: pa.Table) -> pa.Table:
        out: list = []
        source = _one_source(batch)
        for kind, worker, segment, seq, payload in rows.iter_rows(batch):
            if kind != rows.SEGMENT:
                out.append((kind, worker, segment, seq, serde.loads(payload), None))
                continue
            out.extend(self.explode(serde.loads(payload)))
        return output_table(out, source)

    def eager(self, data: rows.SegmentData) -> Optional["EagerBatches"]:
        """Batches made while ``data`` is still being encoded, where a segment's batches are plain
        consecutive groups of its samples (no packing, grouping or cross-source batching; not a restore
        read); ``None`` elsewhere."""
        config = self.configs[data.spec.source]
        te: TaskEncoder = config.task_encoder.get()
        if (
            config.batch_size is None
            or config.packing_buffer_size
            or config.batch_across_sources
            or data.spec.keep is not None
            or is_overridden(te, "batch_group_criterion")
        ):
            return None
        return EagerBatches(data, Batcher(te, config.error_handler), config.batch_size)

    def explode(
        self, data: rows.SegmentData, eager: Optional["EagerBatches"] = None
    ) -> Iterator[Tuple[int, int, int, int, Any, Optional[List[int]]]]:
        """The segment's rows, each with the stream positions of an item's samples (``None`` otherwise);
        ``eager``: the batches made (and serialized) while the segment was encoded come first."""
        spec = data.spec
        self.config = self.configs[spec.source]
        if eager is not None:
            data.runs.extend(eager.runs)
        self._pack_counts = None
        items: List[Tuple[Any, List[int]]] = []
        leftovers: List[Any] = []
        made: List[Tuple[Any, List[int]]] = []  # plain batching's batches, as they are made
        try:
            with worker_slot(spec.worker, self.config.num_workers):
                items, leftovers = self._batches(data, eager, made)
        except FatalSampleError as exc:
            data.fatal = data.fatal or ("FatalSampleError", str(exc))
            items, leftovers = list(made), []
        encoded = len(data.encoded) + (eager.samples if eager is not None else 0)
        ending = 0  # items at the end made once the stream ended (its short last batch)
        if data.fatal is not None and not self._plain(data):
            items, leftovers = [], []  # a fatal segment of packing or grouping gives nothing
        elif eager is not None:  # (a fatal one: what was made before the error, which comes after them)
            items = eager.items + items
        if self.config.chained and data.carry is not None:
            encoded -= len(data.carry.tail or ())  # the previous segment's tail was counted there
            if data.fatal is None:
                items, leftovers, ending = self._chain_on(data, eager, items, leftovers, encoded)
        try:  # serialized here, not in the block: one that does not pickle fails the segment's report
            items = [(rows.dumped((rows.ITEM, spec.worker, spec.index, seq, item)), pos) for seq, (item, pos) in enumerate(items)]
            leftovers = rows.pack_leftovers(leftovers, spec.worker, spec.index) if leftovers else None
        except FatalSampleError as exc:  # a Ray task error would leave the other tasks' to Ray's "Unhandled error" log
            data.fatal = data.fatal or ("FatalSampleError", str(exc))
            items, leftovers = [], None
        for seq, (item, positions) in enumerate(items):
            yield rows.ITEM, spec.worker, spec.index, seq, item, positions
        if leftovers:
            yield rows.LEFTOVER, spec.worker, spec.index, len(items), leftovers, None
        report = rows.Report(
            worker=spec.worker,
            segment=spec.index,
            samples_read=data.samples_read,
            samples_encoded=encoded,
            batches=len(items),
            runs=data.runs,
            fatal=data.fatal,
            node=self.node,
            read_requests=data.read_requests,
            read_bytes=data.read_bytes,
            read_retries=data.read_retries,
            outputs_before=data.carry.outputs if self.config.chained and data.carry is not None else None,
            tail_from=data.carry_out.tail[0][0] if data.carry_out is not None and data.carry_out.tail else None,
            counts=data.carry_out.counts if data.carry_out is not None else self._last_pack_counts(data) or data.counted,
            ending_items=ending if items else 0,
        )
        yield rows.REPORT, spec.worker, spec.index, len(items) + 1, report, None

    def _chain_on(self, data: rows.SegmentData, eager: Optional["EagerBatches"], items, leftovers, encoded: int):
        """A chained segment's end: the samples that did not fill a batch go to the next segment
        (``data.carry_out``) or, in the stream's last segment, make its last, short batch (unless
        ``drop_last``); no ``LEFTOVER`` row. Returns the items, the leftovers and how many items at
        the end are that last batch's (``Report.ending_items``)."""
        if self.config.packing_buffer_size:  # the packs go to the pool; the open buffer to the next segment
            if not data.spec.last:
                counts = None if self._pack_counts is None else tuple(self._pack_counts)
                data.carry_out = Carry(data.carry.outputs + encoded, list(self._open_buffer), counts=counts)
            return items, leftovers, 0
        if self.config.batch_size is None:  # unbatched: the outputs went out; the counts go on
            if not data.spec.last:
                data.carry_out = Carry(data.carry.outputs + encoded, [], counts=data.counted)
            return items, leftovers, 0
        if eager is None:
            raise RuntimeError(f"energon_ray: chained segment {data.spec.index} of worker {data.spec.worker} cannot batch as it encodes")
        size, total = self.config.batch_size, data.carry.outputs + encoded
        rest = [entry for _, _, group in leftovers for entry in group]
        if not data.spec.last:
            data.carry_out = Carry(total, rest, counts=None if eager.counts is None else (eager.counts[0], eager.counts[1]))
            return items, [], 0
        if not rest or self.config.drop_last:
            return items, [], 0
        with worker_slot(data.spec.worker, self.config.num_workers):
            last = eager.batcher.with_positions(rest, data.spec.seed, size, eager.runs, total // size, eager.counts)
        return items + last, [], len(last)

    def _last_pack_counts(self, data: rows.SegmentData) -> Optional[Tuple[int, ...]]:
        """A chained packed stream's last segment hands on no carry; its report still tells the
        packing hook counts after it (``ChainPoints``: a restore that makes its packs again)."""
        if self._pack_counts is None or data.fatal is not None or not data.spec.last:
            return None
        return tuple(self._pack_counts)

    def _plain(self, data: rows.SegmentData) -> bool:
        """Whether the segment's items are plain consecutive batches of its samples (or the samples)."""
        te: TaskEncoder = self.config.task_encoder.get()
        return not (
            self.config.packing_buffer_size
            or data.spec.keep is not None
            or is_overridden(te, "batch_group_criterion")
            or self.config.batch_across_sources
        )

    def _batches(
        self, data: rows.SegmentData, eager: Optional["EagerBatches"] = None, made: Optional[List[Any]] = None
    ) -> Tuple[List[Tuple[Any, List[int]]], List[Any]]:
        """Items (batches, or samples without batching) with their samples' positions, and leftover
        groups ``(key, size, items)`` (of the samples ``eager`` left). After a fatal error in
        encoding, plain batching still batches the samples encoded before it (Energon gives those
        batches before it raises); ``made`` gets each batch as it is made."""
        te: TaskEncoder = self.config.task_encoder.get()
        handler, size, seed = self.config.error_handler, self.config.batch_size, data.spec.seed
        entries = data.encoded
        if data.fatal is not None and not self._plain(data):
            return [], []
        if self.config.packing_buffer_size:
            packer = Packer(te, self.config.packing_buffer_size, handler, size, self.config.index_offset(data.spec.worker))
            runs = packer.new_runs()
            data.runs.extend(runs)
            chained = self.config.chained and data.carry is not None
            final = not chained or data.spec.last
            counts = _pack_counts(data.carry) if chained and self.config.pack_counts else None
            entries = packer(entries, seed, runs, final=final, counts=counts)
            self._open_buffer = packer.partial  # a chained stream's next segment packs on from it
            self._pack_counts = counts
        if data.spec.keep is not None:  # a restore read: the listed samples (or packs) for the trainer's pools
            wanted = {(int(p), int(s)) for p, s in data.spec.keep}
            return [], [(None, 0, [e for e in entries if (e[0], e[1]) in wanted])]
        if is_overridden(te, "batch_group_criterion"):
            grouper = Grouper(te, size, handler)
            run = grouper.new_run()
            data.runs.append(run)
            return [], grouper(entries, run)  # batched where the buckets fill, across segments
        if size is None and not self.config.batch_across_sources:  # (else a packed blend's leaf: its samples pooled)
            return [(item, [position]) for position, _, item in entries], []
        if self.config.batch_across_sources or self.config.pool_packs:
            return [], ([(None, size, entries)] if entries else [])
        if eager is not None:
            batcher, runs = eager.batcher, eager.runs
        else:
            batcher = Batcher(te, handler)
            runs = batcher.new_runs()
            data.runs.extend(runs)
        cut = len(entries) - len(entries) % size
        items = made if made is not None else []
        for start in range(0, cut, size):
            items.extend(batcher.with_positions(entries[start : start + size], seed, size, runs))
        return items, ([(None, size, entries[cut:])] if cut < len(entries) else [])


def _pack_counts(carry: Carry) -> Optional[List[int]]:
    """The packing hook counts a chained segment packs on from (``Packer.counts``): its carry's,
    zeros at the stream's start; ``None`` (positions) where a carry inside the stream has none."""
    if carry.counts is not None:
        return [int(c) for c in carry.counts]
    return [0, 0, 0, 0] if carry.outputs == 0 else None


#: seconds between two looks for a chained segment's carry while its samples are encoded
LOOK_EVERY = 0.02


class EagerBatches:
    """A segment's batches made as soon as ``batch_size`` samples are encoded, each serialized at
    once: a task holds one batch's samples and the serialized block, not all encoded samples, their
    batches and the block together (same hooks, seeds and batches as batching after encoding)."""

    def __init__(self, data: rows.SegmentData, batcher: Batcher, size: int):
        self.data = data
        self.batcher = batcher
        self.size = size
        #: reported after the encode stage's runs (``explode`` adds them), as without eager batching
        self.runs = batcher.new_runs()
        #: ``(Dumped batch, positions)``, in order
        self.items: List[Tuple[rows.Dumped, List[int]]] = []
        #: samples taken out of ``data.encoded``
        self.samples = 0
        #: a chained stream: the index in the worker stream of ``data.encoded``'s first sample
        self.base: Optional[int] = None
        #: a chained stream: ``[outputs of batch, batches given]`` so far (``Made``)
        self.counts: Optional[List[int]] = None
        #: a chained stream's carry still to come (``build.LaterCarry``: ``ready()``, ``wait()``):
        #: nothing is batched before it opens the segment's first batch (``take_carry``)
        self.later: Any = None
        #: the carry came as ``None`` (the stream failed or closed before): nothing is made
        self.dead = False
        self._next_look = 0.0

    def take_carry(self, wait: bool) -> bool:
        """Whether the carry has come (``later``): its open batch then goes before the samples
        encoded so far and batching starts. Without ``wait``, looks at most every ``LOOK_EVERY``
        seconds (a look asks Ray) and never waits."""
        if self.later is None:
            return True
        if not wait:
            now = time.monotonic()
            if now < self._next_look:
                return False
            self._next_look = now + LOOK_EVERY
            if not self.later.ready():
                return False
        carry, self.later = self.later.wait(), None
        if carry is None:
            self.dead = True
            return True
        self.data.carry = carry
        self.data.encoded[:0] = list(carry.tail or ())
        self.chain_from(carry)
        return True

    def chain_from(self, carry: Carry) -> None:
        """Batch on from ``carry`` (its tail already opens ``data.encoded``): the index of the first
        sample and the batches counted so far (as many as groups where the carry has no counts)."""
        self.base = carry.outputs - len(carry.tail or ())
        groups = self.base // self.size
        self.counts = [groups, groups] if carry.counts is None else [int(carry.counts[0]), int(carry.counts[1])]

    def __call__(self) -> None:
        data, size = self.data, self.size
        spec = data.spec
        if self.dead or not self.take_carry(wait=False):
            return
        while len(data.encoded) >= size:
            group = data.encoded[:size]
            del data.encoded[:size]
            index = None if self.base is None else (self.base + self.samples) // size
            self.samples += size
            for item, positions in self.batcher.with_positions(group, spec.seed, size, self.runs, index, self.counts):
                row = (rows.ITEM, spec.worker, spec.index, len(self.items), item)
                self.items.append((rows.dumped(row), positions))
            del group


class EncodeAndBatch:
    """Stages 1 and 2 in one call: the encoded samples go straight to batching, never serialized."""

    def __init__(self, config: Union[StageConfig, Mapping[int, StageConfig]]):
        self.encode = EncodeSamples(config)
        self.batch = BatchSamples(config)

    def __call__(self, batch: pa.Table) -> pa.Table:
        out: list = []
        source = _one_source(batch)
        for kind, worker, segment, seq, payload in rows.iter_rows(batch):
            data = serde.loads(payload)
            if kind != rows.SEGMENT:
                out.append((kind, worker, segment, seq, data, None))
                continue
            out.extend(self._rows(data))
        return output_table(out, source)

    def segment(self, data: rows.SegmentData) -> pa.Table:
        """The block of a segment read in this process (``ReadSegment``'s output as it is: never
        serialized between reading and encoding, ~6 ms of a 128-sample captioning segment)."""
        return output_table(self._rows(data), data.spec.source)

    def _rows(self, data: rows.SegmentData) -> list:
        eager = self.batch.eager(data)
        self.encode.encode(data, eager)
        return list(self.batch.explode(data, eager))
