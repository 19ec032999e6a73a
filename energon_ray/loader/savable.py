"""One pass of a loader as saveable parts: leaf streams, composition nodes, the round-robin.

``PassRun.save()`` collects each part's small state; ``PassRun.restore()`` re-reads the samples the
saved pools held (one small Ray execution, only if any), then puts every part back. The
``MultiFeed`` of a restored pass starts each worker stream at its checkpoint's segment, so nothing
before it is read or decoded again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional, Tuple

from energon_ray.blend.base import Composition, PassContext
from energon_ray.loader.config_summary import differences, explain, summarize
from energon_ray.loader.feed import MultiFeed
from energon_ray.loader.round_robin import RoundRobin
from energon_ray.loader.restore import restore_streams
from energon_ray.loader.state import STATE_VERSION, LoaderState, StateError, fingerprint
from energon_ray.plan.stream import SegmentLayout

logger = logging.getLogger("energon_ray")


class PassRun:
    """The live parts of the pass a loader is iterating."""

    def __init__(self, pass_index: int, multi: MultiFeed, ctx: PassContext, round_robin: RoundRobin):
        self.pass_index = pass_index
        self.multi = multi
        self.ctx = ctx
        self.round_robin = round_robin

    def save(self, state: LoaderState) -> LoaderState:
        workers = self.round_robin.num_workers
        nodes = [[node.save(w) for w in range(workers)] for node in self.ctx.nodes]
        streams = [[feed.queues.state(w) for w in range(workers)] for feed in self.multi.feeds]
        for node in self.ctx.nodes:  # children first: an outer map's override wins
            overrides = getattr(node, "overrides", None)
            if overrides is None:
                continue
            for w in range(workers):
                before = overrides(w)
                if before is None:
                    continue
                for i, value in before["nodes"].items():
                    nodes[i][w] = value
                for leaf, value in before["streams"].items():
                    streams[leaf][w] = value
        return dataclasses.replace(
            state, pass_index=self.pass_index, round_robin=self.round_robin.state(), nodes=nodes, streams=streams
        )

    def restore(self, state: LoaderState) -> None:
        feeds = self.multi.feeds
        if len(state.streams) != len(feeds) or len(state.nodes) != len(self.ctx.nodes):
            raise StateError(
                f"the state has {len(state.streams)} datasets and {len(state.nodes)} composition steps, this loader "
                f"{len(feeds)} and {len(self.ctx.nodes)}"
            )
        restore_streams(feeds, state.streams, self.multi.reread)
        for node, per_worker in zip(self.ctx.nodes, state.nodes):
            for w, value in enumerate(per_worker):
                node.restore(w, value)
        if state.round_robin is not None:
            self.round_robin.restore(state.round_robin)


def starts_of(state: Optional[LoaderState]) -> Optional[List[List[int]]]:
    """First segment of each leaf's worker streams in a restored pass."""
    if state is None or state.pass_index is None or not state.streams:
        return None
    return [[stream.checkpoint.segment for stream in per_worker] for per_worker in state.streams]


