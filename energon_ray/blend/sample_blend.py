"""The train blend of a metadataset, sample by sample: ``SampleBlendDataset``.

Energon blends a metadataset's encoded samples and then batches them, so one batch holds samples
of several datasets. Here each leaf's Ray tasks leave their encoded samples unbatched and still
serialized (``PlanOptions.blend_samples``: the leaf's queues hand them out one by one), the blend
draws the source of each sample from the worker's seeded generator, and a Ray task batches each
group of drawn samples (``batch`` and ``encode_batch`` never run in the training process).

Per logical worker, ``BATCHES_PER_GROUP`` batches' worth of samples are drawn at once and batched
by one Ray task holding a CPU, as a segment task does, on the same warm worker processes (a
batching actor beside them, with no CPU of its own, measured slower on 2 cores: a third process
importing torch at the start, then competing with the segment tasks for the cores; see
benchmarks/README, stop 36). The next group is drawn and started before this one is waited for
(the trainer waits only when it outruns them); a pass's first group is one batch, so the first
batch waits for no more draws than it needs. What
a save records is the state before the group being given (the leaves' pools and the draws) and
how many of its batches were given; a restore draws that group again (at full size: never fewer
batches than were given of it) and drops those (``blend.replay.GroupNode``).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

from energon_ray.blend.base import Composition, PassContext, Provider
from energon_ray.blend.base import ListNode
from energon_ray.blend.compose import BlendDataset, PooledBlendDataset
from energon_ray.blend.replay import GroupNode, SubTree
from energon_ray.loader.group_items import GroupItems, read_finished
from energon_ray.loader.merge import EXHAUSTED
from energon_ray.loader.pinning import handed_out
from energon_ray.pipeline.policy import FailureChain

#: Batches drawn and batched by one Ray task ahead of the trainer (per logical worker).
BATCHES_PER_GROUP = 4


class SampleBlendDataset(PooledBlendDataset):
    """A metadataset's batched (or packed) train blend: samples drawn by weight from the leaves,
    then packed and batched in Ray tasks (batches and packs mix datasets, as Energon's do).

    Args:
        *datasets: ``(leaf, weight)`` pairs of leaves built with ``blend_samples=True``.
        batch_size: samples per batch (``None``: unbatched, the packs one by one; needs packing).
        drop_last: drop each worker's last short batch (a pass of non-repeating leaves).
        packing_buffer_size: pack the drawn samples before batching (``blend.packed_blend``); a
            batch is then ``batch_size`` packs.

    Raises:
        ValueError: ``batch_size=None`` without ``packing_buffer_size``, or a leaf not built to
            hand out its samples.
    """

    #: whether the packing hooks read Energon's counts of their calls (``blend.packed_blend``): a
    #: validation metadataset's (``SampleConcatDataset``), whose order is Energon's; not a train
    #: blend's, whose chunks then pack side by side (its draws are not Energon's anyway)
    counts_packing_hooks = False

    def __init__(self, *datasets: Tuple[Composition, float], batch_size: Optional[int], drop_last: bool = False,
                 packing_buffer_size: Optional[int] = None):  # fmt: skip
        if batch_size is None and not packing_buffer_size:
            raise ValueError("SampleBlendDataset: batch_size=None needs packing_buffer_size (unbatched samples are "
                             "drawn as they are: PooledBlendDataset)")  # fmt: skip
        super().__init__(*datasets, batch_size=batch_size, drop_last=drop_last)
        self.packing_buffer_size = packing_buffer_size
        for ds in self.datasets:
            if not getattr(getattr(ds, "options", None), "blend_samples", False):
                raise ValueError(f"SampleBlendDataset: {ds!r} was not built to hand out its samples (blend_samples)")
        #: each leaf packs its own samples, as older loaders did (``packing_form``; a state they saved
        #: restores so): ``datasets`` are then copies of the leaves that do, these the leaves
        self.per_dataset = False
        self.sample_leaves = list(self.datasets)

    def packing_form(self) -> Optional["SampleBlendDataset"]:
        """This blend, where loaders before 2026-11-29 packed each leaf's samples on its own (an
        unbatched packed blend: its packs were drawn by weight, ``PooledBlendDataset``), so that
        their states restore so (``pack_per_dataset``); ``None`` where none did."""
        return self if self.batch_size is None and self.packing_buffer_size else None

    def pack_per_dataset(self, value: bool) -> None:
        """``True``: pack as the older loaders did (``alone_provider`` over copies of the leaves that
        pack their own samples); ``False``: the blended samples are packed."""
        if value and self.packing_form() is None:
            raise ValueError(f"{type(self).__name__}: no older loader packed its datasets alone")
        if value != self.per_dataset:
            self.per_dataset = value
            self.datasets = packing_alone(self.sample_leaves) if value else list(self.sample_leaves)

    def described(self) -> Composition:
        """What a saved state's fingerprint describes (packing alone: the older loaders' composition)."""
        return self.alone(self.datasets) if self.per_dataset else self

    def alone(self, leaves: List[Composition]) -> Composition:
        """The composition older loaders built of ``leaves`` that pack their own samples."""
        return PooledBlendDataset(*zip(leaves, [w for _, w in self.dataset_weights]), batch_size=self.batch_size,
                                  drop_last=self.drop_last)  # fmt: skip

    def other_form(self) -> Optional[Composition]:
        """This blend packing the other way (``pack_per_dataset``), whose states fit too; ``None``
        where it packs one way only."""
        if self.packing_form() is None:
            return None
        other = copy.copy(self)
        other.pack_per_dataset(not self.per_dataset)
        return other

    def alone_provider(self, ctx: PassContext, pass_index: int) -> Provider:
        """Packing alone: the leaves' packs drawn by weight, as ``PooledBlendDataset``'s."""
        return BlendDataset.provider(self, ctx, pass_index)

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        if self.per_dataset:
            return self.alone_provider(ctx, pass_index)
        first = len(ctx.nodes)
        draw = self.draw_provider(ctx, pass_index)  # one pooled (position, sub, payload, leaf) per call
        batcher = _GroupBatcher([ctx.feeds[id(leaf)] for leaf in self.leaves()])
        if self.packing_buffer_size:  # (its node counts the batches it gives)
            from energon_ray.blend.packed_blend import packed_provider

            return packed_provider(self, ctx, draw, SubTree(ctx, first, ctx.leaf_indices(self)), batcher, BATCHES_PER_GROUP)
        return _SampleBatches(self, ctx, draw, first, batcher)

    def draw_provider(self, ctx: PassContext, pass_index: int) -> Provider:
        """Called with a worker: its next drawn sample ``(position, sub, payload, leaf)``, or ``EXHAUSTED``."""
        return super().provider(ctx, pass_index)

    def leaf_shares(self):
        # a step (one batch) takes batch_size samples (about one, unbatched), weight × that from each leaf
        per_step = self.batch_size or 1
        return {leaf: (share * per_step, offset) for leaf, (share, offset) in super().leaf_shares().items()}

    def schedule_hints(self, pass_index: int, items_per_step: int = 1):
        return super().schedule_hints(pass_index, items_per_step=self.batch_size or 1)

    def __repr__(self) -> str:
        return "SampleBlendDataset(" + ", ".join(f"({ds!r}, {w:.3g})" for ds, w in zip(self.datasets, self.weights)) + ")"


def packing_alone(leaves: List[Composition]) -> List[Composition]:
    """Copies of ``leaves`` that pack their own samples (their Ray tasks pack, buffers restarting at
    each leaf), as older loaders' leaves did."""
    twins = []
    for leaf in leaves:
        twin = copy.copy(leaf)
        twin.options = dataclasses.replace(leaf.options, blend_samples=False)
        twin._stages = None
        twins.append(twin)
    return twins


