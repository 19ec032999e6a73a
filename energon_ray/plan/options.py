"""``PlanOptions``: the knobs of one dataset that decide its sample order, as
``get_train_dataset`` / ``get_val_dataset`` and a metadataset's leaves set them (no I/O, no Ray)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union


@dataclasses.dataclass
class PlanOptions:
    """The knobs that decide the sample order (all of Energon's that apply)."""

    training: bool
    repeat: bool
    batch_size: Optional[int]
    drop_last: bool = False
    shuffle_buffer_size: Optional[int] = None
    max_samples_per_sequence: Optional[int] = None
    shuffle_over_epochs: Optional[int] = 1
    parallel_shard_iters: Optional[int] = None
    virtual_epoch_length: int = 0
    limit: Optional[int] = None
    subset_absolute: Optional[tuple] = None
    subset_ratio: Optional[tuple] = None
    #: samples per segment the user asked for: one length, ``(first, later)``, or ``None``:
    #: ``plan.layout``'s defaults (``choose_layout``)
    segment_samples: Optional[Union[int, Tuple[int, int]]] = None
    #: ``blend_epochized`` repetitions of this source per pass (``None``: plain).
    repetitions: Optional[float] = None
    #: Energon's ``packing_buffer_size`` (None: no packing).
    packing_buffer_size: Optional[int] = None
    #: Batched together with the neighbouring datasets of a validation metadataset (see ConcatDataset).
    batch_across_sources: bool = False
    #: Per local worker, the samples of its stream in the datasets of a validation metadataset before
    #: this one (batched or not): the hooks' ``current_batch_index``/``current_sample_index`` count
    #: on over them, as in Energon's concatenation.
    batch_index_offsets: Optional[Tuple[int, ...]] = None
    #: A leaf of a batched (or packed) train blend of a metadataset with ``blend_samples=True``: every sample leaves
    #: its Ray task unbatched (still serialized), the blend draws samples, and Ray tasks batch them
    #: (``SampleBlendDataset``). On the factory's options: what the user asked for (``None``: blend
    #: samples wherever it can, as Energon does).
    blend_samples: Optional[bool] = False
