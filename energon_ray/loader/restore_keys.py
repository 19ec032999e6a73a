"""``restore_sample``: a batch (or sample) made again from its ``__restore_key__`` alone.

The key is read here (the batch's index, which output of generator batch hooks, packs or samples,
and the datasets and worker stream they name), checked against the loader, and handed to the
matching ``loader.rebuild`` function, which makes it again by position with the hook seeds it had;
the loader's wrappers are then applied again (``loader.remake``).
"""

from __future__ import annotations

from numbers import Integral
from typing import Any, List, Optional, Tuple

from energon_ray.blend.base import Composition
from energon_ray.loader.remake import remade, remakers
from energon_ray.loader.rebuild import (
    rebuild_batch, rebuild_blended_batch, rebuild_blended_packs, rebuild_chained_batch, rebuild_concat_batch,
    rebuild_concat_packed_batch, rebuild_packed_batch, split_batch_index, split_counts, split_output,
)  # fmt: skip
from energon_ray.loader.state import StateError
from energon_ray.pipeline.batch_counts import MADE
from energon_ray.pipeline.batcher import BATCH, BATCHED
from energon_ray.pipeline.packing import PACK_MADE, PACKED


def sample_keys(restore_key: Any) -> List[tuple]:
    """The samples' restore keys inside a batch's ``__restore_key__`` (nested tuples or lists)."""
    if isinstance(restore_key, (tuple, list)) and restore_key and restore_key[0] == "Webdataset":
        if len(restore_key) not in (6, 7, 8, 9):
            raise StateError(
                f"restore key {tuple(restore_key)!r} has no plan position (an Energon key, or one made by another "
                "energon_ray version); energon_ray keys are ('Webdataset', index, dataset, worker, position, seed), "
                "plus (sub, output index) for the outputs of a generator encode_sample (unbatched: and the outputs given "
                "before its sample), (sub) where its stream is not chained"
            )
        return [tuple(restore_key)]
    if not isinstance(restore_key, (tuple, list)):
        raise StateError(f"not a restore key: {restore_key!r}")
    out: List[tuple] = []
    at = 0
    while at < len(restore_key):  # batches' keys inside (or one after another in) a mix of batches:
        marker = _batch_marker(restore_key, at)  # their samples' keys
        if marker:
            at += marker
            continue
        out.extend(sample_keys(restore_key[at]))
        at += 1
    return out


def _batch_marker(parts: Any, at: int) -> int:
    """How many parts from ``at`` are a batch's index (``BATCH``, index), outputs (``BATCHED``, i,
    j) or counts (``MADE``, outputs, batches) and name no sample (0: none)."""
    size = {BATCH: 2, BATCHED: 3, MADE: 3}.get(parts[at]) if isinstance(parts[at], str) else None
    if size is None or len(parts) < at + size:
        return 0
    return size if all(isinstance(v, Integral) and not isinstance(v, bool) for v in parts[at + 1 : at + size]) else 0


def pack_keys(restore_key: Any) -> Optional[List[Tuple[int, int, List[tuple], Optional[Tuple[int, ...]]]]]:
    """``(position, sub, member keys, made)`` of each pack a packed batch's (or pack's) restore key
    names (``("Packed", position, sub[, (PACK_MADE, pack call, packs before, *postencode calls)],
    *members)``, see ``pipeline.packing``; ``made``: those counts, ``None`` in a key without them,
    whose hooks read positions); None for unpacked keys."""
    if isinstance(restore_key, (tuple, list)) and restore_key and restore_key[0] == PACKED:
        members, made = list(restore_key[3:]), None
        if members and isinstance(members[0], (tuple, list)) and members[0] and members[0][0] == PACK_MADE:
            made, members = tuple(int(v) for v in members[0][1:]), members[1:]
        if not members:
            raise StateError(f"restore key {tuple(restore_key)!r} of a pack names no member")
        return [(int(restore_key[1]), int(restore_key[2]), sample_keys(members), made)]
    if isinstance(restore_key, (tuple, list)) and any(isinstance(p, (tuple, list)) for p in restore_key):
        found = [pack_keys(part) for part in restore_key if isinstance(part, (tuple, list))]
        if any(f is not None for f in found):
            if any(f is None for f in found):
                raise StateError("restore key mixes packs and unpacked samples")
            return [pack for f in found for pack in f]
    return None