class _SampleBatches:
    """Called with a worker: its next batch of drawn samples (see the module's docstring), or
    ``EXHAUSTED``."""

    def __init__(self, blend: SampleBlendDataset, ctx: PassContext, draw: Provider, first_node: int, batcher: "_GroupBatcher"):
        self.blend, self.draw, self.batcher = blend, draw, batcher
        workers = blend.num_workers
        # per worker: samples drawn in this pass (the next batch's index × batch size), saved and
        # restored with the draws (registered before the sub-tree is taken: its captures hold it)
        self.drawn = [0] * workers
        ctx.register(ListNode(self.drawn))
        self.tree = SubTree(ctx, first_node, ctx.leaf_indices(blend))
        self.node = _AheadNode(workers)
        ctx.register(self.node)
        #: per worker: the current group's batches not handed out yet (reversed)
        self.given: List[List[Any]] = [[] for _ in range(workers)]
        #: with pinning: the groups drawn ahead, read as soon as their tasks finish
        #: (``GroupItems.read_if_ready``, tried at each call; their batches chained behind the
        #: worker's before them): a group's first batch is then copied ahead, not while the trainer
        #: waits for it (with few workers, a group's last batch may be the step before its next's first)
        self.to_read: Dict[int, Any] = {}

    def __call__(self, worker: int) -> Any:
        if self.to_read:
            read_finished(self.to_read)
        item = self.next_item(worker)
        ahead = self.node.ahead[worker]
        if ahead is not None and ahead[1] is not None and self.batcher.pinner is not None:
            self.to_read[worker] = ahead[1]
        return item

    def next_item(self, worker: int) -> Any:
        node, given = self.node, self.given
        while not given[worker]:
            if node.ahead[worker] is None:
                node.ahead[worker] = self.start_group(worker)
            before, wait, first, groups = node.ahead[worker]
            if wait is None:  # nothing left to draw
                return EXHAUSTED
            # the next group is drawn (and batched) while this one is batched and then given; not
            # so after a pass's first group (one batch): the first batch waits for no more draws
            node.ahead[worker] = None if first else self.start_group(worker)
            made, spans = wait()
            node.begin(worker, before)
            node.samples[worker] = _samples_of(groups, spans)
            given[worker] = list(reversed(made[node.take_discard(worker) :]))
        return handed_out(node.give(worker, given[worker]))

    def start_group(self, worker: int) -> Tuple[Any, Optional[Callable[[], List[Any]]], bool, List[List[Any]]]:
        """Draw the next group and start its Ray task: (state before it, wait, first, its batches'
        samples) — wait is None at the end.

        A pass's first group is one batch (the first batch waits for no more draws than it needs);
        the others ``BATCHES_PER_GROUP``, a restored one too (it must hold at least the batches
        given of the group it replays)."""
        node, size = self.node, self.blend.batch_size
        before = self.tree.capture(worker)
        first, node.fresh[worker] = node.fresh[worker], False
        group_samples = size * (1 if first else BATCHES_PER_GROUP)
        samples: List[Any] = []
        while len(samples) < group_samples:
            sample = self.draw(worker)
            if sample is EXHAUSTED:
                break
            samples.append(sample)
        index = self.drawn[worker] // size  # the worker's batches so far: Energon's batch index
        self.drawn[worker] += len(samples)
        full = len(samples) - len(samples) % size
        groups = [samples[i : i + size] for i in range(0, full, size)]
        if full < len(samples) and not self.blend.drop_last:
            groups.append(samples[full:])
        return before, (self.batcher(worker, groups, index) if groups else None), first, groups

