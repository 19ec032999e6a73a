"""Energon's remaining dataset wrappers, composing on any dataset or composition.

They run in the loader process, after the Ray stages (and after blending, when they wrap a blend),
one logical worker stream at a time, exactly like Energon's wrappers run inside each worker.
Every one saves and restores exactly with ``get_savable_loader``: counters and flags in a ``Node``;
wrappers that hold items between calls re-pull them on restore (``blend.replay``), so a state
holds no sample data.

Energon's ``worker_config`` argument is optional here (it must match the dataset's); options that
only tune Energon's internals are accepted and ignored.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from typing import Any, Callable, List, Optional

from energon_ray.blend.base import Composition, PassContext, Provider
from energon_ray.blend.buffered import BatchDataset, GroupBatchDataset, IterMapDataset, PackingDataset, ShuffleBufferDataset
from energon_ray.blend.wrapper_hooks import check_worker_config, count_failure, ignored
from energon_ray.blend.base import ListNode
from energon_ray.blend.epoch_map import Wrapper
from energon_ray.blend.lengths import worker_items
from energon_ray.errors import check_keywords
from energon_ray.loader.merge import EXHAUSTED

logger = logging.getLogger("energon_ray")

#: The base of every dataset here (``EnergonDataset`` and all compositions and wrappers), for
#: ``isinstance`` checks written against Energon. Its state lives in the loader, not in methods.
SavableDataset = Composition

__all__ = [
    "BatchDataset", "FilterDataset", "GcDataset", "GroupBatchDataset", "IterMapDataset", "LimitDataset",
    "LogSampleDataset", "PackingDataset", "RepeatDataset", "SavableDataset", "ShuffleBufferDataset",
]  # fmt: skip


class FilterDataset(Wrapper):
    """Keeps the items for which ``filter_fn(item)`` is true (dropped ones count as ignored ``filter_fn``).

    ``len()`` is the unfiltered length (an upper bound, as Energon's).
    """

    def __init__(self, dataset: Composition, *, filter_fn: Callable[[Any], bool], filter_fn_config: Any = None, worker_config: Any = None):
        super().__init__(dataset, "FilterDataset")
        check_worker_config(self, worker_config)
        ignored("FilterDataset", filter_fn_config=filter_fn_config)
        self.filter_fn = filter_fn

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        inner = self.dataset.provider(ctx, pass_index)

        def next_item(worker: int) -> Any:
            while True:
                item = inner(worker)
                if item is EXHAUSTED or self.filter_fn(item):
                    return item
                count_failure(ctx, "ignored", "filter_fn")

        return next_item


class LimitDataset(Wrapper):
    """At most ``length`` items per pass and rank, split over the workers like Energon (the first
    ``length % num_workers`` workers give one more). Each loader ``iter()`` is a new pass, so
    ``reset_after_epoch`` is always in effect."""

    def __init__(self, dataset: Composition, length: int, *, reset_after_epoch: bool = False, worker_config: Any = None):
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ValueError(f"LimitDataset: length must be an int >= 0, got {length!r}")
        super().__init__(dataset, "LimitDataset")
        check_worker_config(self, worker_config)
        self.length = length
        self.reset_after_epoch = reset_after_epoch

    def _limits(self) -> List[int]:
        workers = self.num_workers
        return [self.length // workers + (1 if w < self.length % workers else 0) for w in range(workers)]

    def is_endless(self) -> bool:
        return False

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        inner = self.dataset.provider(ctx, pass_index)
        given = [0] * self.num_workers
        ctx.register(_LimitNode(given))
        limits = self._limits()

        def next_item(worker: int) -> Any:
            if given[worker] >= limits[worker]:
                return EXHAUSTED
            item = inner(worker)
            if item is not EXHAUSTED:
                given[worker] += 1
            return item

        return next_item

    def caps(self) -> Optional[List[int]]:
        inner = self.dataset.caps()
        return self._limits() if inner is None else [min(a, b) for a, b in zip(self._limits(), inner)]

    def virtual_epoch_length(self) -> int:
        return 0

    def worker_items(self) -> List[int]:
        """Energon's ``len_worker``: each worker's share of ``length``."""
        return self._limits()

    def __len__(self) -> int:
        if self.dataset.is_endless():
            return self.length
        return min(self.length, len(self.dataset))


class _LimitNode(ListNode):
    """A ``LimitDataset``'s items given per worker, saved as ``{"limited": n}`` (``loader.elastic``
    refuses to move a pass whose limits were counting; a bare int is an older state's)."""

    def save(self, worker: int) -> Any:
        return {"limited": self.values[worker]}

    def restore(self, worker: int, state: Any) -> None:
        self.values[worker] = int(state["limited"] if isinstance(state, dict) else state)


def _repeated(leaf: Any, repeats: Optional[float]) -> Any:
    """A copy of a leaf whose worker streams repeat (``None``: endlessly)."""
    options = getattr(leaf, "options", None)
    if options is None or not dataclasses.is_dataclass(options):
        raise TypeError(f"RepeatDataset: cannot repeat {leaf!r} (not a dataset from get_train_dataset/get_val_dataset)")
    if leaf.is_endless():
        return leaf
    if repeats is None:
        changed = dataclasses.replace(options, repeat=True, repetitions=None)
    else:
        changed = dataclasses.replace(options, repetitions=(options.repetitions or 1.0) * repeats)
    out = copy.copy(leaf)
    out.options = changed
    out._stages = None
    return out


class RepeatDataset(Wrapper):
    """Repeats the dataset ``repeats`` times per pass (``None``: endlessly; a fraction ends the last
    repetition part-way, as Energon's). Each repetition of a training dataset is shuffled anew.

    The repetition is done by the sample streams of the datasets inside (their Ray segments run on
    without a break), so wrappers between this one and those datasets see one longer stream: a
    ``BatchDataset`` inside batches across the seam, a ``LimitDataset`` inside limits all repetitions.
    """

    def __init__(self, dataset: Composition, *, repeats: Optional[float] = None, restart: bool = True, worker_config: Any = None):
        if repeats is not None and (isinstance(repeats, bool) or not isinstance(repeats, (int, float)) or not repeats > 0 or math.isinf(repeats)):
            raise ValueError(f"RepeatDataset: repeats must be None or a finite number > 0, got {repeats!r}")
        super().__init__(dataset, "RepeatDataset")
        check_worker_config(self, worker_config)
        if not restart:  # each loader iter() is a new pass: there is no second iteration to keep empty
            check_keywords("RepeatDataset", {"restart": restart}, ("restart",))
        self.repeats = repeats
        self._copies = {id(leaf): _repeated(leaf, repeats) for leaf in dataset.leaves()}

    def leaves(self) -> List[Any]:
        return [self._copies[id(leaf)] for leaf in self.dataset.leaves()]

    def is_endless(self) -> bool:
        return self.repeats is None or self.dataset.is_endless()

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        # the datasets inside look their feeds up under the original leaves
        ctx.feeds = {**ctx.feeds, **{orig: ctx.feeds[id(rep)] for orig, rep in self._copies.items()}}
        return self.dataset.provider(ctx, pass_index)

    def leaf_shares(self):
        shares = self.dataset.leaf_shares()
        return {id(self._copies[orig]): value for orig, value in shares.items()}

    def schedule_hints(self, pass_index: int):
        return {}

    def worker_items(self) -> List[int]:
        """Energon's ``len_worker``: the inner worker length times ``repeats`` (rounded down)."""
        inner = worker_items(self.dataset)
        return inner if self.repeats is None else [int(n * self.repeats) for n in inner]

    def __len__(self) -> int:
        return sum(self.worker_items())


def _default_keys(item: Any) -> Optional[List[str]]:
    keys = getattr(item, "__key__", None)
    if keys is None and isinstance(item, dict):
        keys = item.get("__key__")
    if keys is None:
        return None
    return [keys] if isinstance(keys, str) else [str(k) for k in keys]


class LogSampleDataset(Wrapper):
    """Logs every item (worker, step, keys) at DEBUG level on the ``energon_ray`` logger and passes it on."""

    def __init__(self, dataset: Composition, mode: str, worker_config: Any = None, get_keys_fn: Callable[[Any], Optional[List[str]]] = _default_keys):
        if mode not in ("train", "val"):
            raise ValueError(f"LogSampleDataset: mode must be 'train' or 'val', got {mode!r}")
        super().__init__(dataset, "LogSampleDataset")
        check_worker_config(self, worker_config)
        self.mode = mode
        self.get_keys_fn = get_keys_fn

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        inner = self.dataset.provider(ctx, pass_index)
        steps = [0] * self.num_workers
        ctx.register(ListNode(steps))
        wc = self.worker_config

        def next_item(worker: int) -> Any:
            item = inner(worker)
            if item is not EXHAUSTED:
                if logger.isEnabledFor(logging.DEBUG):
                    entry = {"t": "yield_batch", "r": wc.rank, "w": wc.global_worker_id(worker), "m": self.mode, "idx": steps[worker]}
                    keys = self.get_keys_fn(item)
                    if keys is not None:
                        entry["keys"] = keys
                    logger.debug("%s", entry)
                steps[worker] += 1
            return item

        return next_item


class GcDataset(Wrapper):
    """Passes items through: Energon collects garbage in its worker processes; here there are none
    (``every_n_iter`` and ``freeze`` are accepted and have no effect)."""

    def __init__(self, dataset: Composition, *, worker_config: Any = None, every_n_iter: int = 10, freeze: bool = True):
        super().__init__(dataset, "GcDataset")
        check_worker_config(self, worker_config)
        self.every_n_iter = every_n_iter
        self.freeze = freeze
