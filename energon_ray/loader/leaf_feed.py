"""``LeafFeed``: one leaf dataset's items per logical worker in a pass, filled from the rows the
pass's shared ``MultiFeed`` (``loader.feed``) reads; the batches that straddle segments (seams) are
made by a Ray task and resolved when the trainer reaches them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Tuple

from energon_ray.loader.group_items import seam_items
from energon_ray.loader.merge import EXHAUSTED, NOTHING, Pending, WorkerQueues
from energon_ray.loader.stats import LoaderStats
from energon_ray.pipeline.chained import chain_unit

if TYPE_CHECKING:
    from energon_ray.loader.feed import MultiFeed


class LeafFeed:
    """One leaf dataset's items per logical worker, filled by the shared ``MultiFeed``."""

    def __init__(self, multi: "MultiFeed", dataset, plan, pin: bool, stats: LoaderStats, source: int = 0):
        self.multi = multi
        self.dataset = dataset
        self.plan = plan
        self.pin = pin
        self.source = source
        self._seams = None
        config = dataset.stage_config()
        self.queues = WorkerQueues(
            len(plan.streams), dataset.options.batch_size, self._seam_batches, drop_last=dataset.options.drop_last,
            stats=stats, leaf=source, hand_out=dataset.options.blend_samples, chained=config.chained,
            index_offsets=dataset.options.batch_index_offsets, grouped=dataset.groups_batches,
            count_batches=dataset.pool_batches_counted,
            chain_unit=chain_unit(config) if config.chained and config.packing_buffer_size else None,
        )  # fmt: skip
        for w in range(len(plan.streams)):
            if plan.num_segments(w) == 0:
                self.queues.close_worker(w)

    def next_item(self, worker: int) -> Any:
        """Worker ``worker``'s next item, or ``EXHAUSTED``; pulls rows from Ray as needed. With
        pinning, handing out a worker stream's last queued item asks for a block read ahead
        (``MultiFeed.pull_ahead``), tried at each next call (after the trainer has started its
        step) until a block was read; with a single worker stream, handing out its last but one
        (the next call takes its last: the block after it is then read a step before it is needed,
        not at the step that needs it)."""
        queues, multi = self.queues, self.multi
        if multi.ahead_wanted:
            multi.pull_ahead()
        while True:
            item = queues.pop(worker)
            if item is not NOTHING:
                if multi.pinner is not None and not queues.hand_out and not queues.done[worker]:
                    left = len(queues.queues[worker])
                    if left == 0:
                        multi.ahead_wanted += 1
                    elif left == 1 and queues.num_workers == 1:
                        multi.ahead_wanted = max(multi.ahead_wanted, 1)
                return item
            if queues.done[worker]:
                return EXHAUSTED
            multi.pull()

    def close_open_workers(self) -> None:
        for w in range(self.queues.num_workers):
            if not self.queues.done[w]:
                self.queues.close_worker(w)

    def _seam_batches(self, worker: int, groups: List[Tuple[int, List[Tuple[int, int, Any]]]]) -> List[Any]:
        """Pooled samples (still serialized) → one Ray task batches the groups; resolved when reached."""
        if self._seams is None:
            from energon_ray.pipeline.seam_tasks import SeamTasks

            self._seams = SeamTasks(self.dataset.stage_config(), self.source, self.multi.ray_remote_args,
                                    before_first=self.multi.before_first_batch)  # fmt: skip
        wait = self._seams.submit(worker, self.plan.streams[worker].config.hook_seed, groups)

        def resolve() -> List[Any]:
            items, pending.positions, pending.reports = seam_items(wait, self.multi.pinner, self.queues.stats, self.queues.chain)
            return items

        pending = Pending(resolve)
        return [pending]
