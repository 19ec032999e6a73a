"""Restoring on another world size or worker count: the unfinished epoch, shared out again.

The saved states of all ranks say, per leaf and old worker stream, what was read (the checkpoint's
segment), what is pooled and which positions of the items since the checkpoint were consumed. What
is left of each old stream's current epoch (or of a finite pass) is therefore a list of sample
indices, in the old stream's order. ``redistribute`` concatenates those lists over the old global
workers and cuts them into one contiguous *prefix* per new global worker; each new worker stream
reads its prefix first and then its own epochs with the new sharding (``WorkerStream.prefix``), from
the first epoch no old stream had started. Nothing is lost and nothing is repeated; the order is
the old streams' order, but batches, hook seeds and blend draws are the new configuration's, so this
is lossless, not exact. A state saved during such a pass carries the old states (``elastic``), from
which the prefixes are computed again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from energon_ray.loader.savable import check_seed, fingerprints, new_state, warn_other_encoders, what_differs
from energon_ray.loader.state import STATE_VERSION, LoaderState, StateError, expand_ranges
from energon_ray.pipeline.chained import is_generator_encoder
from energon_ray.plan.stream import SegmentLayout
from energon_ray.worker import WorkerConfig


@dataclasses.dataclass
class Redistribution:
    """A pass whose worker streams start with the rest of another configuration's epoch."""

    pass_index: int
    #: epoch number of the new streams' own epochs (after their prefixes)
    first_epoch: int
    #: per leaf, per local worker: the sample indices its stream reads first
    prefixes: List[List[np.ndarray]]
    #: the states it was computed from (``LoaderState.to_dict()`` each)
    origin: List[Dict[str, Any]]

    def plan(self, leaf: Any, source: int):
        return leaf.plan(self.first_epoch, source=source, prefixes=self.prefixes[source])

    def streams(self, leaf: Any, source: int, worker_config: WorkerConfig):
        return leaf.streams(self.first_epoch, worker_config=worker_config, prefixes=self.prefixes[source])


def needs_redistribution(states: Sequence[LoaderState], wc: WorkerConfig, entries: Optional[int] = None) -> bool:
    """Whether saved states come from another world size or worker count than ``wc`` (``entries``:
    how many ranks ``save_state_global`` listed, ``None`` for those saved before their first batch)."""
    first = states[0]
    count = len(states) if entries is None else entries
    return (count, first.world_size, first.num_workers) != (wc.world_size, wc.world_size, max(1, wc.num_workers))


def own_state(entries: Sequence[Any], states: Sequence[LoaderState], rank: int) -> Optional[LoaderState]:
    """``rank``'s state among ``save_state_global``'s entries of this world size (``states``: those
    not ``None``); ``None`` when the rank saved before its first batch (it starts afresh, as Energon's).

    Raises:
        StateError: no state of ``rank`` where its entry is not ``None``, or more than one.
    """
    mine = [s for s in states if s.rank == rank]
    if len(mine) == 1:
        return mine[0]
    if not mine and entries[rank] is None:
        return None
    raise StateError(
        f"restore_state_global wants the state of each of the {len(entries)} ranks, in rank order (None for a rank "
        f"saved before its first batch); for rank {rank} it got the states of ranks {[s.rank for s in states]}"
    )


def redistribute(dataset: Any, states: Sequence[LoaderState]) -> Tuple[LoaderState, Optional[Redistribution]]:
    """This rank's state and stream prefixes from every rank's state of another configuration.

    Raises:
        StateError: states missing or of different loaders, another sample order, a dataset that
            packs samples, repeats whole epochs (``blend_epochized``) or batches across the datasets of
            a validation metadataset, or a wrapper that held pulled items when the state was saved.
    """
    states = _check(dataset, states)
    wc = dataset.worker_config
    mine = new_state(dataset, states[0].passes, states[0].epoch_items)
    pass_index = common_pass(states)
    if pass_index is None:  # saved between passes: the next pass starts fresh anyway
        return mine, None
    redist = stream_prefixes(dataset, states, wc)
    origin = [s.to_dict() for s in states]
    mine = dataclasses.replace(mine, pass_index=pass_index, elastic={"pass_index": pass_index, "states": origin})
    return mine, redist


