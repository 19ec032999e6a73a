"""One batch (or sample) made again for ``restore_sample`` from its samples' (or packs') keys: each
sample re-read and encoded at its plan position with the hook seed it had (``loader.restore``'s
``run_reads``), then batched, packed or chained again as the loader made it, as the batch index the
key holds; and the reading of the key's batch index and output (``split_batch_index``, ``split_output``).
"""

from __future__ import annotations

import dataclasses
from numbers import Integral
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from energon_ray.errors import unwrap_error
from energon_ray.loader.restore import run_reads
from energon_ray.loader.state import StateError
from energon_ray.pipeline import rows, serde
from energon_ray.pipeline.batch_counts import MADE
from energon_ray.pipeline.batcher import BATCH, BATCHED
from energon_ray.pipeline.packing import restore_key_of
from energon_ray.plan.stream import SegmentSpec


def rebuild_batch(
    leaf: Any, source: int, worker: int, seed: int, keys: List[tuple], remote_args=None, output: Optional[Tuple[int, int]] = None,
    batch_index: Optional[int] = None, counts: Optional[Tuple[int, int]] = None,
) -> Any:  # fmt: skip
    """One batch made again from its samples' restore keys ``("Webdataset", index, leaf, worker,
    position, hook seed)``: the samples are re-read and encoded at their positions and batched by
    the seam-batch task, with the hook seeds they had (``output``: which of generator batch hooks'
    outputs, see ``split_output``; ``batch_index``: the one its key holds, see ``split_batch_index``;
    ``counts``: the stream's batch counts before it, see ``split_counts``)."""
    spec = _reread_spec(leaf, source, worker, seed, keys, index=-1)
    config = leaf.stage_config()
    found = run_reads([spec], {source: leaf.reader()}, {source: config}, remote_args, {source: leaf})
    group = [(int(k[4]), output_sub(k), found[(source, worker, int(k[4]), output_sub(k))]) for k in _in_stream_order(keys)]
    size = leaf.options.batch_size
    if size is None:
        return serde.loads(group[0][2])
    if batch_index is None:  # a key from before batch keys held it: by its first sample (a short last
        # batch too; a validation metadataset's stream counts on over the datasets before this one)
        batch_index = (config.index_offset(worker) + group[0][0]) // size
    return _batch_once(config, source, worker, seed, group, remote_args, batch_index, output, counts)


def rebuild_chained_batch(
    leaf: Any, source: int, worker: int, seed: int, keys: List[tuple], remote_args=None, output: Optional[Tuple[int, int]] = None,
    counts: Optional[Tuple[int, int]] = None,
) -> Any:  # fmt: skip
    """A batch of a chained stream (a generator ``encode_sample``) made again from its outputs' keys
    ``("Webdataset", index, leaf, worker, position, hook seed, sub, output index)`` (unbatched: the
    output itself, its key adding the outputs given before its sample): each sample
    re-read and encoded with the outputs its stream had before it, the named outputs batched
    (``counts``: the stream's batch counts before them, see ``split_counts``)."""
    from energon_ray.pipeline.build import rebuild_chained

    fields = 9 if leaf.options.batch_size is None else 8  # unbatched: also the outputs given before the sample
    if any(len(k) != fields for k in keys):
        raise StateError(
            f"restore_sample: {leaf!r} has a generator encode_sample; its {'outputs' if fields == 9 else 'batches'}' keys "
            f"name which output of a sample each holds ({fields} fields), this one does not"
        )
    spec = _reread_spec(leaf, source, worker, seed, list({k[4]: k for k in keys}.values()), index=-1)
    try:
        outputs = [(int(k[4]), *(int(v) for v in k[6:])) for k in keys]
        made = rebuild_chained(spec, leaf.reader(), leaf.stage_config(), outputs, remote_args, counts)
    except Exception as exc:
        ours = unwrap_error(exc)
        raise StateError(f"restore_sample: {ours if ours is not None else exc}") from None
    return one_made(made, output, f"{len(keys)} samples")