def restore_sample(dataset: Composition, restore_key: Any, remote_args: Optional[dict] = None) -> Any:
    """The batch (or sample) whose ``__restore_key__`` this is, made again exactly.

    A batch's key holds its index in its worker stream (``("Batch", index, *key)``; older keys do not:
    then it is its first sample's position over the batch size). A key that names one of several
    batches a generator ``batch``/``encode_batch`` made of the same samples (``("Batched", i, j,
    *keys)`` after the index) gets that output; other batches' keys are their samples'. Where the
    batch hooks read other counts than the group's index, the samples' keys follow ``("Made",
    outputs of batch, batches given)``, the stream's before the group, counted on from there again
    (keys without them, also older ones, are made again with every call reading the index).

    Raises:
        StateError: an unusable key, samples of several datasets (outside a train metadataset's
            sample blend or a validation metadataset's concatenation) or worker streams, or a wrapper
            above the dataset that cannot be applied again (``loader.remake``).
    """
    batch_index, restore_key = split_batch_index(restore_key)
    output, restore_key = split_output(restore_key)
    counts, restore_key = split_counts(restore_key)
    packs = pack_keys(restore_key)
    if packs is not None:
        return _rebuild_packed(dataset, packs, remote_args, output, batch_index)
    keys = sample_keys(restore_key)
    if not keys:
        raise StateError(f"restore key {restore_key!r} names no sample")
    leaves = dataset.leaves()
    _check_keys(leaves, keys)
    named = {k[2] for k in keys}
    fns = remakers(dataset, leaves[min(named)])  # before any work: a wrapper it cannot apply again
    if any(leaves[source].options.blend_samples for source in named):
        return remade(fns, _rebuild_blended(dataset, leaves, keys, remote_args, output, batch_index))
    if len(named) > 1 and all(leaves[source].options.batch_across_sources for source in named):  # a val concatenation
        _one_worker(keys)
        return remade(fns, rebuild_concat_batch({source: leaves[source] for source in sorted(named)}, keys, remote_args, output, batch_index))
    source, worker, seed = _one_origin(keys, "a batch")
    leaf = leaves[source]
    if leaf.options.packing_buffer_size:
        raise StateError(f"restore key {restore_key!r} names samples, not packs, of {leaf!r}, which packs samples")
    # (an unbatched output's key from before such streams were chained has 7 fields: made again as made)
    if leaf.stage_config().counts_outputs and (leaf.options.batch_size is not None or any(len(k) == 9 for k in keys)):
        return remade(fns, rebuild_chained_batch(leaf, source, worker, seed, keys, remote_args, output, counts))
    return remade(fns, rebuild_batch(leaf, source, worker, seed, keys, remote_args, output, batch_index, counts))


def _check_keys(leaves: List[Any], keys: List[tuple]) -> None:
    """Each sample key names a dataset, worker stream and sample this loader has (a key of another
    loader's would otherwise fail deep inside a Ray task, reading past a shard table)."""
    for key in keys:
        _, index, source, worker, position = key[:5]
        if not isinstance(source, Integral) or not 0 <= source < len(leaves):
            raise StateError(f"restore key {key!r} names dataset {source!r}; this loader has {len(leaves)} (0 to {len(leaves) - 1})")
        leaf = leaves[source]
        total = getattr(leaf.dataset, "total", None)
        if not isinstance(index, Integral) or index < 0 or (total is not None and index >= total):
            raise StateError(
                f"restore key {key!r} names sample {index!r} of {leaf!r}, which has {total} samples: a key of another "
                "dataset or split"
            )
        if not isinstance(worker, Integral) or worker < 0 or not isinstance(position, Integral) or position < 0:
            raise StateError(f"restore key {key!r} names worker stream {worker!r}, position {position!r}: not a plan position")


