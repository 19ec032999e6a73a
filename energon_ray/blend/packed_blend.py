"""Packing after a sample blend (``get_train_dataset(metadataset, packing_buffer_size=…,
blend_samples=True)``): Energon blends a metadataset's encoded samples, then packs them, then
batches the packs, so a pack mixes datasets. Here too, off the training process:

1. per logical worker, the blend's draws are cut into *chunks* of ``PACK_CHUNK_BUFFERS`` packing
   buffers; a Ray task packs each chunk with Energon's buffer semantics
   (``pipeline.packing.Packer``: ``select_samples_to_pack`` on each full buffer, ``postencode_sample``
   on each pack's members, ``pack_selected_samples``; the last buffer of a chunk is packed as it
   is, as a segment's is where the datasets' own Ray tasks pack); a validation metadataset's hooks
   read Energon's indices (``counts_packing_hooks``; ``Packer.counts``: each hook's calls before it
   in the worker stream), each chunk's task taking the counts after the worker's previous chunk
   (that task's result, which Ray hands it once made: a worker's chunks pack one after another);
   a train blend's read their first sample's position (its chunks pack side by side: 10 % more
   tokens/s on 2 CPUs than chained, and its draws are not Energon's anyway);
2. the packs stay in Ray's object store; the trainer keeps where each lies (``Located``) and its
   ``(position, sub)``, never the bytes;
3. consecutive ``batch_size`` packs make a batch, made by a Ray task (``batch``/``encode_batch``),
   ``BATCHES_PER_GROUP`` batches per task (a pass's first: one); unbatched (``batch_size=None``,
   a train or validation metadataset's), each pack is an item, read from the store by such a task too.

Ahead of the trainer (from a worker's second batch on): the next chunk is drawn and its packing
task started while the current group's batches are handed out, and once its packs are made, the
next group's batching task is started too (its first batch index known: the current group's
batches are). So a group's start rarely waits for Ray (2 CPUs, a 40 ms step: the trainer waited
3.0 s in 145 batches without this, 0.5 s with it; ``benchmarks/bench_packed_blend.py``). An error
met while drawing or packing ahead is kept and raised where the trainer would have met it without
looking ahead.

Saved state (``_PackNode``): the pack the next batch starts with, as the state before its chunk was
drawn (the leaves' pools and the blend's draws, written instead of the current ones) plus how many
packs of that chunk come before it and the packing hooks' counts before it (absent from states
saved before 2026-11-29, whose pass goes on with the hooks reading positions). A restore draws that chunk again, packs it, drops those packs
and goes on: the same packs and batches as the saved loader's. Work started ahead is not saved
(it is made again after a restore).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple, Union

from energon_ray.blend.base import Node, PassContext, Provider
from energon_ray.blend.replay import SubTree
from energon_ray.loader.group_items import read_finished
from energon_ray.loader.merge import EXHAUSTED
from energon_ray.loader.pinning import handed_out
from energon_ray.pipeline.located import Located

#: packing buffers per chunk of drawn samples (one Ray task packs a chunk)
PACK_CHUNK_BUFFERS = 2
#: start the next chunk's packing and the next group's batching ahead of the trainer (see above);
#: off: each starts when the trainer reaches it (tests compare the two)
LOOK_AHEAD = True
#: chunks drawn ahead per worker at most (as many as the next group needs, by the packs per chunk so far)
MAX_CHUNKS_AHEAD = 8

#: a pending pack: (chunk, index in the chunk's packs, position, sub, where its bytes lie)
Pack = Tuple[int, int, int, int, Located]
#: where the next batch starts: (chunk, packs of it before); None before anything was drawn again
#: after a restore, and at the pass's end
Cursor = Optional[Tuple[int, int]]
#: a chunk drawn ahead: (chunk, its packs' table, the packing task's wait), or the error drawing or
#: packing it raised (raised where it is needed)
Drawn = Union[Tuple[int, Any, Callable[[], Any]], Exception]


class _PackNode(Node):
    """Per worker: the packs made and not yet batched, the chunks' states before their draws, and
    where the next batch starts (see the module's docstring)."""

    def __init__(self, workers: int, counted: bool):
        self.packs: List[Deque[Pack]] = [deque() for _ in range(workers)]
        #: per worker: chunk number → the sub-tree's state before it was drawn
        self.before: List[Dict[int, Any]] = [{} for _ in range(workers)]
        self.chunks = [0] * workers
        self.ended = [False] * workers
        #: per worker: per batch of the current group (reversed, as given), where the next one starts
        self.after: List[List[Cursor]] = [[] for _ in range(workers)]
        self.cursor: List[Cursor] = [None] * workers
        #: per worker, after a restore: packs of the first chunk drawn that were given already
        self.skip = [0] * workers
        #: per worker: no group batched yet in this pass (the first is one batch)
        self.fresh = [True] * workers
        #: per worker: batches given in this pass (the batch hooks' ``current_batch_index``)
        self.batches = [0] * workers
        #: per worker: the chunks drawn ahead whose packs are not taken yet, in order
        self.drawn: List[Deque[Drawn]] = [deque() for _ in range(workers)]
        #: per worker: the next group's batching task started ahead: (wait, groups, where each
        #: group's next batch starts)
        self.next_group: List[Optional[Tuple[Any, List[List[Pack]], List[Cursor]]]] = [None] * workers
        #: per worker: the packing hooks' counts (``Packer.counts``) before the first chunk drawn
        #: (zeros; a restored state's; ``None``: not ``counted``, or a state saved before they were,
        #: whose hooks read positions, restored so), and after each chunk taken (chunk → counts)
        self.first_counts: List[Optional[List[int]]] = [[0, 0, 0, 0] if counted else None for _ in range(workers)]
        self.counts_after: List[Dict[int, List[int]]] = [{} for _ in range(workers)]
        #: per worker: what the next chunk's packing reads its counts from (the first counts, then
        #: the previous chunk's wait; ``None``: positions)
        self.counts_from: List[Any] = list(self.first_counts)

    def head(self, worker: int) -> Cursor:
        """Where the first pack not yet in a batch lies: in a chunk packed, drawn ahead, or (the next
        chunk, 0) when none is (its state before is the current one until it is drawn)."""
        if self.packs[worker]:
            chunk, index = self.packs[worker][0][:2]
            return chunk, index
        drawn = self.drawn[worker]
        if drawn and isinstance(drawn[0], tuple):
            return drawn[0][0], 0
        return self.chunks[worker], 0

    def counts_before(self, worker: int, chunk: int) -> Optional[List[int]]:
        """The packing hooks' counts before ``chunk`` (taken, or the next after the ones taken)."""
        return self.first_counts[worker] if chunk == 0 else self.counts_after[worker].get(chunk - 1)

    def save(self, worker: int) -> Any:
        cursor = self.cursor[worker]
        if cursor is None and self.skip[worker]:  # restored, the chunk not drawn again yet
            state = {"skip": self.skip[worker], "batches": self.batches[worker]}
            chunk = 0
        else:
            state = {"skip": cursor[1] if cursor is not None else 0, "batches": self.batches[worker]}
            chunk = cursor[0] if cursor is not None else self.chunks[worker]
        counts = self.counts_before(worker, chunk)
        if counts is not None:
            state["counts"] = list(counts)
        return state

    def overrides(self, worker: int) -> Optional[Any]:
        cursor = self.cursor[worker]
        return self.before[worker].get(cursor[0]) if cursor is not None else None

    def restore(self, worker: int, state: Any) -> None:
        self.packs[worker].clear()
        self.before[worker].clear()
        self.chunks[worker] = 0
        self.ended[worker] = False
        self.after[worker] = []
        self.cursor[worker] = None
        self.skip[worker] = int(state.get("skip", 0))
        self.batches[worker] = int(state.get("batches", 0))  # (absent from states of before 2026-11-26)
        self.fresh[worker] = False
        self.drawn[worker].clear()
        self.next_group[worker] = None
        counts = state.get("counts")  # (absent from states of before 2026-11-29: positions)
        self.first_counts[worker] = [int(c) for c in counts] if counts is not None else None
        self.counts_after[worker].clear()
        self.counts_from[worker] = self.first_counts[worker]

    def forget_before(self, worker: int) -> None:
        """Drop the states of chunks no pack of which is still to be batched."""
        keep = self.cursor[worker][0] if self.cursor[worker] is not None else self.chunks[worker]
        for chunk in [c for c in self.before[worker] if c < keep]:
            del self.before[worker][chunk]
        for chunk in [c for c in self.counts_after[worker] if c < keep - 1]:
            del self.counts_after[worker][chunk]


def packed_provider(blend: Any, ctx: PassContext, draw: Provider, tree: SubTree, batcher: Any, batches_per_group: int) -> Provider:
    """The provider of ``blend`` (a ``SampleBlendDataset`` with ``packing_buffer_size``): its batches
    of packs of the samples ``draw`` gives."""
    return _PackedBatches(blend, ctx, draw, tree, batcher, batches_per_group)


class _PackedBatches:
    """Called with a worker: its next batch of packs (see the module's docstring), or ``EXHAUSTED``."""

    def __init__(self, blend: Any, ctx: PassContext, draw: Provider, tree: SubTree, batcher: Any, batches_per_group: int):
        self.blend, self.draw, self.tree, self.batcher = blend, draw, tree, batcher
        # unbatched: the packs are handed out one by one (each its own "batch" of one, not batched)
        self.size, self.buffer, self.batched = blend.batch_size or 1, blend.packing_buffer_size, blend.batch_size is not None
        self.batches_per_group = batches_per_group
        workers = blend.num_workers
        self.node = _PackNode(workers, counted=getattr(blend, "counts_packing_hooks", False))
        ctx.register(self.node)
        #: per worker: the current group's batches not handed out yet (reversed)
        self.given: List[List[Any]] = [[] for _ in range(workers)]
        #: with pinning: the groups started ahead, read as soon as their tasks finish (each call
        #: tries): their batches are chained behind the worker's batches before them, so the pin
        #: thread copies a group's first batch ahead of the trainer too
        self.to_read: Dict[int, Any] = {}
        #: per worker: chunks taken and the packs they made in this pass (how many chunks a group needs)
        self.taken_chunks, self.made_packs = [0] * workers, [0] * workers

    def __call__(self, worker: int) -> Any:
        node = self.node
        if self.to_read:
            read_finished(self.to_read)
        while not self.given[worker]:
            if not self.start_group(worker):
                return EXHAUSTED
        item = self.given[worker].pop()
        node.batches[worker] += 1
        node.cursor[worker] = node.after[worker].pop() if node.after[worker] else node.head(worker)
        node.forget_before(worker)
        if LOOK_AHEAD and node.batches[worker] > 1:  # not before a worker's first batch is out
            self.look_ahead(worker)
            started = node.next_group[worker]
            if started is not None and self.batcher.pinner is not None:
                self.to_read[worker] = started[0]
        return handed_out(item)

    def draw_chunk(self, worker: int) -> bool:
        """Draw the next chunk and start its packing task (queued in ``node.drawn``); False at the end."""
        node = self.node
        if node.ended[worker]:
            return False
        before = self.tree.capture(worker)
        samples: List[Any] = []
        while len(samples) < self.buffer * PACK_CHUNK_BUFFERS:
            sample = self.draw(worker)
            if sample is EXHAUSTED:
                node.ended[worker] = True
                break
            samples.append(sample)
        if not samples:
            return False
        chunk = node.chunks[worker]
        node.chunks[worker] += 1
        node.before[worker][chunk] = before
        counts = node.counts_from[worker]
        table, wait = self.batcher.pack(worker, samples, self.buffer, counts)
        if counts is not None:
            node.counts_from[worker] = wait  # the next chunk's packing counts on from this one's
        node.drawn[worker].append((chunk, table, wait))
        return True

    def take_chunk(self, worker: int) -> bool:
        """The packs of the next chunk drawn (drawn now if none was ahead) join the pending ones; False
        at the end. An error kept from drawing or packing it ahead is raised here."""
        node = self.node
        if not node.drawn[worker] and not self.draw_chunk(worker):
            return False
        drawn = node.drawn[worker].popleft()
        if isinstance(drawn, Exception):
            raise drawn
        chunk, table, wait = drawn
        made, report, counts = wait()
        if counts is not None:
            node.counts_after[worker][chunk] = list(counts)
        self.taken_chunks[worker] += 1
        self.made_packs[worker] += len(made)
        self.batcher.stats.add_report(report, self.batcher.chain)
        skip, node.skip[worker] = node.skip[worker], 0
        if skip > len(made):
            raise RuntimeError(
                f"restoring worker stream {worker}: the chunk drawn again made {len(made)} packs, the saved state "
                f"had given {skip} of them (is packing deterministic for the same samples?)"
            )
        for index, (position, sub) in enumerate(made):
            if index >= skip:
                node.packs[worker].append((chunk, index, position, sub, Located(table, 0, 0, index)))
        return True

    def take_group(self, worker: int, wanted: int) -> Optional[List[List[Pack]]]:
        """The next ``wanted`` pending packs (fewer at the end; taking chunks as needed) cut into
        batches, or None when none is left (or only a short last batch is, with ``drop_last``)."""
        pending, size = self.node.packs[worker], self.size
        while len(pending) < wanted and self.take_chunk(worker):
            pass
        count = min(len(pending), wanted)
        if self.blend.drop_last:  # fewer than wanted: the stream's end, whose short last batch goes
            count -= count % size
        if count == 0:
            pending.clear()
            return None
        taken = [pending.popleft() for _ in range(count)]
        return [taken[i : i + size] for i in range(0, count, size)]

    def submit(self, worker: int, groups: List[List[Pack]], first_index: int) -> Tuple[Any, List[List[Pack]], List[Cursor]]:
        """Start the batching task of ``groups`` (the first batch's index ``first_index``)."""
        wait = self.batcher(worker, [[(p[2], p[3], p[4], None) for p in group] for group in groups], first_index, batched=self.batched)
        # where the next batch starts once each made batch is given: after its group
        starts: List[Cursor] = [(g[0][0], g[0][1]) for g in groups[1:]] + [self.node.head(worker)]
        return wait, groups, starts

    def start_group(self, worker: int) -> bool:
        """Batch the next group of pending packs (drawing chunks as needed), or take the one started
        ahead; False at the end."""
        node = self.node
        self.to_read.pop(worker, None)
        started, node.next_group[worker] = node.next_group[worker], None
        if started is None:
            groups = self.take_group(worker, self.size * (1 if node.fresh[worker] else self.batches_per_group))
            node.fresh[worker] = False
            if groups is None:
                node.cursor[worker] = None
                return False
            started = self.submit(worker, groups, node.batches[worker])
        wait, groups, starts = started
        made, spans = wait()
        node.after[worker] = list(reversed(_cursors_after(groups, starts, spans)))
        self.given[worker] = list(reversed(made))
        return True

    def look_ahead(self, worker: int) -> None:
        """Take the packs of chunks drawn ahead whose packing finished, draw the chunks the next group
        still needs and start their packing, or start the next group's batching once its packs are
        made; never waits for Ray (work not finished is taken at a later call)."""
        node = self.node
        drawn = node.drawn[worker]
        if node.next_group[worker] is not None or (drawn and isinstance(drawn[-1], Exception)):
            return
        wanted = self.size * self.batches_per_group
        try:
            while drawn and isinstance(drawn[0], tuple) and drawn[0][2].ready():
                self.take_chunk(worker)
        except Exception as exc:  # raised where the trainer meets it without looking ahead: before later chunks
            drawn.appendleft(exc)
            return
        if len(node.packs[worker]) < wanted:
            per_chunk = max(1, self.made_packs[worker] // max(1, self.taken_chunks[worker]))
            try:
                while (not node.ended[worker] and len(drawn) < MAX_CHUNKS_AHEAD
                       and len(node.packs[worker]) + len(drawn) * per_chunk < wanted):  # fmt: skip
                    if not self.draw_chunk(worker):
                        break
            except Exception as exc:  # (a draw's error: after the chunks drawn before it)
                drawn.append(exc)
                return
            if drawn:
                return
        groups = self.take_group(worker, wanted)  # packs enough, or the last ones: waits for nothing
        if groups is not None:
            node.next_group[worker] = self.submit(worker, groups, node.batches[worker] + len(self.given[worker]))


def _cursors_after(groups: List[List[Pack]], starts: List[Cursor], spans: List[Any]) -> List[Cursor]:
    """Where the next batch starts once each made batch is given (``spans``: per batch, the positions
    of the packs it consumed, empty for all but the last batch of a split group)."""
    after: List[Cursor] = []
    g = 0
    for span in spans:
        if not span:  # one of several batches of a group: the group is not consumed yet
            after.append((groups[g][0][0], groups[g][0][1]) if g < len(groups) else starts[-1])
            continue
        while g < len(groups) - 1 and [int(p) for p in span] != [int(p[2]) for p in groups[g]]:
            g += 1
        after.append(starts[g])
        g += 1
    return after