def rebuild_packed_batch(
    leaf: Any, source: int, worker: int, seed: int, packs: List[Tuple[int, int, List[tuple], Optional[Tuple[int, ...]]]], remote_args=None,
    output: Optional[Tuple[int, int]] = None, batch_index: Optional[int] = None,
) -> Any:  # fmt: skip
    """A packed batch made again from its packs' restore keys ``("Packed", position, sub, *members)``:
    the members re-read and encoded at their positions (not packed, not post-encoded), then each
    pack made again from its members (``postencode_sample``, ``pack_selected_samples``) and the packs
    batched, all with the hook seeds they had. ``packs``: ``(position, sub, member keys, made)`` (``restore_keys.pack_keys``)."""
    table = _repacked(leaf, source, worker, seed, packs, leaf.options.batch_size, remote_args, batch_index)
    items = [serde.loads(payload) for kind, _, _, _, payload in rows.iter_rows(table) if kind == rows.ITEM]
    return one_made(items, output, f"{len(packs)} pack(s)")


def _repacked(leaf: Any, source: int, worker: int, seed: int, packs: List[Tuple[int, int, List[tuple], Optional[Tuple[int, ...]]]], batch_size: Optional[int],
              remote_args=None, batch_index: Optional[int] = None) -> Any:  # fmt: skip
    """The table of the packs made again from their members (batched by ``batch_size`` as batch
    ``batch_index``, else by the first pack's position; ``None``: the packs)."""
    from energon_ray.pipeline.build import repack

    members = [k for _, _, keys, _ in packs for k in keys]
    spec = _reread_spec(leaf, source, worker, seed, members, index=-1)
    config = dataclasses.replace(leaf.stage_config(), packing_buffer_size=None, postencode=False)
    found = run_reads([spec], {source: leaf.reader()}, {source: config}, remote_args, {source: leaf})
    groups = [
        (position, sub, [(int(k[4]), output_sub(k), found[(source, worker, int(k[4]), output_sub(k))]) for k in keys], made)
        for position, sub, keys, made in packs
    ]
    return repack(leaf.stage_config(), source, worker, seed, groups, batch_size, remote_args, batch_index)


def rebuild_concat_packed_batch(
    leaves: Dict[int, Any], packs: List[Tuple[int, int, List[tuple], Optional[Tuple[int, ...]]]], remote_args=None, output: Optional[Tuple[int, int]] = None,
    batch_index: Optional[int] = None,
) -> Any:  # fmt: skip
    """A validation metadataset's batch of packs of several datasets (each pack of one), made again:
    each dataset's packs from their members, then all batched in the batch's order as the loader
    batched them (see ``rebuild_concat_batch``). ``packs``: ``(position, sub, member keys, made)`` (``restore_keys.pack_keys``)."""
    worker = packs[0][2][0][3]
    made: Dict[Tuple[int, int, int], Any] = {}
    for source, leaf in leaves.items():
        mine = [pack for pack in packs if pack[2][0][2] == source]
        table = _repacked(leaf, source, worker, mine[0][2][0][5], mine, None, remote_args)
        payloads = [payload for kind, _, _, _, payload in rows.iter_rows(table) if kind == rows.ITEM]
        made.update({(source, position, sub): payload for (position, sub, *_), payload in zip(mine, payloads)})
    first, last = packs[0], packs[-1]
    group = [(position, sub, made[(keys[0][2], position, sub)]) for position, sub, keys, _ in packs]
    size = leaves[last[2][0][2]].options.batch_size
    if batch_index is None:  # a key from before batch keys held it
        batch_index = (leaves[first[2][0][2]].stage_config().index_offset(worker) + first[0]) // size
    last_leaf = leaves[last[2][0][2]]
    return _batch_once(last_leaf.stage_config(), last[2][0][2], worker, last[2][0][5], group, remote_args, batch_index, output)


