"""Exact save/restore for wrappers that hold items between calls: restore re-pulls them.

A wrapper that buffers (a partial pack, a shuffle buffer, grouping buckets, a generator's
outputs) saves no sample data. It saves the state of the sub-tree below it from *before* the
oldest pull it still depends on (``overrides``: the loader writes that state instead of the
current one) plus a few integers saying which of the following pulls are still held or how many
outputs were already given. A restored wrapper pulls those items again and rebuilds its buffer,
so the next item is exactly what the saved loader would have given.

``GroupNode``: a group of consecutive pulls becomes a list of outputs (a batch, a pack, an
``iter_map_fn``'s run); state = outputs of the group already given.
``LiveNode``: any pulls may still be held (shuffle buffer, buckets); state = which of them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from energon_ray.blend.base import Node, PassContext

Capture = Dict[str, Dict[int, Any]]


class SubTree:
    """The nodes and leaf streams registered below one wrapper (call before registering its node)."""

    def __init__(self, ctx: PassContext, first_node: int, leaves: List[int]):
        self.ctx = ctx
        self.nodes = range(first_node, len(ctx.nodes))
        self.leaves = leaves

    def capture(self, worker: int) -> Capture:
        return self.ctx.capture(worker, self.nodes, self.leaves)


class GroupNode(Node):
    """Per worker: the sub-tree's state before the current group's first pull, and how many of the
    group's outputs were given. A restore sets ``discard``: the re-made group drops that many."""

    def __init__(self, tree: SubTree, workers: int, on_restore: Optional[Callable[[int], None]] = None):
        self.tree = tree
        self.on_restore = on_restore
        self.before: List[Optional[Capture]] = [None] * workers
        self.taken = [0] * workers
        self.active = [False] * workers
        self.done = [False] * workers
        self.discard = [0] * workers

    def begin(self, worker: int) -> None:
        """A group starts with the next pull (capture the sub-tree now)."""
        self.before[worker] = self.tree.capture(worker)
        self.taken[worker] = 0
        self.active[worker] = True

    def end(self, worker: int) -> None:
        """Every output of the group was given: the sub-tree's current state is the save point."""
        self.active[worker] = False
        self.before[worker] = None

    def gave(self, worker: int) -> None:
        self.taken[worker] += 1

    def give(self, worker: int, pending: List[Any]) -> Any:
        """The next of the group's outputs (``pending`` holds them reversed); the group ends with its last."""
        self.gave(worker)
        item = pending.pop()
        if not pending:
            self.end(worker)
        return item

    def take_discard(self, worker: int) -> int:
        """Outputs to drop from the first group after a restore (then 0)."""
        drop, self.discard[worker] = self.discard[worker], 0
        self.taken[worker] += drop
        return drop

    def save(self, worker: int) -> Any:
        # restored but not pulled since: the sub-tree is still at the restored state, whose group
        # still has to drop what the restore said
        discard = self.taken[worker] if self.active[worker] else self.discard[worker]
        return {"discard": discard, "done": self.done[worker]}

    def overrides(self, worker: int) -> Optional[Capture]:
        return self.before[worker] if self.active[worker] else None

    def restore(self, worker: int, state: Any) -> None:
        self.discard[worker] = int(state["discard"])
        self.done[worker] = bool(state.get("done", False))
        self.active[worker] = False
        self.before[worker] = None
        self.taken[worker] = 0
        if self.on_restore is not None:
            self.on_restore(worker)


class LiveNode(Node):
    """Per worker: numbered pulls, the ones still held (``live``) with the sub-tree's state before
    each, and a small ``extra`` JSON dict of the wrapper's (e.g. random draws taken).

    Saved: the live pulls relative to the oldest one and how many pulls followed it; the override is
    the capture before it. Restored: ``replay_into(worker, pull, add)`` makes those pulls again and
    hands the live ones to ``add`` (the others were given already and are dropped).
    """

    def __init__(self, tree: SubTree, workers: int, extra: Callable[[int], Dict[str, Any]], set_extra: Callable[[int, Dict[str, Any]], None]):
        self.tree = tree
        self.count = [0] * workers
        self.captures: List[Dict[int, Capture]] = [{} for _ in range(workers)]
        self.replay: List[Optional[Tuple[List[int], int]]] = [None] * workers
        self._extra, self._set_extra = extra, set_extra

    def pull(self, worker: int, inner: Callable[[int], Any], end: Any) -> tuple:
        """``(index, item)`` of the next pull from ``inner`` (``item is end``: nothing was pulled)."""
        before = self.tree.capture(worker)
        item = inner(worker)
        if item is end:
            return -1, item
        index = self.count[worker]
        self.count[worker] += 1
        self.captures[worker][index] = before
        return index, item

    def release(self, worker: int, index: int) -> None:
        """The pull ``index`` was given out (its item is no longer held)."""
        self.captures[worker].pop(index, None)

    def save(self, worker: int) -> Any:
        if self.replay[worker] is not None:  # restored, not replayed yet: still the restored state
            live_restored, pulled_restored = self.replay[worker]
            return {"live": _runs(live_restored), "pulled": pulled_restored, **self._extra(worker)}
        live = sorted(self.captures[worker])
        base = live[0] if live else 0
        pulled = self.count[worker] - base if live else 0
        return {"live": _runs([i - base for i in live]), "pulled": pulled, **self._extra(worker)}

    def overrides(self, worker: int) -> Optional[Capture]:
        live = self.captures[worker]
        return live[min(live)] if live else None

    def restore(self, worker: int, state: Any) -> None:
        self.captures[worker].clear()
        self.count[worker] = 0
        live = _unruns(state["live"])
        self.replay[worker] = (live, int(state["pulled"])) if live else None
        self._set_extra(worker, {k: v for k, v in state.items() if k not in ("live", "pulled")})

    def replay_into(self, worker: int, inner: Callable[[int], Any], end: Any, add: Callable[[int, int, Any], None]) -> None:
        """After a restore: pull the saved pulls again and give the live ones to ``add(worker, index, item)``."""
        replay, self.replay[worker] = self.replay[worker], None
        if replay is None:
            return
        live, pulled = replay
        wanted = set(live)
        for relative in range(pulled):
            index, item = self.pull(worker, inner, end)
            if item is end:
                raise RuntimeError(
                    f"restoring worker stream {worker}: the dataset ended after {relative} of the {pulled} items the "
                    "saved buffer was built from (was the state saved with another dataset?)"
                )
            if relative in wanted:
                add(worker, index, item)
            else:
                self.release(worker, index)


def _runs(values: List[int]) -> List[List[int]]:
    """Sorted ints as ``[start, stop)`` runs (a buffer's live pulls are mostly contiguous)."""
    out: List[List[int]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1][1] = v + 1
        else:
            out.append([v, v + 1])
    return out


def _unruns(runs: List[List[int]]) -> List[int]:
    return [v for start, stop in runs for v in range(int(start), int(stop))]