def common_pass(states: Sequence[LoaderState]) -> Optional[int]:
    """The pass the ranks' states are in (``None``: all saved between passes). A rank saved between
    passes while others were still in the pass it had finished (``repeat=False``, it held fewer
    samples) counts as at the end of that pass.

    Raises:
        StateError: states of different passes otherwise.
    """
    running = {s.pass_index for s in states if s.pass_index is not None}
    if len({s.passes for s in states}) == 1 and len(running) <= 1:  # all started as many passes: the same last one
        return running.pop() if running else None
    finished = [s.rank for s in states if s.pass_index is None]
    raise StateError(
        "the ranks' states are from different passes (passes started, pass in progress: "
        f"{sorted({(s.passes, s.pass_index) for s in states}, key=repr)}"
        + (f"; ranks {finished} between passes" if finished else "")
        + "); save every rank's state at the same step"
    )


def from_origin(dataset: Any, elastic: Dict[str, Any], wc: Optional[WorkerConfig] = None) -> Redistribution:
    """The redistribution a state saved during a redistributed pass was running on (for ``wc``,
    by default the loader's own worker config)."""
    wc = wc or dataset.worker_config
    states = [LoaderState.coerce(s) for s in elastic["states"]]
    if same_shape(states, wc):  # a smaller batch size's pass (loader.rebatch), checked when it was restored
        return stream_prefixes(dataset, states, wc)
    return stream_prefixes(dataset, _check(dataset, states), wc)


def same_shape(states: Sequence[LoaderState], wc: WorkerConfig) -> bool:
    """Whether saved states come from ``wc``'s world size and worker count (only the batch size
    changed: each worker stream keeps its own rest, see ``loader.rebatch``)."""
    return all((s.world_size, s.num_workers) == (wc.world_size, max(1, wc.num_workers)) for s in states)


def _check(dataset: Any, states: Sequence[Any]) -> List[LoaderState]:
    states = check_complete(states)
    check_seed(states[0].seed_offset, dataset)
    # what cannot move at all first: its order fingerprint differs on another world size too (a
    # validation metadataset's batch index offsets), which named that instead of the reason
    check_movable(dataset, states, "restoring on another world size or worker count")
    check_order(dataset, states)
    return states


def check_complete(states: Sequence[Any]) -> List[LoaderState]:
    """``states`` in rank order, checked to be every rank's state of one run at one step (what can be
    checked without the dataset; ``energon-ray checkpoint redist`` checks these alone).

    Raises:
        StateError: no states, ranks missing or repeated, of different world sizes or worker counts,
            passes or seeds.
    """
    states = sorted((LoaderState.coerce(s) for s in states), key=lambda s: s.rank)
    if not states:
        raise StateError("restoring on another world size needs the states of all ranks; got none")
    world, workers = states[0].world_size, states[0].num_workers
    if [s.rank for s in states] != list(range(world)) or any((s.world_size, s.num_workers) != (world, workers) for s in states):
        raise StateError(
            f"restoring on another world size needs the states of all {world} ranks of one run (ranks 0..{world - 1}, "
            f"one each); got ranks {[s.rank for s in states]} of world sizes {sorted({s.world_size for s in states})}"
        )
    common_pass(states)
    seeds = sorted({s.seed_offset for s in states}, key=repr)
    if len(seeds) > 1:
        raise StateError(
            f"the ranks' states are from runs of different seeds (WorkerConfig seed_offset {seeds}); pass the states "
            "every rank of one run saved at the same step"
        )
    return states


def check_order(dataset: Any, states: Sequence[LoaderState]) -> None:
    """Raises ``StateError`` naming what changes the sample order between ``states`` and ``dataset``."""
    accepted = fingerprints(dataset, order_only=True)
    ours = accepted[0]
    for s in states:
        if s.version != STATE_VERSION or s.order_fingerprint not in accepted:
            named = what_differs(s, dataset, order_only=True)
            if named:
                raise StateError(
                    f"the states were saved for another dataset or sample order: {named}; only the world size, "
                    "worker count, batch size and task encoders may change"
                )
            raise StateError(
                "the states were saved for another dataset or sample order (datasets, split, seeds, shuffle or weights "
                f"differ: order fingerprint {s.order_fingerprint or 'none'} vs {ours}); only the world size, "
                "worker count, batch size and task encoders may change"
            )
    warn_other_encoders(states[0].task_encoders, dataset)


def check_movable(dataset: Any, states: Sequence[LoaderState], what: str) -> None:
    """Raises ``StateError`` where the unfinished epoch cannot be cut into stream prefixes: a leaf that
    packs, repeats a set number of times or batches across a validation metadataset's datasets, a
    ``LimitDataset`` that had counted, a wrapper that held pulled items (``what``: the restore asked for)."""
    for i, leaf in enumerate(dataset.leaves()):
        o = leaf.options
        why = (
            "packs samples (a pack holds samples of several positions, made per segment or per blend chunk)" if o.packing_buffer_size else
            "repeats its epochs a set number of times (a RepeatDataset with repeats, or a blend_epochized part)" if o.repetitions is not None else
            "batches across the datasets of a validation metadataset" if o.batch_across_sources else None
        )  # fmt: skip
        if why is not None:
            raise StateError(
                f"{what} is not supported for {leaf!r}: it {why}; restore with the world size, num_workers "
                "and batch size it was saved with"
            )
    check_saved_nodes(states, what)