def describe(dataset: Composition, order_only: bool = False, encoders: bool = False, layout: bool = True,
             joins: bool = True) -> Any:
    """What decides a composition's batches, without machine-specific paths (for the fingerprint).

    ``order_only``: what decides which samples come in which order, whatever the batch sizes and
    worker counts (a state may move to another world size with the same global batch size).
    ``encoders``: with each leaf's task encoder class, as states saved before 2026-11-25
    fingerprinted it (a state names the samples consumed, so it restores under another task encoder,
    as Energon's does; ``check_fits`` warns then).
    ``layout``: with each leaf's samples per shard and excluded samples (a state's positions name
    other samples when they change); states saved before 2026-12-02 were fingerprinted without.
    ``joins``: with a joined leaf's digest of its join table (its rows change with an exclude or a
    key in any joined dataset, their count may not); states saved before the digest was recorded
    (after 2026-12-02's layouts) were fingerprinted without.
    """
    if getattr(dataset, "per_dataset", False):  # a SampleConcatDataset restored from a state saved before it
        dataset = dataset.described()
    options = getattr(dataset, "options", None)
    if options is not None:  # a leaf dataset
        fields = dataclasses.asdict(options)
        if not options.batch_across_sources:  # an unbatched validation metadataset's: fingerprinted as before it had them
            fields["batch_index_offsets"] = None
        if order_only:
            fields.pop("batch_size", None)
        out = {
            "dataset": [dataset.dataset.split_part, dataset.dataset.total, [s.name for s in dataset.dataset.shards]],
            "options": fields,
            "subflavors": dataset.subflavors,
            "rotation": dataset.rotation_base if order_only else dataset.rotation_offset,
        }
        if layout:
            out.update(sample_layout(dataset, joins))
        if encoders:
            out["task_encoder"] = encoder_name(dataset)
        return out
    out: Dict[str, Any] = {"type": type(dataset).__name__}
    for name in ("weights", "batch_size", "length", "limit", "salt", "repeats", "size", "buffer_size", "fixed_batch_size", "drop_last"):
        if hasattr(dataset, name) and not (order_only and name == "batch_size"):
            out[name] = getattr(dataset, name)
    parts = getattr(dataset, "datasets", None)
    if parts is None:
        inner = getattr(dataset, "dataset", None) or getattr(dataset, "blend", None)
        parts = [] if inner is None else [inner]
    out["parts"] = [describe(part, order_only, encoders, layout, joins) for part in parts]
    return out


def sample_layout(leaf: Any, joins: bool = True) -> Dict[str, Any]:
    """What a leaf's stream positions are positions of: the samples of each shard, in split order,
    and the global indices of the excluded ones (a shard re-written with another count, or an
    exclude added, keeps the shard names and maybe the total); of a join (``joins``), its rows."""
    starts = [int(x) for x in leaf.dataset.shard_starts]
    out = {"shard_counts": [b - a for a, b in zip(starts, starts[1:])], "excluded": list(leaf.excluded)}
    digest = getattr(leaf, "joined_rows_digest", None)
    if joins and digest is not None:
        out[JOINED_ROWS] = digest()
    return out


#: the description's names that ``order_only`` leaves out or replaces (another world size changes them)
ORDER_FREE = ("batch_size", "rotation")
#: the description's names that states saved before 2026-12-02 lack (``describe(layout=False)``)
LAYOUT = ("shard_counts", "excluded")
#: the description's name of a join's rows, which older states lack (``describe(joins=False)``)
JOINED_ROWS = "joined_rows"


def what_differs(state: LoaderState, dataset: Composition, order_only: bool = False) -> str:
    """The configuration ``state`` was saved for against ``dataset``'s, as ``config_summary.explain``
    words it (``""``: nothing to name, as for a state saved before summaries); ``order_only``: only
    what changes the sample order."""
    current = summarize(describe(dataset), max_chars=None)
    ignore = (ORDER_FREE if order_only else ()) + unrecorded(state)
    return explain(differences(state.config_summary, current, ignore=ignore))


def unrecorded(state: LoaderState) -> Tuple[str, ...]:
    """The description's names a state's summary lacks because it was saved before they were
    recorded (``LAYOUT``, ``JOINED_ROWS``): not differences of that state."""
    out: Tuple[str, ...] = ()
    if not any(path.endswith(LAYOUT) for path in state.config_summary):
        out += LAYOUT
    if not any(path.endswith(JOINED_ROWS) for path in state.config_summary):
        out += (JOINED_ROWS,)
    return out


def encoder_name(leaf: Any) -> str:
    """A leaf's task encoder class, as a state records it."""
    return type(leaf.task_encoder).__qualname__


