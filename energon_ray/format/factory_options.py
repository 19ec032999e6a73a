"""Energon's constructor arguments common to every dataset factory: kept on the factory, checked when
it is made (a bad ``training`` or ``subset`` fails there, naming the factory, not when the dataset is
planned), and turned into the ``PlanOptions`` of its ``build()``."""

from __future__ import annotations

import numbers
from typing import Any, Callable, Optional, Tuple

from energon_ray.errors import DatasetConfigError, resolve_trust
from energon_ray.worker import WorkerConfig


def set_options(factory: Any, path: Any, *, split_part: str, training: bool, worker_config: Optional[WorkerConfig],
                shuffle_over_epochs: Optional[int], parallel_shard_iters: Optional[int],
                max_samples_per_sequence: Optional[int], subset: Any, part_filter: Optional[Callable[[str], bool]],
                trust_dataset_code: Optional[bool]) -> None:  # fmt: skip
    """The attributes every factory keeps from Energon's common constructor arguments.

    Raises:
        TypeError: ``training`` is not a bool.
    """
    check_training(f"{type(factory).__name__}({path})", training)
    factory.path = path
    factory.paths = [path]
    factory.name = str(path)
    factory.split_part = split_part
    factory.training = training
    factory.worker_config = worker_config if worker_config is not None else WorkerConfig.default_worker_config()
    factory.shuffle_over_epochs = shuffle_over_epochs
    factory.parallel_shard_iters = parallel_shard_iters
    factory.max_samples_per_sequence = max_samples_per_sequence
    factory.subset = subset
    subset_ranges(factory)  # a bad subset is refused here, not when the dataset is planned
    factory.part_filter = part_filter
    factory.trusted = resolve_trust(trust_dataset_code)
    if not hasattr(factory, "subflavors"):
        factory.subflavors = {}



def check_training(owner: str, training: Any) -> None:
    """A factory's ``training`` must be a bool (``"no"`` read with ``bool()`` was a training pass).

    Raises:
        TypeError: naming ``owner`` (the factory) and the value.
    """
    if not isinstance(training, bool):
        raise TypeError(f"{owner}: training must be True or False, got {training!r}")


def plan_options(factory: Any, batch_size: Optional[int], drop_last: bool, shuffle_buffer_size: Optional[int]) -> Any:
    """The ``PlanOptions`` of a factory's ``build()``: its common arguments plus the batching ones."""
    from energon_ray.loader.dataset import PlanOptions

    absolute, ratio = subset_ranges(factory)
    return PlanOptions(
        training=factory.training, repeat=factory.training, batch_size=batch_size, drop_last=drop_last,
        shuffle_buffer_size=shuffle_buffer_size if factory.training else None,
        max_samples_per_sequence=factory.max_samples_per_sequence,
        shuffle_over_epochs=factory.shuffle_over_epochs, parallel_shard_iters=factory.parallel_shard_iters,
        subset_absolute=absolute, subset_ratio=ratio,
    )  # fmt: skip


def subset_ranges(factory: Any) -> Tuple[Optional[tuple], Optional[tuple]]:
    """``(absolute_range, range)`` of a factory's ``subset``: Energon's ``DatasetSubset`` (or any
    object with those attributes).

    Raises:
        DatasetConfigError: naming the factory and the value, if ``subset`` has neither attribute or
            a bound is not a number (``range``: ratios; ``absolute_range``: sample indices, the end
            may be None), as Energon's ``DatasetSubset`` holds them, or the bounds are reversed or out
            of range (an absolute end past the dataset's samples is refused when it is planned).
    """
    subset = factory.subset
    if subset is None:
        return None, None
    file = f"{type(factory).__name__}({', '.join(str(p) for p in getattr(factory, 'paths', ()))})"
    if not (hasattr(subset, "range") or hasattr(subset, "absolute_range")):
        raise DatasetConfigError(f"{file}: subset must be Energon's DatasetSubset (range, absolute_range), got {subset!r}")
    absolute, ratio = getattr(subset, "absolute_range", None), getattr(subset, "range", None)
    if absolute is not None and not (_pair(absolute) and _is_int(absolute[0]) and (absolute[1] is None or _is_int(absolute[1]))):
        raise DatasetConfigError(f"{file}: subset absolute_range must be (start, end or None) sample indices, got {absolute!r}")
    if ratio is not None and not (_pair(ratio) and all(isinstance(b, numbers.Real) and not isinstance(b, bool) for b in ratio)):
        raise DatasetConfigError(
            f"{file}: subset range must be (start, end) ratios from 0 to 1 (not the metadataset YAML's 'N%'), got {ratio!r}"
        )
    if absolute is not None and (absolute[0] < 0 or (absolute[1] is not None and absolute[1] < absolute[0])):
        raise DatasetConfigError(f"{file}: subset absolute_range must satisfy 0 <= start <= end, got {tuple(absolute)!r}")
    if ratio is not None and not 0 <= ratio[0] <= ratio[1] <= 1:
        raise DatasetConfigError(f"{file}: subset range must satisfy 0 <= start <= end <= 1, got {tuple(ratio)!r}")
    return (tuple(absolute) if absolute is not None else None, tuple(ratio) if ratio is not None else None)


def _pair(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