def _one_worker(keys: List[tuple]) -> None:
    workers = {k[3] for k in keys}
    if len(workers) != 1:
        raise StateError(f"restore_sample rebuilds a batch of one worker stream; this key holds samples of workers {sorted(workers)}")


def _one_origin(keys: List[tuple], what: str) -> Tuple[int, int, int]:
    """The one (dataset, worker, hook seed) the samples' keys share."""
    origins = {(k[2], k[3], k[5]) for k in keys}
    if len(origins) != 1:
        raise StateError(
            f"restore_sample rebuilds {what} of one dataset's worker stream; this key holds samples of "
            f"(dataset, worker, seed) {sorted(origins)}"
        )
    return origins.pop()


def _rebuild_packed(
    dataset: Composition, packs: List[Tuple[int, int, List[tuple], Optional[Tuple[int, ...]]]], remote_args: Optional[dict], output=None, batch_index=None
) -> Any:  # fmt: skip
    keys = [k for _, _, members, _ in packs for k in members]
    leaves = dataset.leaves()
    _check_keys(leaves, keys)
    fns = remakers(dataset, leaves[min(k[2] for k in keys)])
    if any(leaves[k[2]].options.blend_samples for k in keys):  # before their origins: packs that mix datasets
        _one_worker(keys)
        blend, mine, sources = _holding_blend(dataset, leaves, keys)
        return remade(fns, rebuild_blended_packs(blend, mine, sources, packs, remote_args, output, batch_index))
    named = sorted({k[2] for k in keys})
    if len(named) > 1 and all(leaves[source].options.batch_across_sources for source in named):
        _one_worker(keys)
        return remade(fns, rebuild_concat_packed_batch({source: leaves[source] for source in named}, packs, remote_args, output, batch_index))
    source, worker, seed = _one_origin(keys, "packed batches")
    leaf = leaves[source]
    if not leaf.options.packing_buffer_size:
        raise StateError(f"restore key names packs, but {leaf!r} does not pack samples")
    return remade(fns, rebuild_packed_batch(leaf, source, worker, seed, packs, remote_args, output, batch_index))


def _rebuild_blended(
    dataset: Composition, leaves: List[Any], keys: List[tuple], remote_args: Optional[dict], output=None, batch_index=None
) -> Any:  # fmt: skip
    """A batch of a train metadataset's sample blend (samples of several datasets, one worker)."""
    _one_worker(keys)
    _, mine, sources = _holding_blend(dataset, leaves, keys)
    return rebuild_blended_batch(mine, sources, keys, remote_args, output, batch_index)


def _holding_blend(dataset: Composition, leaves: List[Any], keys: List[tuple]) -> Tuple[Any, List[Any], List[int]]:
    """The sample blend (or concatenation) of ``dataset`` that holds the datasets ``keys`` name: it,
    its leaves and their indices among ``leaves``."""
    from energon_ray.blend.sample_blend import SampleBlendDataset

    blends, stack = [], [dataset]
    while stack:  # the sample blend holding these datasets
        node = stack.pop()
        if isinstance(node, SampleBlendDataset):
            blends.append(node)
        stack.extend(c for c in [*getattr(node, "datasets", ()), getattr(node, "dataset", None)] if isinstance(c, Composition))
    named = {id(leaves[k[2]]) for k in keys}
    for blend in blends:
        mine = blend.leaves()
        if named <= {id(leaf) for leaf in mine}:
            index = {id(leaf): i for i, leaf in enumerate(leaves)}
            return blend, mine, [index[id(leaf)] for leaf in mine]
    raise StateError(f"restore key names datasets {sorted({k[2] for k in keys})}, which no sample blend of this loader holds together")