def check_seed(saved: Optional[int], dataset: Composition) -> None:
    """Raises ``StateError`` if a state was saved with another ``WorkerConfig.seed_offset`` (it
    decides every stream's order: the saved positions would name other samples)."""
    current = dataset.worker_config.seed_offset
    if saved is not None and saved != current:
        raise StateError(
            f"the state was saved with WorkerConfig seed_offset={saved}, this loader has seed_offset={current}; "
            "the seed decides the sample order, so the saved positions would name other samples: build the loader "
            "with the seed_offset it was saved with"
        )


def fingerprints(dataset: Composition, order_only: bool = False) -> Tuple[str, ...]:
    """The fingerprint a state saved now has, and those older states have: before the joins' rows were
    recorded without them, before 2026-12-02 without the leaves' sample layouts, before 2026-11-25 also
    with the task encoders' classes. A state with any of them fits; so does one saved before
    2026-11-28 for a packed validation metadataset, before 2026-11-29 for an unbatched packed one or
    train blend (``adopt_val_packing``: packing each dataset alone)."""
    other = getattr(dataset, "other_form", None)
    older = other() if other is not None else None
    return (own_fingerprints(older, order_only) if older is not None else ()) + own_fingerprints(dataset, order_only)


def own_fingerprints(dataset: Composition, order_only: bool = False) -> Tuple[str, ...]:
    """``fingerprints`` of ``dataset`` as it packs now (not those of its other form)."""
    return (
        fingerprint(describe(dataset, order_only)),
        fingerprint(describe(dataset, order_only, joins=False)),
        fingerprint(describe(dataset, order_only, layout=False)),
        fingerprint(describe(dataset, order_only, encoders=True, layout=False)),
    )


def warn_other_encoders(saved: List[str], dataset: Composition) -> None:
    """Log which leaves restore under another task encoder class than the state was saved with."""
    ours = [encoder_name(leaf) for leaf in dataset.leaves()]
    if saved and len(saved) == len(ours) and saved != ours:
        changed = ", ".join(f"leaf {i}: {a} -> {b}" for i, (a, b) in enumerate(zip(saved, ours)) if a != b)
        logger.warning(
            "energon_ray: restoring a loader state saved with other task encoders (%s): the samples come from "
            "where the saved loader stopped, encoded and batched by this loader's task encoders", changed
        )


def new_state(dataset: Composition, passes: int, epoch_items: int) -> LoaderState:
    wc = dataset.worker_config
    description = describe(dataset)
    return LoaderState(
        version=STATE_VERSION,
        rank=wc.rank,
        world_size=wc.world_size,
        num_workers=dataset.num_workers,
        fingerprint=fingerprint(description),
        passes=passes,
        epoch_items=epoch_items,
        segment_lengths=[leaf.segment_layout.to_list() for leaf in dataset.leaves()],
        order_fingerprint=fingerprint(describe(dataset, order_only=True)),
        task_encoders=[encoder_name(leaf) for leaf in dataset.leaves()],
        config_summary=summarize(description),
        seed_offset=wc.seed_offset,
        packs_pooled=not any(leaf.segment_pack_batches for leaf in dataset.leaves()),
        packs_chained=not any(leaf.segment_packs or leaf.segment_pack_batches for leaf in dataset.leaves()),
        batches_chained=not any(leaf.segment_batches for leaf in dataset.leaves()),
        pool_batches_counted=all(leaf.pool_batches_counted for leaf in dataset.leaves()),
        pack_hooks_counted=all(leaf.pack_hooks_counted for leaf in dataset.leaves()),
        unbatched_chained=not any(leaf.segment_unbatched for leaf in dataset.leaves()),
        sample_hooks_counted=all(leaf.sample_hooks_counted for leaf in dataset.leaves()),
    )


