"""Wrappers around one dataset: their base (``Wrapper``, everything delegated), ``EpochizeDataset``
(each ``iter()`` ends after a fixed number of items) and ``MapDataset`` (a function applied to every
item in the trainer process, 1 → n, with its state for an exact restore)."""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Dict, List, Optional

from energon_ray.blend.base import Composition, Node, PassContext, Provider, check_same_workers
from energon_ray.blend.lengths import split_evenly, worker_items
from energon_ray.errors import check_keywords, log_exception
from energon_ray.loader.merge import EXHAUSTED
from energon_ray.pipeline.policy import HookRunner

logger = logging.getLogger("energon_ray")


class Wrapper(Composition):
    """A composition around one dataset; everything is delegated unless overridden."""

    def __init__(self, dataset: Composition, what: str):
        self.dataset = dataset
        self.worker_config = check_same_workers([dataset], what)

    def leaves(self) -> List[Any]:
        return self.dataset.leaves()

    def is_endless(self) -> bool:
        return self.dataset.is_endless()

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        return self.dataset.provider(ctx, pass_index)

    def caps(self) -> Optional[List[int]]:
        return self.dataset.caps()

    def virtual_epoch_length(self) -> int:
        return self.dataset.virtual_epoch_length()

    def packing_form(self) -> Optional[Composition]:
        """The dataset inside that may pack its leaves alone, as older loaders did (``SampleBlendDataset``)."""
        inner = getattr(self.dataset, "packing_form", None)
        return inner() if inner is not None else None

    def other_form(self) -> Optional[Composition]:
        """This wrapper around the dataset inside packing the other way (its states fit too), or ``None``."""
        inner = getattr(self.dataset, "other_form", None)
        other = inner() if inner is not None else None
        if other is None:
            return None
        twin = copy.copy(self)
        twin.dataset = other
        return twin

    def leaf_shares(self):
        return self.dataset.leaf_shares()

    def schedule_hints(self, pass_index: int):
        return self.dataset.schedule_hints(pass_index)

    def worker_items(self) -> List[int]:
        return worker_items(self.dataset)

    def __len__(self) -> int:
        return len(self.dataset)


class EpochizeDataset(Wrapper):
    """Ends each ``iter()`` of the loader after ``length`` items; the next continues the stream."""

    def __init__(self, dataset: Composition, length: int, worker_config: Any = None):
        if not isinstance(length, int) or length <= 0:
            raise ValueError(f"EpochizeDataset: length must be a positive int, got {length!r}")
        super().__init__(dataset, "EpochizeDataset")
        self.length = length

    def virtual_epoch_length(self) -> int:
        return self.length

    def worker_items(self) -> List[int]:
        return split_evenly(self.length, self.num_workers)

    def __len__(self) -> int:
        return self.length


class MapDataset(Wrapper):
    """Applies ``map_fn`` to every item (in the trainer process, after blending or mixing).

    ``map_fn`` may be a generator (1 → n items); raising ``SkipSample`` drops the item; other errors
    follow the error policy (logged, counted in ``loader.stats``, fatal after too many in a row).
    ``stateless_map_fn=True`` declares ``map_fn`` deterministic: ``restore_sample`` then applies it to
    the item it made again (as Energon's; a loader with a map not so declared cannot restore samples).
    Energon's ``map_fn_config`` is accepted and ignored (warned once); any other unknown keyword
    raises ``TypeError``.
    """

    def __init__(
        self,
        dataset: Composition,
        map_fn: Callable[[Any], Any],
        *,
        stateless_map_fn: bool = False,
        failure_tolerance: int = 100,
        worker_config: Any = None,
        **energon_options: Any,
    ):
        check_keywords("MapDataset", energon_options, ("map_fn_config",))
        super().__init__(dataset, "MapDataset")
        self.map_fn = map_fn
        self.stateless_map_fn = bool(stateless_map_fn)
        self.failure_tolerance = failure_tolerance

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        first_node = len(ctx.nodes)
        inner = self.dataset.provider(ctx, pass_index)
        handler = getattr(self.worker_config, "global_error_handler", log_exception)
        runner = HookRunner("map_fn", self.map_fn, self.failure_tolerance, handler)
        runs = [runner.new_run() for _ in range(self.num_workers)]
        pending: List[List[Any]] = [[] for _ in range(self.num_workers)]
        node = _MapNode(ctx, range(first_node, len(ctx.nodes)), ctx.leaf_indices(self.dataset), pending, self.num_workers)
        ctx.register(node)

        def next_item(worker: int) -> Any:
            while not pending[worker]:
                node.before_pull(worker)
                item = inner(worker)
                if item is EXHAUSTED:
                    return EXHAUSTED
                run = runs[worker]
                out = runner.call_many(run, item, f"map_fn on an item of worker stream {worker}")
                if out is HookRunner.FAILED:
                    ctx.stats.skipped["map_fn"] = ctx.stats.skipped.get("map_fn", 0) + 1
                    if handler is log_exception:  # the default handler's log; a user's handler replaces it
                        logger.warning("skipped (map_fn): %s", run.last_error)
                    continue
                if out is HookRunner.IGNORED:
                    ctx.stats.ignored["map_fn"] = ctx.stats.ignored.get("map_fn", 0) + 1
                    continue
                pending[worker].extend(reversed(out))
                node.expanded(worker)
            node.taken[worker] += 1
            return pending[worker].pop()

        return next_item


class _MapNode(Node):
    """A ``MapDataset``'s state: with outputs of a 1 → n ``map_fn`` still pending, the sub-tree's
    state from before the item was pulled, and how many of its outputs were given (the restore
    pulls the item again, maps it again and drops those)."""

    def __init__(self, ctx: PassContext, nodes: range, leaves: List[int], pending: List[List[Any]], workers: int):
        self.ctx, self.nodes, self.leaves, self.pending = ctx, nodes, leaves, pending
        self.before: List[Any] = [None] * workers
        self.taken = [0] * workers
        self.discard = [0] * workers

    def before_pull(self, worker: int) -> None:
        self.before[worker] = self.ctx.capture(worker, self.nodes, self.leaves)

    def expanded(self, worker: int) -> None:
        self.taken[worker] = 0
        drop, self.discard[worker] = self.discard[worker], 0
        for _ in range(min(drop, len(self.pending[worker]))):
            self.pending[worker].pop()
            self.taken[worker] += 1

    def save(self, worker: int) -> Any:
        if self.pending[worker]:
            return {"discard": self.taken[worker]}
        # restored, its item not pulled again yet: the sub-tree is still at the restored state
        return {"discard": self.discard[worker]}

    def overrides(self, worker: int) -> Optional[Dict[str, Dict[int, Any]]]:
        """The sub-tree's state to save instead of the current one (an expansion is half given)."""
        return self.before[worker] if self.pending[worker] else None

    def restore(self, worker: int, state: Any) -> None:
        self.pending[worker].clear()
        self.discard[worker] = int(state["discard"])
