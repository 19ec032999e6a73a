"""A packed validation metadataset: ``SampleConcatDataset``.

Energon concatenates a validation metadataset's datasets and then encodes, packs and batches the
one stream each worker reads, so a packing buffer (like a batch) runs from the end of one dataset
into the next. Here the leaves hand out their encoded samples (as a sample blend's do), each
worker takes all of its first dataset's, then all of the next one's, and the packing and batching
of ``blend.packed_blend`` run over that stream: the packs and batches are Energon's. Unbatched
(``batch_size=None``), the packs are handed out one by one, as Energon's are.

Loaders before 2026-11-28 (before 2026-11-29 unbatched) built a ``ConcatDataset`` of leaves that
packed their own samples (buffers restarting at each dataset); a state they saved restores so
(``pack_per_dataset``, set by ``loader.savable.adopt_val_packing``), and the states saved after it
record that.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from energon_ray.blend.base import Composition, ListNode, PassContext, Provider
from energon_ray.blend.concat import ConcatDataset, one_after_another
from energon_ray.blend.lengths import worker_samples
from energon_ray.blend.sample_blend import SampleBlendDataset


class SampleConcatDataset(SampleBlendDataset):
    """Leaves one after another per worker stream, packed and batched as one stream (validation).

    Args:
        *datasets: leaves built with ``blend_samples=True``, in order.
        batch_size: packs per batch (``None``: the packs one by one, unbatched).
        packing_buffer_size: samples per packing buffer.
        drop_last: drop each worker's last short batch.
        limit: at most this many batches per rank and pass.
    """

    counts_packing_hooks = True

    def __init__(self, *datasets: Composition, batch_size: Optional[int], packing_buffer_size: int, drop_last: bool = False,
                 limit: Optional[int] = None):  # fmt: skip
        super().__init__(*((ds, 1.0) for ds in datasets), batch_size=batch_size, drop_last=drop_last,
                         packing_buffer_size=packing_buffer_size)  # fmt: skip
        self.limit = limit

    def packing_form(self) -> "SampleConcatDataset":
        """Always this dataset: loaders before 2026-11-28 (before 2026-11-29 unbatched) packed each
        dataset's samples on its own (``pack_per_dataset``)."""
        return self

    def alone(self, leaves: List[Composition]) -> Composition:
        """Before 2026-11-28's composition: a ``ConcatDataset`` of leaves that pack their own samples."""
        return ConcatDataset(*leaves, limit=self.limit)

    def alone_provider(self, ctx: PassContext, pass_index: int) -> Provider:
        return ConcatDataset.provider(self, ctx, pass_index)  # type: ignore[arg-type]

    def draw_provider(self, ctx: PassContext, pass_index: int) -> Provider:
        """Each worker's samples of the first leaf, then of the next: no randomness."""
        subs = [ds.provider(ctx, pass_index) for ds in self.datasets]
        current = [0] * self.num_workers
        ctx.register(ListNode(current))

        return one_after_another(subs, current)

    def leaf_shares(self) -> Dict[int, Tuple[float, float]]:
        # a step takes about batch_size samples (one, unbatched), all of one leaf; a leaf starts after
        # the steps before it
        out, before, per_step = {}, 0.0, self.batch_size or 1
        for ds in self.datasets:
            for leaf, (share, offset) in ds.leaf_shares().items():
                out[leaf] = (share * per_step, offset + before)
            before += sum(worker_samples(ds)) / self.num_workers / per_step
        return out

    def schedule_hints(self, pass_index: int, items_per_step: int = 1):
        return {}

    def caps(self) -> Optional[List[int]]:
        if self.limit is None:
            return None
        workers = self.num_workers
        return [self.limit // workers + (1 if w < self.limit % workers else 0) for w in range(workers)]

    def worker_items(self) -> List[int]:
        items = super().worker_items()
        caps = self.caps()
        return items if caps is None else [min(i, c) for i, c in zip(items, caps)]

    def __repr__(self) -> str:
        return "SampleConcatDataset(" + ", ".join(repr(ds) for ds in self.datasets) + ")"
