"""A metadataset's leaves opened as datasets, each with its options, and combined: blended by
weight (training; samples drawn then batched, ``blend.sample_blend``, or whole batches) or
concatenated (validation), as Energon's ``get_train_dataset``/``get_val_dataset`` combine them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, List, Optional, Tuple

from energon_ray.blend.base import Composition
from energon_ray.blend.compose import PooledBlendDataset
from energon_ray.blend.concat import ConcatDataset
from energon_ray.blend.epoch_map import EpochizeDataset
from energon_ray.blend.metadataset import Flattened, LeafSpec, start_context
from energon_ray.blend.metadataset import parse as parse_metadataset
from energon_ray.blend.metadataset import parse_file as parse_metadataset_file
from energon_ray.blend.sample_blend import SampleBlendDataset
from energon_ray.blend.sample_concat import SampleConcatDataset
from energon_ray.cache.aux import aux_stores
from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.dataset_yaml import check_field_map_parts
from energon_ray.format.tar_index import read_tar_index
from energon_ray.loader.dataset import EnergonDataset, PlanOptions
from energon_ray.task_encoder.base import TaskEncoder, is_overridden


def metadataset_composition(path: Any, split_part: str, options: PlanOptions, common: dict, trusted: bool,
                 subflavors: Optional[dict] = None) -> Composition:
    """Leaves of a metadataset as EnergonDatasets, blended (train) or concatenated (val).

    ``path`` may be already flattened (``get_val_datasets`` builds one leaf at a time); the caller's
    ``subflavors`` override every level's, as in Energon."""
    ctx = start_context(split_part, subflavors)
    if isinstance(path, Flattened):
        flat = path
    elif isinstance(path, dict):
        flat = parse_metadataset(path, "<metadataset dict>", Path.cwd(), split_part, ctx=ctx)
    else:
        flat = parse_metadataset_file(path, split_part, ctx=ctx)
    blend_samples = _blends_samples(path, flat, options, common["task_encoder"])
    return _combine(flat, _leaves(flat, options, common, trusted, blend_samples), options, blend_samples)


def _blends_samples(path: Any, flat: Flattened, options: PlanOptions, te: TaskEncoder) -> bool:
    """Whether the leaves hand out samples that the blend draws and batches (``blend.sample_blend``).

    Energon blends a train metadataset's samples and then batches them, and so do we by default:
    the leaves hand out samples, Ray tasks batch the drawn groups (blend.sample_blend); packing then
    runs on the blended samples too (blend.packed_blend), also unbatched. ``blend_samples=False`` draws whole
    per-dataset batches by weight instead (faster to start, see benchmarks/bench_sample_blend.py).
    Grouping runs in the leaves' Ray tasks, before any blending, so a task encoder with
    batch_group_criterion gets whole per-dataset (grouped) batches unless it asks for
    blend_samples=True, which is refused (mixed batches would silently be something else than asked
    for)."""
    grouped = is_overridden(te, "batch_group_criterion")
    if _packs_across(flat, options):
        return True
    # unbatched, only packing needs the blended samples (Energon packs them); plain samples are drawn
    # by weight from the leaves as they are (``PooledBlendDataset``), which is the same
    packs_or_batches = options.batch_size is not None or bool(options.packing_buffer_size)
    blendable = options.training and len(flat.leaves) > 1 and packs_or_batches
    if options.blend_samples and blendable and grouped:
        raise ValueError(
            f"{path}: blend_samples=True cannot be combined with {type(te).__name__}.batch_group_criterion: grouping "
            "runs in each dataset's Ray tasks, before blending (blend_samples=False gives whole per-dataset batches)"
        )
    return blendable and (not grouped if options.blend_samples is None else options.blend_samples)


def _packs_across(flat: Flattened, options: PlanOptions) -> bool:
    """A validation metadataset of several datasets, packed (batched or not): Energon packs the one
    stream each worker reads through all of them (a packing buffer runs from one dataset into the
    next), so the leaves hand out their samples to ``SampleConcatDataset``, which packs them in that
    order (and batches the packs, or hands them out one by one)."""
    return not options.training and len(flat.leaves) > 1 and bool(options.packing_buffer_size)


def _open_leaf(leaf: LeafSpec, trusted: bool) -> Tuple[PreparedDataset, Optional[list]]:
    """A flattened leaf's prepared dataset (a join's primary) and a join's members (else ``None``);
    errors name where the leaf is in the YAML."""
    try:
        if leaf.join is not None:
            from energon_ray.loader.joined import open_join_members

            members = open_join_members(leaf.join, trusted)
            return members[0], members
        prepared = PreparedDataset.open(
            leaf.path, leaf.split_part, split_config=leaf.split_config, dataset_config=leaf.dataset_config, trusted=trusted,
        )
        check_parts(prepared)
        _check_aux(leaf, prepared)
        return prepared, None
    except DatasetConfigError as exc:
        raise DatasetConfigError(f"{leaf.where}: {exc}") from None


