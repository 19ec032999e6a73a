"""The loading entry points Energon users call: ``get_loader``, ``get_savable_loader`` and
``SavableDataLoader`` (Energon's keywords checked and mapped onto :class:`EnergonLoader`)."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

from energon_ray.blend.base import Composition
from energon_ray.errors import check_keywords, users_stacklevel
from energon_ray.loader.loader import DEFAULT_OBJECT_STORE_LIMIT, EnergonLoader

#: ``get_loader`` keywords of Energon that do not apply here (Ray has its own watchdogs; the
#: trainer's heap holds no samples to collect); ``cache_pool`` is taken before they are checked.
ENERGON_LOADER_OPTIONS = (
    "watchdog_timeout_seconds", "watchdog_initial_timeout_seconds", "fail_on_timeout",
    "gc_collect_every_n_steps", "gc_freeze_at_start",
)  # fmt: skip


def get_loader(
    dataset: Composition,
    *,
    worker_config: Any = None,
    prefetch_factor: Optional[int] = None,
    prefetch_batches: int = 4,
    pin_memory: Optional[bool] = None,
    ray_remote_args: Optional[dict] = None,
    object_store_limit: Optional[int] = DEFAULT_OBJECT_STORE_LIMIT,
    executor: Optional[str] = None,
    **energon_options: Any,
) -> EnergonLoader:
    """Iterate a dataset's batches, made by Ray tasks (or Ray Data executions: ``executor``).

    Args:
        dataset: from ``get_train_dataset`` / ``get_val_dataset``, or a composition of them.
        worker_config: accepted for Energon compatibility (deprecated there too); must match the dataset's.
        prefetch_factor: Energon's name for ``prefetch_batches``.
        prefetch_batches: with ``executor="ray_data"``, blocks requested ahead of the loop.
        pin_memory: pin batch tensors (default: when CUDA is available; never fails on a CPU-only box).
        ray_remote_args: resources per segment task.
        object_store_limit: bytes of finished blocks Ray may hold ahead of the trainer (``None``: Ray's default).
        executor: ``"tasks"`` (default, or ``$ENERGON_RAY_EXECUTOR``): segments as plain Ray tasks;
            ``"ray_data"``: as Ray Data executions (see ``EnergonLoader``).
        **energon_options: ``cache_pool`` (a ``CachePool``: cookers get it as ``cache``, hooks as
            ``self.cache``, in the segment tasks); Energon's ``watchdog_timeout_seconds``,
            ``watchdog_initial_timeout_seconds``, ``fail_on_timeout``, ``gc_collect_every_n_steps``,
            ``gc_freeze_at_start``: accepted and ignored (a warning, once each).

    Raises:
        TypeError: any other keyword, or a pin_memory that is not a bool or None.
        ValueError: prefetch_batches or object_store_limit not a whole number >= 0.

    Returns:
        An iterable of the task encoder's batches; ``len()`` is batches per rank and epoch.

    Example:
        >>> loader = get_loader(get_val_dataset(path, batch_size=4))  # doctest: +SKIP
        >>> next(iter(loader))  # doctest: +SKIP
    """
    return EnergonLoader(dataset, **_loader_options(
        "get_loader", dataset, worker_config=worker_config, prefetch_factor=prefetch_factor,
        prefetch_batches=prefetch_batches, pin_memory=pin_memory, ray_remote_args=ray_remote_args,
        object_store_limit=object_store_limit, executor=executor, **energon_options,
    ))  # fmt: skip


def _loader_options(
    what: str,
    dataset: Any,
    *,
    worker_config: Any = None,
    prefetch_factor: Optional[int] = None,
    prefetch_batches: int = 4,
    pin_memory: Optional[bool] = None,
    ray_remote_args: Optional[dict] = None,
    object_store_limit: Optional[int] = DEFAULT_OBJECT_STORE_LIMIT,
    executor: Optional[str] = None,
    **energon_options: Any,
) -> Dict[str, Any]:
    """``EnergonLoader``'s keywords from ``get_loader``'s (Energon's names checked and mapped)."""
    cache_pool = energon_options.pop("cache_pool", None)
    check_keywords(what, energon_options, ENERGON_LOADER_OPTIONS)
    if cache_pool is not None:
        _attach_cache_pool(what, dataset, cache_pool)
    if worker_config is not None and isinstance(dataset, Composition) and worker_config != dataset.worker_config:
        raise ValueError(
            f"{what}: worker_config {worker_config.config()} differs from the dataset's {dataset.worker_config.config()}"
        )
    if worker_config is not None:  # Energon's advice, in its category (shown by default)
        warnings.warn(f"Passing a worker_config to {what}() is deprecated and will have no effect.", FutureWarning, stacklevel=users_stacklevel())
    if prefetch_factor is not None:
        prefetch_batches = prefetch_factor
    return dict(
        prefetch_batches=prefetch_batches, ray_remote_args=ray_remote_args, pin_memory=pin_memory,
        object_store_limit=object_store_limit, executor=executor,
    )  # fmt: skip


def _attach_cache_pool(what: str, dataset: Any, pool: Any) -> None:
    """Hand ``pool`` to every leaf dataset: it travels with their stage configs to the segment tasks."""
    from energon_ray.cache import CachePool

    if not isinstance(pool, CachePool):
        raise TypeError(f"{what}: cache_pool must be a CachePool (e.g. FileStoreCachePool), got {type(pool).__name__}")
    for leaf in dataset.leaves():
        leaf.set_cache_pool(pool)


#: ``get_savable_loader`` keywords of Energon's snapshot cadence: every item is an exact save point here.
SAVABLE_OPTIONS = ("checkpoint_every_sec", "checkpoint_every_min_n_samples", "n_checkpoints")


class SavableDataLoader(EnergonLoader):
    """Energon's savable loader class: ``SavableDataLoader(dataset, **options)`` is
    ``get_savable_loader(dataset, **options)`` (what that returns). Every ``EnergonLoader`` saves and
    restores; this name is for code that constructs or type-checks Energon's class."""

    def __init__(self, dataset: Composition, **options: Any):
        for name in SAVABLE_OPTIONS:
            options.pop(name, None)
        super().__init__(dataset, **_loader_options("SavableDataLoader", dataset, **options))


def get_savable_loader(dataset: Composition, **kwargs: Any) -> SavableDataLoader:
    """``get_loader`` for checkpointed training: ``save_state_rank()``/``restore_state_rank(state)``,
    ``save_state_global(dst)``/``restore_state_global(states)``.

    Every loader of energon_ray can save and restore at any item (there are no snapshots to take),
    so Energon's ``checkpoint_every_sec``, ``checkpoint_every_min_n_samples`` and ``n_checkpoints``
    are accepted and have nothing to do; every other keyword is ``get_loader``'s.

    Example:
        >>> loader = get_savable_loader(get_train_dataset(path, batch_size=32, task_encoder=te))  # doctest: +SKIP
        >>> state = loader.save_state_rank()            # in the checkpoint   # doctest: +SKIP
        >>> fresh = get_savable_loader(get_train_dataset(path, batch_size=32, task_encoder=te))  # doctest: +SKIP
        >>> fresh.restore_state_rank(state)              # continues exactly  # doctest: +SKIP
    """
    return SavableDataLoader(dataset, **kwargs)
