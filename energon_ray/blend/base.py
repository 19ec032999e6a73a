"""``Composition``: what ``get_loader`` iterates — one dataset, or datasets combined.

A composition names its leaf datasets (each a Ray stream of its own) and, for one pass, builds a
*provider*: ``next_item(worker) -> item | EXHAUSTED``. The loader interleaves workers round-robin
over the provider. Everything that decides order is a pure function of seeds, weights and
positions; Ray only makes the items.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from energon_ray.plan.schedule import NeedFn

Provider = Callable[[int], Any]


class Node:
    """A composition's per-worker state for one pass (small JSON values: counters and flags)."""

    def save(self, worker: int) -> Any:
        raise NotImplementedError

    def restore(self, worker: int, state: Any) -> None:
        raise NotImplementedError


class ListNode(Node):
    """One JSON value per worker, kept in a list the provider reads."""

    def __init__(self, values: List[Any]):
        self.values = values

    def save(self, worker: int) -> Any:
        return self.values[worker]

    def restore(self, worker: int, state: Any) -> None:
        self.values[worker] = state


class PassContext:
    """What providers of one pass share: the leaves' feeds, the loader's counters, and the stateful
    nodes the compositions register (children before their parent, in a fixed order)."""

    def __init__(self, feeds: Mapping[int, Any], stats: Any):
        self.feeds = feeds
        self.stats = stats
        self.nodes: List[Node] = []

    def register(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def leaf_indices(self, composition: "Composition") -> List[int]:
        """Indices (in the loader's leaf order) of the leaves under ``composition``."""
        return [self.feeds[id(leaf)].source for leaf in composition.leaves()]

    def capture(self, worker: int, nodes: range, leaves: List[int]) -> Dict[str, Dict[int, Any]]:
        """The state of one worker in a sub-tree (its nodes and leaf streams), e.g. before a pull.

        As the loader saves it: a node's ``overrides`` (the sub-tree's state before a group it is
        half-way through giving) replaces the current state, children first."""
        by_index = {feed.source: feed for feed in self.feeds.values()}
        out = {
            "nodes": {i: self.nodes[i].save(worker) for i in nodes},
            "streams": {leaf: by_index[leaf].queues.state(worker) for leaf in leaves},
        }
        for i in nodes:
            overrides = getattr(self.nodes[i], "overrides", None)
            before = overrides(worker) if overrides is not None else None
            if before is not None:
                out["nodes"].update(before["nodes"])
                out["streams"].update(before["streams"])
        return out


class Composition:
    """Base of ``EnergonDataset``, ``BlendDataset``, ``ConcatDataset``, ``MixBatchDataset``…"""

    worker_config: Any

    def leaves(self) -> List[Any]:
        """The ``EnergonDataset``s this composition reads (each its own Ray stream)."""
        raise NotImplementedError

    def is_endless(self) -> bool:
        """Whether one pass never ends (a repeating training source somewhere)."""
        raise NotImplementedError

    def provider(self, ctx: "PassContext", pass_index: int) -> Provider:
        """``next_item(worker)`` for one pass (``ctx.feeds`` maps ``id(leaf)`` to its ``LeafFeed``)."""
        raise NotImplementedError

    def leaf_shares(self) -> Dict[int, Tuple[float, float]]:
        """``id(leaf) -> (share, offset)``: the expected fraction of a worker's items the leaf gives,
        and how many items precede its first one (for scheduling Ray work; see ``plan.schedule``)."""
        raise NotImplementedError

    def schedule_hints(self, pass_index: int) -> Dict[int, NeedFn]:
        """``id(leaf) -> need(worker, item_index)``: exact steps at which items will be taken, where
        the composition can tell them in advance (a blend of endless sources replays its draws)."""
        return {}

    def caps(self) -> Optional[List[int]]:
        """Per-worker item limits of a pass (``limit``), or ``None``."""
        return None

    def virtual_epoch_length(self) -> int:
        """Items per ``iter()`` of an endless loader (0: not epochized)."""
        return 0

    @property
    def num_workers(self) -> int:
        return max(1, self.worker_config.num_workers)

    def __len__(self) -> int:
        raise NotImplementedError


class OfSeveral(Composition):
    """A composition of several datasets (``self.datasets``): their leaves in order, endless if one is."""

    datasets: List[Composition]

    def leaves(self) -> List[Any]:
        return [leaf for ds in self.datasets for leaf in ds.leaves()]

    def is_endless(self) -> bool:
        return any(ds.is_endless() for ds in self.datasets)


def check_same_workers(datasets: List[Composition], what: str) -> Any:
    """All parts of a composition must share rank, world size and worker count.

    Raises:
        ValueError: naming the mismatching configurations.
    """
    if not datasets:
        raise ValueError(f"{what} needs at least one dataset")
    for ds in datasets:
        if not isinstance(ds, Composition):
            raise TypeError(f"{what}: {ds!r} is not a dataset from get_train_dataset/get_val_dataset or a composition of them")
    first = datasets[0].worker_config
    for ds in datasets[1:]:
        if ds.worker_config != first:
            raise ValueError(
                f"{what}: all datasets need the same WorkerConfig (rank, world_size, num_workers); got "
                f"{first.config()} and {ds.worker_config.config()}"
            )
    return first