def check_fits(state: LoaderState, dataset: Composition) -> None:
    """Raises ``StateError`` naming what differs between the saved loader and this one."""
    expected = new_state(dataset, 0, 0)
    for name in ("rank", "world_size", "num_workers"):
        if getattr(state, name) != getattr(expected, name):
            raise StateError(
                f"the state was saved with {name}={getattr(state, name)}, this loader has {name}={getattr(expected, name)}; "
                "restore each rank's own state into a loader with the same WorkerConfig (rank, world_size, num_workers)"
            )
    check_seed(state.seed_offset, dataset)
    if state.fingerprint not in fingerprints(dataset):
        named = what_differs(state, dataset)
        if named:
            raise StateError(
                f"the state was saved for another dataset configuration: {named}; build the loader with the "
                "arguments it was saved with"
            )
        raise StateError(
            "the state was saved for another dataset configuration (datasets, split, options or weights "
            f"differ: fingerprint {state.fingerprint} vs {expected.fingerprint}); build the loader with the "
            "arguments it was saved with"
        )
    warn_other_encoders(state.task_encoders, dataset)


def adopt_layouts(state: LoaderState, dataset: Composition) -> None:
    """Plan the leaves with the segment layouts ``state`` was saved with where this loader's differ.

    A pass restored mid-way starts each worker stream at its checkpoint's segment *index*; a layout
    of other segment lengths (an energon_ray version that cuts segments otherwise) puts that index
    elsewhere in the stream, and the batches would silently differ from the saved loader's (and a
    dataset that packs restarts its packing at segment boundaries). States without layouts (saved
    before they were recorded) are planned as this loader plans."""
    if not state.segment_lengths:
        return
    leaves = dataset.leaves()
    if len(state.segment_lengths) != len(leaves):
        raise StateError(f"the state has segment layouts of {len(state.segment_lengths)} datasets, this loader {len(leaves)}")
    for i, (leaf, saved) in enumerate(zip(leaves, state.segment_lengths)):
        layout, planned = SegmentLayout.from_list(saved), leaf.segment_layout
        if layout != planned:
            logger.info("energon_ray: leaf %d restored with the segment layout it was saved with (%s, not %s)",
                        i, layout.to_list(), planned.to_list())  # fmt: skip
            leaf.restored_layout = layout


def adopt_pack_batching(state: LoaderState, dataset: Composition) -> None:
    """Pack and batch packs as the loader that saved ``state`` did: a state saved before packs were
    pooled (``packs_pooled`` False) counts items of segments that batched their own packs, and one
    saved before packing buffers ran across segments (``packs_chained`` False) names packs of
    segments that packed their own samples, so its packed leaves do that again (and the states
    saved from them record it); others pool and chain them. Likewise a state whose batches did not
    run across segments (``batches_chained`` False) pooled what each segment left, and one whose
    unbatched generator streams were not chained (``unbatched_chained`` False) encodes them so again,
    as does one saved before sample hooks reading shifted indices chained their streams
    (``sample_hooks_counted`` False)."""
    for leaf in dataset.leaves():
        leaf.batch_packs_in_segments(not state.packs_pooled)
        leaf.pack_in_segments(not state.packs_chained)
        leaf.batch_in_segments(not state.batches_chained)
        leaf.pool_batches_counted = state.pool_batches_counted
        leaf.count_pack_hooks(state.pack_hooks_counted)
        leaf.chain_unbatched(state.unbatched_chained)
        leaf.count_sample_hooks(state.sample_hooks_counted)


def adopt_val_packing(state: LoaderState, dataset: Composition) -> None:
    """A packed validation metadataset (an unbatched packed train blend) packs each dataset's
    samples on its own, as the loader that saved ``state`` before 2026-11-28 (2026-11-29) did (its
    packing buffers restarted at each dataset), or packs across them (``packing_form``: the
    dataset, or the one a wrapper such as ``EpochizeDataset`` holds)."""
    form = getattr(dataset, "packing_form", lambda: None)()
    if form is not None:
        alone = dataset if form.per_dataset else dataset.other_form()
        form.pack_per_dataset(state.fingerprint in own_fingerprints(alone))