def _check_aux(leaf: LeafSpec, prepared: PreparedDataset) -> None:
    """Only cookers read ``aux:`` stores: on a dataset that is not crude they would be ignored, so
    they are refused, as Energon refuses them."""
    if leaf.aux and not prepared.spec.is_crude:
        raise DatasetConfigError(
            f"aux {sorted(leaf.aux)}: only a crude dataset's cookers read aux data, and {leaf.path} holds "
            f"{prepared.spec.sample_type.__name__} samples (make it a CrudeWebdataset, or drop aux)"
        )


def _leaves(flat: Flattened, options: PlanOptions, common: dict, trusted: bool, blend_samples: bool) -> List[EnergonDataset]:
    """One dataset per flattened leaf, with the leaf's options; each rotated by the samples before it
    (Energon's offset of a leaf's worker assignment)."""
    wc = common["worker_config"]
    global_workers = max(1, wc.num_workers) * wc.world_size
    leaves: List[EnergonDataset] = []
    offset = 0
    for leaf in flat.leaves:
        prepared, members = _open_leaf(leaf, trusted)
        leaf_options = dataclasses.replace(
            options,
            subset_ratio=leaf.ratio,
            subset_absolute=leaf.absolute,
            shuffle_over_epochs=_multiply(options.shuffle_over_epochs, leaf.shuffle_over_epochs),
            repetitions=leaf.repetitions if options.training else None,
            virtual_epoch_length=0,
            limit=None,
            # validation batches run across the end of one dataset into the next, as in Energon
            batch_across_sources=not options.training and len(flat.leaves) > 1 and options.batch_size is not None,
            blend_samples=blend_samples,
        )
        if members is not None:
            from energon_ray.loader.joined import joined_dataset

            leaves.append(joined_dataset(leaf.join, members, leaf_options, common, trusted, offset, global_workers))
            offset += prepared.total  # Energon's len() of a join: the primary's samples
            continue
        aux = aux_stores(leaf.aux, leaf.where, filesystem=leaf.filesystem_aux)  # its errors name leaf.where already
        try:
            leaves.append(
                EnergonDataset(prepared, options=leaf_options, subflavors=leaf.subflavors, rotation_offset=offset % global_workers,
                              rotation_base=offset, aux=aux, **common)
            )
        except ValueError as exc:
            raise DatasetConfigError(f"{leaf.where}: {exc}") from None
        offset += prepared.total
    return leaves


def _combine(flat: Flattened, leaves: List[EnergonDataset], options: PlanOptions, blend_samples: bool) -> Composition:
    """The leaves as one composition: a single leaf as it is, concatenated (validation) or blended by
    weight (training), epochized if asked."""
    if len(leaves) == 1:
        only = leaves[0]
        only.options.virtual_epoch_length, only.options.limit = options.virtual_epoch_length, options.limit
        return only
    if not options.training:
        # one stream per worker through all datasets (batched or not): the hooks' sample and batch
        # indices count on over them, as over Energon's concatenation
        before = [0] * len(leaves[0].worker_lengths())
        for ds in leaves:
            ds.options.batch_index_offsets = tuple(before)
            before = [a + b for a, b in zip(before, ds.worker_lengths())]
        if blend_samples:
            return SampleConcatDataset(*leaves, batch_size=options.batch_size, packing_buffer_size=options.packing_buffer_size,
                                       drop_last=options.drop_last, limit=options.limit)  # fmt: skip
        return ConcatDataset(*leaves, limit=options.limit)
    if flat.mode == "blend_epochized":
        # Energon weighs by length × repetitions; the exact counts come from each stream's end anyway
        weights = [max(1, sum(ds.worker_lengths())) for ds in leaves]
    else:
        weights = [spec.weight for spec in flat.leaves]
    # Energon blends the leaves' samples and batches them per worker: len() counts those batches
    if blend_samples:
        # packing, if asked for, runs on the blended samples (as Energon's): blend.packed_blend
        blend: Composition = SampleBlendDataset(*zip(leaves, weights), batch_size=options.batch_size, drop_last=options.drop_last,
                                                packing_buffer_size=options.packing_buffer_size)  # fmt: skip
    else:
        blend = PooledBlendDataset(*zip(leaves, weights), batch_size=options.batch_size, drop_last=options.drop_last)
    if options.virtual_epoch_length:
        blend = EpochizeDataset(blend, options.virtual_epoch_length)
    return blend


def _multiply(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None or b is None:
        return None
    if a == -1 or b == -1:
        return -1
    return a * b


def check_parts(prepared: PreparedDataset) -> None:
    """The field_map's parts exist in the first sample of (up to) three shards."""
    if prepared.format != "tar":
        return
    firsts = [(s.path, int(read_tar_index(s.path)[0])) for s in prepared.shards if s.count][:3]
    check_field_map_parts(prepared.spec, firsts)