def rebuild_blended_batch(
    blend_leaves: List[Any], sources: List[int], keys: List[tuple], remote_args=None, output: Optional[Tuple[int, int]] = None,
    batch_index: Optional[int] = None,
) -> Any:  # fmt: skip
    """A sample blend's batch made again (``blend.sample_blend``): each sample re-read at its own
    leaf's position with its own hook seed, then all batched in the batch's order with the seed
    and the task encoder the blend's batching used (its first leaf's, for the pass the keys name).

    ``blend_leaves``: the blend's leaves; ``sources``: their indices among the loader's leaves.
    """
    by_source = dict(zip(sources, blend_leaves))
    worker = keys[0][3]
    group = _reread_each({source: by_source[source] for source in sorted({k[2] for k in keys})}, keys, remote_args)
    first, first_source = blend_leaves[0], sources[0]
    seed = _pass_seed(first.plan().streams[worker].config, by_source[keys[0][2]].plan().streams[worker].config, keys[0][5])
    return _batch_once(first.stage_config(), first_source, worker, seed, group, remote_args, batch_index, output)


def rebuild_blended_packs(
    blend: Any, blend_leaves: List[Any], sources: List[int], packs: List[Tuple[int, int, List[tuple], Optional[Tuple[int, ...]]]],
    remote_args=None, output: Optional[Tuple[int, int]] = None, batch_index: Optional[int] = None,
) -> Any:  # fmt: skip
    """A packed sample blend's (or packed validation metadataset's) batch of packs, or unbatched
    pack, made again (``blend.packed_blend``): each member re-read at its own leaf's position with its
    own hook seed (encoded, not post-encoded, as its leaf hands it out), then the packs made again
    from them and batched with the seed, task encoder and index offsets the blend's packing and
    batching tasks used (its first leaf's, for the pass the keys name). ``packs``: ``(position, sub,
    member keys, made)`` (``restore_keys.pack_keys``)."""
    by_source = dict(zip(sources, blend_leaves))
    members = [k for _, _, keys, _ in packs for k in keys]
    worker = members[0][3]
    found = iter(_reread_each({source: by_source[source] for source in sorted({k[2] for k in members})}, members, remote_args))
    offsets = {source: _index_offset(leaf, worker) for source, leaf in by_source.items()}
    groups = [
        (position, sub, [(*next(found), offsets[k[2]]) for k in keys], made) for position, sub, keys, made in packs
    ]  # fmt: skip
    first, first_source = blend_leaves[0], sources[0]
    seed = _pass_seed(first.plan().streams[worker].config, by_source[members[0][2]].plan().streams[worker].config, members[0][5])
    from energon_ray.pipeline.build import repack

    table = repack(first.stage_config(), first_source, worker, seed, groups, blend.batch_size, remote_args, batch_index)
    items = [serde.loads(payload) for kind, _, _, _, payload in rows.iter_rows(table) if kind == rows.ITEM]
    return one_made(items, output, f"{len(packs)} pack(s)")


def _index_offset(leaf: Any, worker: int) -> int:
    """The samples of ``worker``'s stream before ``leaf``'s (a validation metadataset's datasets
    count on), which a packed blend's packing hooks add to a member's position (``seam_packs``)."""
    offsets = leaf.options.batch_index_offsets
    return int(offsets[worker]) if offsets is not None else 0


def output_sub(key: tuple) -> int:
    """Which output of its sample a key names: ``sub`` of a generator ``encode_sample``'s output in a
    stream that is not chained (``("Webdataset", index, leaf, worker, position, seed, sub)``), else 0."""
    return int(key[6]) if len(key) == 7 else 0


def _in_stream_order(keys: List[tuple]) -> List[tuple]:
    """The keys by (position, sub), each once: the order a batch of one worker stream holds them."""
    return sorted({(int(k[4]), output_sub(k)): k for k in keys}.values(), key=lambda k: (int(k[4]), output_sub(k)))


