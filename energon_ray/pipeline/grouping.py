"""Grouped batching: ``batch_group_criterion(sample) -> (bucket key, bucket size)``.

A segment (Ray task) only keys its samples: which samples share a batch depends on the buckets that
earlier segments of the worker's stream left half full. The trainer pools the keyed samples, still
serialized, per worker and bucket in stream order, exactly as Energon's buckets fill, and a Ray task
batches each bucket as it fills (and every bucket at the stream's end, unless ``batch_drop_last``).
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, List, Optional, Tuple

from energon_ray.errors import FatalSampleError
from energon_ray.pipeline.policy import HookRunner, StageRun, item_key
from energon_ray.task_encoder.base import TaskEncoder
from energon_ray.task_encoder.decorators import get_failure_tolerance

Item = Tuple[int, int, Any]
Leftover = Tuple[Hashable, int, List[Item]]


def bucket_size(key: Hashable, size: Optional[int], batch_size: Optional[int], what: str) -> int:
    """The batch size of a bucket; exactly one of the criterion's size and ``batch_size`` is set.

    Raises:
        FatalSampleError: if both or neither are set, or the size is not a positive int.
    """
    if size is not None and batch_size is not None:
        raise FatalSampleError(
            f"{what}: batch_group_criterion returned batch size {size} for bucket {key!r}, but get_*_dataset("
            f"batch_size={batch_size}) is set too; return None as the size, or pass batch_size=None"
        )
    chosen = size if size is not None else batch_size
    if not isinstance(chosen, int) or isinstance(chosen, bool) or chosen <= 0:
        raise FatalSampleError(
            f"{what}: bucket {key!r} has no valid batch size (criterion gave {size!r}, batch_size={batch_size!r})"
        )
    return chosen


class Grouper:
    """Keys a segment's encoded samples by bucket (the batches themselves are cut across segments)."""

    def __init__(self, te: TaskEncoder, batch_size: Optional[int], handler: Any):
        fn = te.batch_group_criterion
        self.criterion = HookRunner("batch_group_criterion", fn, get_failure_tolerance(fn, te.__default_failure_tolerance__), handler)
        self.batch_size = batch_size

    def new_run(self) -> StageRun:
        return self.criterion.new_run()

    def __call__(self, encoded: List[Item], run: StageRun) -> List[Leftover]:
        """``(bucket key, bucket batch size, [item])`` per sample, in stream order (failed or
        ignored criterion calls drop their sample)."""
        sizes: Dict[Hashable, int] = {}
        keyed: List[Leftover] = []
        for entry in encoded:
            sample = entry[2]
            key = item_key(sample)
            what = f"sample {'?' if key is None else key!r}"
            result = self.criterion.call(run, sample, what, at=entry[0])
            if result is HookRunner.FAILED or result is HookRunner.IGNORED:
                continue
            if not (isinstance(result, tuple) and len(result) == 2):
                raise FatalSampleError(f"{what}: batch_group_criterion must return (key, batch_size or None), got {result!r}")
            key, size = result
            try:
                hash(key)
            except TypeError:
                raise FatalSampleError(
                    f"{what}: batch_group_criterion returned bucket key {key!r} ({type(key).__name__}), which is "
                    "not hashable; return a hashable key (a tuple, not a list)"
                ) from None
            if key not in sizes:
                sizes[key] = bucket_size(key, size, self.batch_size, what)
            keyed.append((key, sizes[key], [entry]))
        return keyed