def _samples_of(groups: List[List[Any]], spans: List[List[int]]) -> List[List[List[int]]]:
    """Per batch made from ``groups`` (``spans``: its samples' positions): ``[leaf, position]`` of
    the samples it took, with those of any group before it whose batch failed (skipped samples are
    consumed too). A group's samples count as taken with its last batch (a generator hook can make
    several; the others carry no positions)."""
    out: List[List[List[int]]] = []
    g = 0
    for span in spans:
        taken: List[List[int]] = []
        if not span:
            out.append(taken)
            continue
        while g < len(groups):
            group = groups[g]
            g += 1
            taken.extend([int(leaf), int(position)] for position, _, _, leaf in group)
            if [int(p) for p in span] == [int(position) for position, _, _, _ in group]:
                break
        out.append(taken)
    return out


class _AheadNode(GroupNode):
    """``GroupNode`` with one group drawn ahead: once the current group is given, the save point is
    the state before the group drawn ahead (its draws and pool samples are already taken).

    Its saved state also names the samples of the batches already given of the current group
    (``consumed``: ``[leaf, position]`` pairs): a restore on another world size or worker count
    counts them as seen (the leaves' states are from before the group)."""

    def __init__(self, workers: int):
        super().__init__(None, workers)  # captures come from the provider
        #: per worker: ``(state before it, wait, whether it is the pass's first, its batches'
        #: samples)`` of the group drawn ahead, or None
        self.ahead: List[Optional[Tuple[Any, Optional[Callable[[], Any]], bool, List[List[Any]]]]] = [None] * workers
        #: per worker: no group drawn yet in this pass, nor restored (the first group is one batch)
        self.fresh = [True] * workers
        #: per worker: per batch made of the current group, ``[leaf, position]`` of its samples
        self.samples: List[List[List[List[int]]]] = [[] for _ in range(workers)]
        #: per worker: ``consumed`` of the state restored, until its group is made again
        self.restored: List[List[List[int]]] = [[] for _ in range(workers)]

    def save(self, worker: int) -> Any:
        state = super().save(worker)
        if self.active[worker] and self.taken[worker]:
            state["consumed"] = [ref for batch in self.samples[worker][: self.taken[worker]] for ref in batch]
        elif not self.active[worker] and self.discard[worker] and self.restored[worker]:
            state["consumed"] = self.restored[worker]  # restored, its group not yet made again
        return state

    def begin(self, worker: int, before: Any = None) -> None:
        self.before[worker] = before
        self.taken[worker] = 0
        self.active[worker] = True

    def overrides(self, worker: int) -> Optional[Any]:
        if self.active[worker]:
            return self.before[worker]
        ahead = self.ahead[worker]
        return ahead[0] if ahead is not None else None

    def restore(self, worker: int, state: Any) -> None:
        super().restore(worker, state)
        self.ahead[worker] = None
        self.fresh[worker] = False
        self.restored[worker] = [[int(leaf), int(p)] for leaf, p in state.get("consumed", ())]