def check_saved_nodes(states: Sequence[LoaderState], what: str) -> None:
    """Raises ``StateError`` where a state's composition node cannot move (``check_movable``'s part
    that reads the states alone: a counted ``LimitDataset``, a wrapper holding pulled items)."""
    for s in states:
        for per_worker in s.nodes:
            for worker, node in enumerate(per_worker):
                if isinstance(node, dict) and int(node.get("limited", 0) or 0) > 0:
                    raise StateError(
                        f"{what}: rank {s.rank}'s worker stream {worker} was saved "
                        f"after a LimitDataset had counted {node['limited']} of its items; its limit is per rank and worker "
                        "stream, and the items given do not map onto the new ones (the pass would give more than its limit, "
                        "or fewer than the old ranks had left). Restore with the world size, num_workers and batch size "
                        "it was saved with, or save where the limited pass begins"
                    )
                if _holds_items(node):
                    raise StateError(
                        f"{what}: rank {s.rank}'s worker stream {worker} was saved "
                        "while a wrapper held items it had pulled (a ShuffleBufferDataset or GroupBatchDataset buffer, "
                        "a PackingDataset or generator batcher/map_fn/IterMapDataset half-way through its outputs); "
                        "which of its samples were given is not in the state. Restore with the world size, "
                        "num_workers and batch size it was saved with"
                    )


def _holds_items(node: Any) -> bool:
    """Whether a composition node's saved state replaces its leaves' states by older ones (items it
    pulled are held, or outputs of a group half given) without naming what it gave since."""
    if not isinstance(node, dict):
        return False
    if node.get("live"):
        return True
    return int(node.get("discard", 0) or 0) > 0 and "consumed" not in node


def _old_config(wc: WorkerConfig, state: LoaderState) -> WorkerConfig:
    return dataclasses.replace(wc, rank=state.rank, world_size=state.world_size, num_workers=state.num_workers)


def stream_prefixes(dataset: Any, states: List[LoaderState], wc: WorkerConfig) -> Redistribution:
    """Every leaf's unfinished epoch over the old global workers, cut into ``wc``'s share; states of
    ``wc``'s own world size and worker count (another batch size): each stream's own rest, every
    leaf's up to one common epoch, so each stream goes on exactly as the saved one would have."""
    pass_index = common_pass(states)
    new_workers = max(1, wc.num_workers)
    own = same_shape(states, wc)
    if own:
        states = [s for s in states if s.rank == wc.rank]
    # each old rank's own redistribution (a state saved during a redistributed pass), computed once
    olds = [
        (state, _old_config(wc, state),
         from_origin(dataset, state.elastic, _old_config(wc, state))
         if state.elastic is not None and state.elastic.get("pass_index") == pass_index else None)
        for state in states
    ]  # fmt: skip
    progress = [_leaf_progress(leaf, i, olds, pass_index) for i, leaf in enumerate(dataset.leaves())]
    # the epoch no old stream had begun: a stream that gave (or pooled) items of a later epoch than
    # its checkpoint's segment (a segment across an epoch boundary of an endless stream) had begun
    # that epoch, and every other stream gives its share of it too, so none of it comes twice
    targets = [max((stream.epoch_at(stream.epoch_end(reached)) for stream, *_, reached in p), default=pass_index) for p in progress]
    if own and targets:
        targets = [max(targets)] * len(targets)
    prefixes: List[List[np.ndarray]] = []
    next_epoch = pass_index
    for i, (leaf_progress, target) in enumerate(zip(progress, targets)):
        rest: List[np.ndarray] = []
        for stream, w, start, pooled, consumed, _ in leaf_progress:
            samples, epoch = _rest(stream, start, pooled, consumed, target, w, i)
            rest.append(samples)
            next_epoch = max(next_epoch, epoch)
        if own:
            prefixes.append(rest)
            continue
        everything = np.concatenate(rest) if rest else np.empty(0, dtype=np.int64)
        cuts = _balanced(len(everything), new_workers * wc.world_size)
        first = wc.rank * new_workers
        prefixes.append([everything[cuts[g] : cuts[g + 1]] for g in range(first, first + new_workers)])
    return Redistribution(pass_index, next_epoch, prefixes, [s.to_dict() for s in states])