def rebuild_concat_batch(
    leaves: Dict[int, Any], keys: List[tuple], remote_args=None, output: Optional[Tuple[int, int]] = None, batch_index: Optional[int] = None,
) -> Any:  # fmt: skip
    """A validation metadataset's batch that runs from one dataset into the next, made again: each
    sample re-read at its own dataset's position with its own hook seed, then batched in the batch's
    order as the loader batched it: by the dataset of its last sample (it took the remainder of the
    ones before), at the index its first sample has in the concatenated worker stream.

    ``leaves``: the datasets the keys name, by source index; ``keys``: the samples, in batch order.
    """
    worker = keys[0][3]
    group = _reread_each(leaves, keys, remote_args)
    first, last = keys[0], keys[-1]
    size = leaves[last[2]].options.batch_size
    if batch_index is None:  # a key from before batch keys held it
        batch_index = (leaves[first[2]].stage_config().index_offset(worker) + int(first[4])) // size
    return _batch_once(leaves[last[2]].stage_config(), last[2], worker, last[5], group, remote_args, batch_index, output)


def _reread_each(leaves: Dict[int, Any], keys: List[tuple], remote_args) -> List[Tuple[int, int, Any]]:
    """The samples ``keys`` name (of one worker stream, of the ``leaves`` by source index), each
    re-read at its own leaf's position with its own hook seed, as ``(position, sub, payload)`` in
    the keys' order."""
    worker = keys[0][3]
    specs, readers, configs = [], {}, {}
    for source, leaf in leaves.items():
        mine = [k for k in keys if k[2] == source]
        specs.append(_reread_spec(leaf, source, worker, mine[0][5], mine, index=-1 - len(specs)))
        readers[source], configs[source] = leaf.reader(), leaf.stage_config()
    found = run_reads(specs, readers, configs, remote_args, leaves)
    return [(int(k[4]), output_sub(k), found[(k[2], worker, int(k[4]), output_sub(k))]) for k in keys]


def _reread_spec(leaf: Any, source: int, worker: int, seed: int, keys: List[tuple], index: int) -> SegmentSpec:
    """A restore segment that re-reads the samples the keys name (of one leaf and worker), by
    position, each once, keeping the outputs the keys name."""
    ordered = sorted({int(k[4]): int(k[1]) for k in keys}.items())
    positions = np.array([p for p, _ in ordered], dtype=np.int64)
    stream = leaf.plan().streams[worker].config
    return SegmentSpec(
        worker=worker, global_worker=stream.global_worker, seed=seed, index=index, start=int(positions[0]),
        samples=np.array([i for _, i in ordered], dtype=np.int64), last=False, source=source, positions=positions,
        keep=tuple((int(k[4]), output_sub(k)) for k in _in_stream_order(keys)),
    )  # fmt: skip


def _batch_once(
    config: Any, source: int, worker: int, seed: int, group: List[Tuple[int, int, Any]], remote_args, index: Optional[int] = None,
    output: Optional[Tuple[int, int]] = None, counts: Optional[Tuple[int, int]] = None,
) -> Any:  # fmt: skip
    """The batch the seam-batch task makes of ``group`` (``index``: its batch index in the stream;
    ``output``: which of generator batch hooks' outputs, else the only one; ``counts``: the stream's
    batch counts before it, counted on as the loader did)."""
    from energon_ray.pipeline.seam_tasks import SeamTasks

    table = SeamTasks(config, source, remote_args).submit(worker, seed, [(len(group), group, index, counts)])()
    items = [serde.loads(payload) for kind, _, _, _, payload in rows.iter_rows(table) if kind == rows.ITEM]
    return one_made(items, output, f"the {len(group)} samples")


