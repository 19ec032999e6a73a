"""``EnergonDataset``: what ``get_train_dataset`` / ``get_val_dataset`` return.

It holds the validated dataset, the worker config, the task encoder and the plan parameters; it
plans segments and builds Ray Datasets from them, but runs nothing until a loader iterates it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from energon_ray.blend.base import Composition, PassContext
from energon_ray.cache.aux import check_primary_index
from energon_ray.cache.cooking import AuxConfig
from energon_ray.format.dataset import PreparedDataset
from energon_ray.pipeline.chained import chains_outputs, counts_outputs, groups_segments
from energon_ray.pipeline.load import SampleLoader
from energon_ray.pipeline.policy import deferred_handler
from energon_ray.pipeline.shipping import Shipped
from energon_ray.pipeline.stages import StageConfig
from energon_ray.plan.layout import choose_layout, task_targets
from energon_ray.plan.options import PlanOptions
from energon_ray.plan.sharder import compute_subset, worker_ranges, worker_streams
from energon_ray.plan.stream import SegmentLayout, SegmentPlan, WorkerStream
from energon_ray.source.reader import ReadSegment, shard_table
from energon_ray.storage import as_path
from energon_ray.errors import DatasetConfigError
from energon_ray.task_encoder.base import TaskEncoder, is_overridden, matching_cooker
from energon_ray.worker import WorkerConfig


class EnergonDataset(Composition):
    """A planned, not yet running, Energon dataset on Ray.

    Use it with ``get_loader`` (or ``get_savable_loader``): the loader runs its segments on Ray.
    """

    #: a JSONL dataset's ``json`` is parsed (``False``: bytes, a ``CrudeJsonlDatasetFactory``'s)
    parse_json: bool = True

    def __init__(
        self,
        dataset: PreparedDataset,
        *,
        worker_config: WorkerConfig,
        task_encoder: TaskEncoder,
        options: PlanOptions,
        decoder: Any,
        subflavors: Optional[Dict[str, Any]] = None,
        rotation_offset: int = 0,
        rotation_base: Optional[int] = None,
        aux: Optional[Dict[str, Any]] = None,
    ):
        self.dataset = dataset
        #: the metadataset's ``aux:`` stores (name → FileStore) and the loader's cache pool
        self.aux = dict(aux or {})
        self.cache_pool: Any = None
        self.worker_config = worker_config
        self.task_encoder = task_encoder
        self.options = options
        self.decoder = decoder
        self.subflavors = {**dataset.spec.subflavors, **(subflavors or {})}
        self.rotation_offset = rotation_offset
        #: samples of the datasets before this one in its metadataset (its rotation for any worker count)
        self.rotation_base = rotation_offset if rotation_base is None else rotation_base
        self._check_hooks()
        self._excluded = tuple(int(i) for i in dataset.excluded_indices()) if dataset.sample_excludes else ()
        self._ranges = self._worker_ranges()
        self._stages: Optional[StageConfig] = None
        self._operator_name = "EnergonSegments"
        #: the segment layout of a restored state, where it differs from the one this version plans
        #: (``savable.adopt_layouts``): kept on this dataset, so the restored pass goes on as the saved
        #: one would have and the states saved from it record that layout again
        self.restored_layout: Optional[SegmentLayout] = None
        #: a restored state saved before packs were pooled (``savable.adopt_pack_batching``): its
        #: segments batched their own packs, so this dataset's do too
        self.segment_pack_batches = False
        #: each segment packs its own samples, its packing buffers restarting there (a restored state
        #: saved before packing buffers ran across segments: ``savable.adopt_pack_batching``)
        self.segment_packs = False
        #: each segment batches its own samples, the trainer's pool what is left at its end (a
        #: restored state saved before batches ran across segments, ``executor="ray_data"``, or
        #: tasks that may not wait: ``savable.adopt_pack_batching``, ``Loader``)
        self.segment_batches = False
        #: the batches the trainer's pool makes across a validation metadataset's datasets count
        #: their index as batches made (Energon's, also after skipped samples); ``False`` for a
        #: restored state saved before, which counted it by position (``savable.adopt_pack_batching``)
        self.pool_batches_counted = True
        #: a chained packed stream's packing hooks read Energon's indices (``StageConfig.pack_counts``);
        #: ``False`` for a restored state saved before, whose hooks read positions (``savable.adopt_pack_batching``)
        self.pack_hooks_counted = True
        #: each segment of an unbatched generator ``encode_sample`` stream encodes on its own, its hooks
        #: reading positions (a restored state saved before such streams were chained: ``savable.adopt_pack_batching``)
        self.segment_unbatched = False
        #: a sample hook that reads indices skipped samples shift chains its stream
        #: (``chained.reads_shifted_indices``); ``False`` for a restored state saved before, whose
        #: segments encoded side by side, the hooks reading positions (``savable.adopt_pack_batching``)
        self.sample_hooks_counted = True
        #: the loader runs the segments as plain Ray tasks (``executor="tasks"``), several short ones
        #: to a task where ``chained.groups_segments`` allows (``task_samples``)
        self.segments_as_tasks = True
        #: the loader's composition has other leaves (``run_as_tasks``)
        self.among_several = False

    def _check_hooks(self) -> None:
        te, spec = self.task_encoder, self.dataset.spec
        if spec.is_crude and not te.cookers and not is_overridden(te, "cook_crude_sample"):
            raise DatasetConfigError(
                f"{spec.file}: a crude dataset (CrudeWebdataset) needs a task encoder with `cookers` or an "
                f"overridden cook_crude_sample; {type(te).__name__} has neither"
            )
        cooker = matching_cooker(te.cookers, self.subflavors) if spec.is_crude and te.cookers else None
        if spec.is_crude and te.cookers and cooker is None:
            # Energon refuses it when the dataset is built; cooking each sample would fail them all
            raise DatasetConfigError(
                f"{spec.file}: no cooker of {type(te).__name__} matches the crude dataset's subflavors "
                f"{self.subflavors!r} (the cookers' has_subflavors: {[c.has_subflavors for c in te.cookers]!r})"
            )
        if cooker is not None and cooker.need_primary and self.dataset.format == "tar":
            check_primary_index(as_path(self.dataset.root, self.dataset.storage))
        if self.options.packing_buffer_size and not (
            is_overridden(te, "select_samples_to_pack") and is_overridden(te, "pack_selected_samples")
        ):
            raise ValueError(
                f"packing_buffer_size={self.options.packing_buffer_size} needs {type(te).__name__} to override "
                "select_samples_to_pack and pack_selected_samples"
            )

    # -- planning ---------------------------------------------------------------------------
    def _worker_ranges(self, wc: Optional[WorkerConfig] = None) -> List[tuple]:
        rotation = self.rotation_offset
        if wc is None:
            wc = self.worker_config
        else:
            rotation = self.rotation_base % (max(1, wc.num_workers) * wc.world_size)
        try:
            start, end = compute_subset(self.dataset.total, self.options.subset_absolute, self.options.subset_ratio)
        except ValueError as exc:  # a range past the dataset's end (or a reversed one of a YAML leaf)
            raise DatasetConfigError(f"{self.dataset.root} (split part {self.dataset.split_part!r}): {exc}") from None
        return worker_ranges(
            start, end, rank=wc.rank, world_size=wc.world_size, num_workers=wc.num_workers, rotation_offset=rotation,
        )  # fmt: skip

    @property
    def segment_length(self) -> int:
        """Positions per segment (one Ray task) after each worker's first ones: whole batches, or whole
        packing buffers."""
        return self.segment_layout.length

    @property
    def segment_layout(self) -> SegmentLayout:
        """Where segments start: short first segments, then ``segment_length`` ones; one length
        when the user chose it or the dataset packs; a restored state's own (``restored_layout``)."""
        if self.restored_layout is not None:
            return self.restored_layout
        from energon_ray.blend.packed_blend import PACK_CHUNK_BUFFERS

        options = self.options
        grouped = self.segments_as_tasks and groups_segments(self.stage_config(), self.segment_batches, self.among_several)
        return choose_layout(options.segment_samples, options.batch_size, options.packing_buffer_size,
                             bool(options.blend_samples), PACK_CHUNK_BUFFERS, max(1, self.worker_config.num_workers), grouped)  # fmt: skip

    @property
    def task_samples(self) -> Optional[Tuple[int, int]]:
        """Samples a task of this leaf's segments aims for, ``(first, later)`` (``TaskStream`` runs
        several short segments to a task: ``plan.layout.task_targets``); ``None``: one segment a task
        (a length the user chose, packing, a restored state's long segments, ``executor="ray_data"``)."""
        layout = self.segment_layout
        if not self.segments_as_tasks or self.options.segment_samples is not None or self.options.packing_buffer_size:
            return None
        targets = task_targets(max(1, self.worker_config.num_workers))
        return targets if layout.length < targets[1] else None

    def run_as_tasks(self, value: bool, several: bool = False) -> None:
        """``True``: the loader runs the segments as plain Ray tasks (short segments, several to a
        task where they may be: ``chained.groups_segments``); ``False``: as Ray Data's read tasks
        (``executor="ray_data"``). ``several``: the loader's composition has other leaves."""
        self.segments_as_tasks = value
        self.among_several = several

    @property
    def excluded(self) -> Tuple[int, ...]:
        """Global indices of the split part's excluded samples (the plan leaves them out)."""
        return self._excluded

    def _set_form(self, name: str, value: bool) -> None:
        """Set one of the forms above (how a restored state's loader made its stages); the stage
        config is made again where it changed."""
        if getattr(self, name) != value:
            setattr(self, name, value)
            self._stages = None

    def batch_packs_in_segments(self, value: bool) -> None:
        """``True``: each segment batches its own packs (a restored state saved before packs were
        pooled, ``savable.adopt_pack_batching``); ``False``: the trainer's pool batches them."""
        self._set_form("segment_pack_batches", value)

    def pack_in_segments(self, value: bool) -> None:
        """``True``: each segment packs its own samples, buffers restarting at its start (a restored
        state saved before packs were chained); ``False``: packing buffers run across segments."""
        self._set_form("segment_packs", value)

    def batch_in_segments(self, value: bool) -> None:
        """``True``: each segment batches its own samples (see ``segment_batches``); ``False``: a
        worker stream's batches run across its segments (``chained.chains_outputs``)."""
        self._set_form("segment_batches", value)

    def chain_unbatched(self, value: bool) -> None:
        """``True``: an unbatched generator ``encode_sample``'s worker stream is chained (its hooks
        count Energon's outputs given); ``False``: each segment encodes on its own (``segment_unbatched``)."""
        self._set_form("segment_unbatched", not value)

    def count_sample_hooks(self, value: bool) -> None:
        """``True``: a sample hook reading indices that skipped samples shift chains its stream;
        ``False``: it reads positions (a restored state saved before)."""
        self._set_form("sample_hooks_counted", value)

    def count_pack_hooks(self, value: bool) -> None:
        """``True``: a chained packed stream's packing hooks read Energon's indices; ``False``: their
        first sample's position (a restored state saved before they were counted)."""
        self._set_form("pack_hooks_counted", value)

    @property
    def groups_batches(self) -> bool:
        """Whether every batch is made from the trainer's pools, numbered by the batches the worker
        stream made before it: the task encoder buckets samples with ``batch_group_criterion``, or
        the segments pack (``StageConfig.pool_packs``)."""
        return is_overridden(self.task_encoder, "batch_group_criterion") or self.stage_config().pool_packs

    def streams(
        self, first_epoch: int = 0, worker_config: Optional[WorkerConfig] = None, prefixes: Optional[Sequence[Any]] = None
    ) -> List[WorkerStream]:
        """One ``WorkerStream`` per local worker; ``first_epoch`` shifts the shuffles (``repeat=False`` passes).

        ``worker_config``: another rank/world size/worker count than the loader's (a saved state's);
        ``prefixes``: per local worker, samples that come before its epochs (``loader.elastic``).
        """
        wc = self.worker_config if worker_config is None else worker_config
        ranges = self._ranges if worker_config is None else self._worker_ranges(worker_config)
        return worker_streams(self.options, wc, ranges, [int(x) for x in self.dataset.shard_starts], self._excluded,
                              first_epoch, prefixes)  # fmt: skip

    def plan(self, first_epoch: int = 0, source: int = 0, prefixes: Optional[Sequence[Any]] = None) -> SegmentPlan:
        """The segment plan of this rank (``source``: this dataset's index in a composition)."""
        return SegmentPlan(self.streams(first_epoch, prefixes=prefixes), self.segment_layout, source=source)

    # -- composition ------------------------------------------------------------------------
    def leaves(self) -> List["EnergonDataset"]:
        return [self]

    def repeats_forever(self) -> bool:
        """Whether this source is asked to repeat without end (``repeat=True`` of a training
        dataset or a ``RepeatDataset(repeats=None)`` copy, no ``blend_epochized`` repetitions),
        whether or not this rank holds samples of it."""
        o = self.options
        return o.repeat and o.repetitions is None

    def has_rank_samples(self) -> bool:
        """Whether any local worker of this rank reads a sample of this source."""
        return any(b > a for a, b in self._ranges)

    def is_endless(self) -> bool:
        return self.options.training and self.repeats_forever() and self.has_rank_samples()

    def provider(self, ctx: PassContext, pass_index: int):
        return ctx.feeds[id(self)].next_item

    def leaf_shares(self) -> Dict[int, tuple]:
        return {id(self): (1.0, 0.0)}

    def caps(self) -> Optional[List[int]]:
        return self.worker_caps()

    def virtual_epoch_length(self) -> int:
        return self.options.virtual_epoch_length

    @property
    def operator_name(self) -> str:
        """Name of this source's operator in Ray's progress and stats."""
        return self._operator_name

    @operator_name.setter
    def operator_name(self, value: str) -> None:
        self._operator_name = value

    # -- stages -------------------------------------------------------------------------------
    def stage_config(self) -> StageConfig:
        if self._stages is None:
            loader = SampleLoader(self.dataset.spec, self.decoder, self.subflavors, parse_json=self.parse_json)
            packing = None if self.options.blend_samples else self.options.packing_buffer_size
            across = self.options.batch_across_sources or self.options.blend_samples
            postencode = not (self.options.blend_samples and self.options.packing_buffer_size)
            chained = chains_outputs(
                self.task_encoder, self.options.batch_size, bool(packing), across,
                chain_packs=not (self.segment_packs or self.segment_pack_batches), chain_batches=not self.segment_batches,
                chain_unbatched=not self.segment_unbatched, sample_hooks=self.sample_hooks_counted,
            )
            self._stages = StageConfig(
                task_encoder=Shipped(self.task_encoder, "task encoder"),
                loader=Shipped(loader, "sample loader"),
                batch_size=self.options.batch_size,
                # a user's handler runs in the loader's process, with the failures the tasks report
                error_handler=deferred_handler(self.worker_config.global_error_handler),
                # a sample blend packs the drawn samples itself (``SampleBlendDataset``)
                packing_buffer_size=packing,
                batch_across_sources=across,
                pool_packs=bool(packing) and self.options.batch_size is not None and not self.segment_pack_batches,
                aux=AuxConfig(
                    self.aux, as_path(self.dataset.root, self.dataset.storage), self.decoder, self.cache_pool,
                    primary_jsonl=self.dataset.format == "jsonl",
                ),
                postencode=postencode,
                num_workers=max(1, self.worker_config.num_workers),
                chained=chained,
                counts_outputs=chained and not packing and counts_outputs(self.task_encoder, self.sample_hooks_counted),
                drop_last=self.options.drop_last,
                index_offsets=self.options.batch_index_offsets,
                pack_counts=self.pack_hooks_counted,
            )
        return self._stages

    def set_cache_pool(self, pool: Any) -> None:
        """The pool cookers and encoders get as ``cache`` (``get_loader(cache_pool=…)``)."""
        self.cache_pool = pool
        self._stages = None

    def reader(self) -> ReadSegment:
        return ReadSegment(
            shard_table(self.dataset),
            self.dataset.spec.wants_part if (self.dataset.spec.parts is not None or self.dataset.spec.part_filter) else None,
            tolerance=self.task_encoder.__default_failure_tolerance__,
        )

    # -- sizes ---------------------------------------------------------------------------------
    def worker_lengths(self) -> List[int]:
        """Samples per local worker and pass, as Energon counts them for ``len()`` and for
        ``blend_epochized`` weights: the worker's samples after excludes, times the repetitions.
        ``shuffle_over_epochs`` only changes the order (a stream's epoch then spans that many passes
        over the samples), so it is not counted."""
        out = []
        for s in self.streams():
            if s.prefix is not None:  # another world size's rest first (loader.elastic)
                out.append(s.epoch_length if s.length is None else s.length)
                continue
            passes = s.config.shuffle_over_epochs if s.config.training else 1
            base = s.epoch_length // passes if passes and passes > 1 else s.epoch_length
            reps = s.config.repetitions
            out.append(base if reps is None else int(base * reps))
        return out

    def worker_batches(self) -> List[int]:
        """Items (batches, or samples without batching) per local worker and epoch."""
        size = self.options.batch_size
        out = []
        for n in self.worker_lengths():
            if size is None:
                out.append(n)
            else:
                out.append(n // size if self.options.drop_last else -(-n // size))
        return out

    @property
    def workers_slice_offsets(self) -> List[List[int]]:
        """Per local worker of this rank, the bounds of its slices (global sample indices of the split
        part; consecutive pairs are the slices it reads). A worker with no samples has one offset."""
        return [list(s.config.offsets) for s in self.streams()]

    def worker_caps(self) -> Optional[List[int]]:
        """Per-worker item limits from ``limit`` (split like Energon: the first ones get the remainder)."""
        limit = self.options.limit
        if limit is None:
            return None
        workers = len(self._ranges)
        return [limit // workers + (1 if w < limit % workers else 0) for w in range(workers)]

    def __len__(self) -> int:
        """Batches per rank and epoch (``virtual_epoch_length`` or ``limit`` if set)."""
        if self.options.virtual_epoch_length:
            return self.options.virtual_epoch_length
        batches = self.worker_batches()
        caps = self.worker_caps()
        if caps is not None:
            batches = [min(b, c) for b, c in zip(batches, caps)]
        return sum(batches)

    def config(self) -> Dict[str, Any]:
        """A JSON-able description of what decides the batches."""
        return {
            "type": "EnergonDataset",
            "path": self.dataset.root,
            "split_part": self.dataset.split_part,
            "worker_config": {  # what of it decides the batches
                "rank": self.worker_config.rank, "world_size": self.worker_config.world_size,
                "num_workers": self.worker_config.num_workers, "seed_offset": self.worker_config.seed_offset,
            },
            "options": dataclasses.asdict(self.options),
            "task_encoder": type(self.task_encoder).__qualname__,
            "decoder": None if self.decoder is None else self.decoder.config(),
            "subflavors": self.subflavors,
        }

    def __repr__(self) -> str:
        kind = "train" if self.options.training else "val"
        return (
            f"EnergonDataset({self.dataset.describe()}, {kind}, batch_size={self.options.batch_size}, "
            f"workers={len(self._ranges)}, rank={self.worker_config.rank}/{self.worker_config.world_size})"
        )