def _leaf_progress(leaf: Any, i: int, olds: List[Tuple[LoaderState, WorkerConfig, Any]], pass_index: int) -> List[tuple]:
    """``(stream, worker, start, pooled, consumed, reached)`` of each old worker stream of leaf ``i``."""
    chained = leaf.stage_config().chained
    straddle = chained and is_generator_encoder(leaf.task_encoder)
    out = []
    for state, old_wc, origin in olds:
        old = origin.streams(leaf, i, old_wc) if origin is not None else leaf.streams(pass_index, worker_config=old_wc)
        out += [(stream, w, *_progress(stream, state, i, w, chained, straddle)) for w, stream in enumerate(old)]
    return out


def _given_by_nodes(state: LoaderState, leaf: int, worker: int) -> set:
    """Positions of ``leaf`` that a composition node of ``worker`` gave out after the leaves' saved
    states (a sample blend's batches already given of the group being given)."""
    out = set()
    for per_worker in state.nodes:
        node = per_worker[worker] if worker < len(per_worker) else None
        if isinstance(node, dict):
            out.update(int(p) for ref_leaf, p in node.get("consumed", ()) if int(ref_leaf) == leaf)
    return out


def _progress(
    stream: Any, state: LoaderState, leaf: int, worker: int, chained: bool = False, straddle: bool = False
) -> Tuple[int, set, set, int]:
    """Where an old worker stream stood: its checkpoint's first position, the positions its pools
    held, the positions given since, and the position after the furthest one it gave or pooled (the
    epoch that holds it was begun). ``chained``: the samples of the batch open at the checkpoint
    count as not given (they come again); ``straddle`` (a generator ``encode_sample``), so does the
    last sample given (its outputs may go on in the next batch)."""
    if state.pass_index is None:  # its rank had finished the pass the others were in
        if stream.length is None:
            raise StateError(f"rank {state.rank} was saved between passes of an endless stream while other ranks were in one")
        return stream.length, set(), set(), stream.length
    if not state.streams:  # a redistributed pass that had not started: nothing read yet
        return 0, set(), set(), 0
    saved = state.streams[leaf][worker]
    cp = saved.checkpoint
    start = SegmentLayout.from_list(state.segment_lengths[leaf]).start(cp.segment)
    pooled = {int(p) for ref_leaf, p, _ in cp.refs() if ref_leaf == leaf}
    consumed = set(expand_ranges(saved.positions)) | _given_by_nodes(state, leaf, worker)
    reached = max([start, *(p + 1 for p in pooled | consumed)])
    if chained:  # a sample's outputs may straddle batches
        if cp.chain is not None and len(cp.chain) > 2 and cp.chain[2] is not None:
            start = min(start, int(cp.chain[2]))  # the open batch's samples were read, not given
        if straddle and saved.positions:  # the last sample given may have outputs left: given again, in full
            consumed.discard(max(expand_ranges(saved.positions)))
    if stream.length is not None:
        start, reached = min(start, stream.length), min(reached, stream.length)
    return start, pooled, consumed, reached


def _rest(stream: Any, start: int, pooled: set, consumed: set, target: int, worker: int, leaf: int) -> Tuple[np.ndarray, int]:
    """Sample indices an old worker stream had not yet given, up to where epoch ``target`` begins
    (in stream order; its end, for a finite stream that ends first), and the epoch that follows."""
    end = stream.epoch_end(start)
    while stream.epoch_at(end) < target and (stream.length is None or end < stream.length):
        end = stream.epoch_end(end + 1)
    positions = np.array(sorted((set(range(start, end)) | pooled) - consumed), dtype=np.int64)
    if not len(positions):
        return np.empty(0, dtype=np.int64), stream.epoch_at(end)
    first = int(positions[0])
    span = stream.samples(first, max(end, int(positions[-1]) + 1))  # one read of the stream's order
    if int(positions[-1]) - first >= len(span):
        raise StateError(f"the saved state names positions beyond the end of worker stream {worker} of dataset {leaf}")
    samples = span[positions - first]
    return samples, stream.epoch_at(end)


def _balanced(total: int, parts: int) -> List[int]:
    """Cut points of ``total`` items into ``parts`` contiguous runs differing by at most one."""
    base, extra = divmod(total, parts)
    cuts = [0]
    for g in range(parts):
        cuts.append(cuts[-1] + base + (1 if g < extra else 0))
    return cuts