def split_batch_index(restore_key: Any) -> Tuple[Optional[int], Any]:
    """A batch key ``(BATCH, batch index, *key)`` (see ``pipeline.batcher``): ``(index, key)``;
    any other key (a sample's, a pack's, or a batch's from before batch keys held their index):
    ``(None, key)``.

    Raises:
        StateError: a ``BATCH`` key without a batch index or samples.
    """
    if not (isinstance(restore_key, (tuple, list)) and restore_key and restore_key[0] == BATCH):
        return None, restore_key
    index = restore_key[1] if len(restore_key) > 1 else None
    if len(restore_key) < 3 or not isinstance(index, Integral) or isinstance(index, bool) or index < 0:
        raise StateError(f"restore key {tuple(restore_key)!r} is not a batch's ({BATCH!r}, batch index, *the samples' keys)")
    return int(index), list(restore_key[2:])


def split_counts(restore_key: Any) -> Tuple[Optional[Tuple[int, int]], Any]:
    """A batch key's rest after its index (and output) that starts with the stream's batch counts
    before the batch's group (``(MADE, outputs of batch, batches given, *key)``, see ``pipeline.batcher``):
    ``((outputs, batches), key)``; any other (a key from before they were counted, or whose hook calls
    all read the group's index): ``(None, key)``.

    Raises:
        StateError: a ``MADE`` key without two counts and a key after them.
    """
    if not (isinstance(restore_key, (tuple, list)) and restore_key and restore_key[0] == MADE):
        return None, restore_key
    counts = list(restore_key[1:3])
    if len(restore_key) < 4 or not all(isinstance(v, Integral) and not isinstance(v, bool) and v >= 0 for v in counts):
        raise StateError(
            f"restore key {tuple(restore_key)!r} is not a counted batch's ({MADE!r}, outputs of batch, batches given, *key)"
        )
    return (int(counts[0]), int(counts[1])), list(restore_key[3:])


def split_output(restore_key: Any) -> Tuple[Optional[Tuple[int, int]], Any]:
    """A batch key naming output ``j`` of ``encode_batch`` on output ``i`` of a generator ``batch``
    (``(BATCHED, i, j, *keys)``, see ``pipeline.batcher``): ``((i, j), keys)``; any other key:
    ``(None, key)``.

    Raises:
        StateError: a ``BATCHED`` key without output indices or samples.
    """
    if not (isinstance(restore_key, (tuple, list)) and restore_key and restore_key[0] == BATCHED):
        return None, restore_key
    i, j = (list(restore_key[1:3]) + [None, None])[:2]
    if len(restore_key) < 4 or not all(isinstance(v, Integral) and not isinstance(v, bool) and v >= 0 for v in (i, j)):
        raise StateError(
            f"restore key {tuple(restore_key)!r} is not a generator batch's ({BATCHED!r}, batch output, "
            "encode_batch output, *the samples' keys)"
        )
    return (int(i), int(j)), list(restore_key[3:])


def one_made(items: List[Any], output: Optional[Tuple[int, int]], source: str) -> Any:
    """Of the batches the batch hooks made again from ``source`` (words), the one a key names: the
    only one, or (``output``) the one whose key names that output."""
    if output is None:
        if len(items) != 1:
            raise StateError(f"restore_sample: the batch hooks made {len(items)} batches from {source}, not one")
        return items[0]
    for item in items:
        _, key = split_batch_index(restore_key_of(item))
        if isinstance(key, (tuple, list)) and len(key) > 3 and key[0] == BATCHED and tuple(key[1:3]) == output:
            return item
    raise StateError(
        f"restore_sample: the batch hooks made {len(items)} batches from {source}, none of them their output "
        f"{output} (the data or the task encoder changed since?)"
    )


def _pass_seed(first: Any, keyed: Any, key_seed: int, passes: int = 4096) -> int:
    """The first leaf's hook seed in the pass whose hook seed the keyed leaf's stream had."""
    for epoch in range(passes):
        if dataclasses.replace(keyed, first_epoch=epoch).hook_seed == key_seed:
            return dataclasses.replace(first, first_epoch=epoch).hook_seed
    raise StateError(f"restore_sample: hook seed {key_seed} is no pass's of worker stream {keyed.worker} (another seed or dataset?)")