class _GroupBatcher:
    """A Ray task batches a group's drawn samples (``pipeline.seam_stages.seam_batches``),
    each ``batch_size`` samples in the order drawn, with the first leaf's task encoder (a
    metadataset's leaves share it) and hook seeds from the samples' positions."""

    def __init__(self, feeds: List[Any]):
        self.feeds = feeds
        self.stats = feeds[0].queues.stats  # the loader's counters
        self.chain = FailureChain()
        self._tasks = None

    def _seam_tasks(self) -> Any:
        if self._tasks is None:
            from energon_ray.pipeline.seam_tasks import SeamTasks

            first = self.feeds[0]
            self._tasks = SeamTasks(first.dataset.stage_config(), first.source, first.multi.ray_remote_args,
                                    before_first=first.multi.before_first_batch)  # fmt: skip
        return self._tasks

    def _seed(self, worker: int) -> int:
        return self.feeds[0].plan.streams[worker].config.hook_seed

    def __call__(
        self, worker: int, groups: List[List[Any]], first_index: Optional[int] = None, batched: bool = True,
    ) -> Callable[[], Tuple[List[Any], List[List[int]]]]:
        """Start the task; the returned function waits for its batches and their samples' positions
        (fewer batches than groups where a batch hook failed or skipped: counted). ``first_index``:
        the first group's batch index in the worker's blended stream (the next ones follow it).
        ``batched=False``: each group's items (packs) are handed out as they are, one by one."""
        ship = self.feeds[0].multi.block_refs.ship
        groups_out = [
            (len(g) if batched else None, [(position, sub, ship(payload)) for position, sub, payload, _ in g],
             *(() if first_index is None else (first_index + i,)))
            for i, g in enumerate(groups)
        ]  # fmt: skip
        wait = self._seam_tasks().submit(worker, self._seed(worker), groups_out)
        return GroupItems(wait, self.pinner, self.stats, self.chain, stream=("group", id(self), worker), count_seams=True)

    @property
    def pinner(self) -> Any:
        """The pass's pinner (``None``: no pinning)."""
        return self.feeds[0].multi.pinner

    def pack(self, worker: int, samples: List[Any], buffer_size: int, counts: Any = None) -> Tuple[Any, Callable[[], Any]]:
        """Start packing drawn samples: the reference of the packs' table and a callable waiting for
        ``([(position, sub)] of the packs, report, the packing hooks' counts after them)``
        (``ready()``: whether that would wait). ``counts``: before them (``SeamTasks.submit_pack``)."""
        ship = self.feeds[0].multi.block_refs.ship
        chunk = [(position, sub, ship(payload)) for position, sub, payload, _ in samples]
        offsets = None if counts is not None else self._index_offsets(worker, samples)
        return self._seam_tasks().submit_pack(worker, self._seed(worker), chunk, buffer_size, offsets, counts)

    def _index_offsets(self, worker: int, samples: List[Any]) -> Optional[List[int]]:
        """Per drawn sample, the samples of the worker's stream before its leaf's (a validation
        metadataset's ``batch_index_offsets``: the packing hooks' indices count on over the
        datasets, as sample hooks' do); ``None`` where every one is 0 (a training blend)."""
        before = {}
        for feed in self.feeds:
            offsets = feed.dataset.options.batch_index_offsets
            before[feed.source] = int(offsets[worker]) if offsets is not None else 0
        out = [before.get(leaf, 0) for _, _, _, leaf in samples]
        return out if any(out) else None
