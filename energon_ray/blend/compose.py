"""Energon's weighted blend on Ray: ``BlendDataset`` (and ``PooledBlendDataset``, a blend batched
across its sources). ``ConcatDataset`` and ``MixBatchDataset`` are in ``blend.concat``,
``EpochizeDataset`` and ``MapDataset`` in ``blend.epoch_map``.

Each source keeps its own stream of segments, its own task encoder, decoder and stage config; the
segments of all sources run in ONE Ray execution whose task list is ordered by when each segment's
items are expected to be needed (``plan.schedule``). Measured on 2 cores: one Ray Data execution per
source cost the driver 0.7-0.9 cores for a 3-source blend (0.3 for one source) and let sources run
ahead of their share; one execution keeps it at 0.3. The choice of which source feeds the next item
is drawn per logical worker from a numpy generator seeded by the worker's seed and the pass, step by
step — a pure function of seed, weights and position, never of which segment Ray finished first.

Why not Ray's ``Dataset.mix``: it is block-granular and deficit-driven (each output block comes
whole from the input furthest behind its row ratio, see benchmarks/probe_ray_mix.py), so its order
is a deterministic round-robin of blocks rather than a seeded random draw, its sources must share
one schema, and it cannot keep per-worker streams apart; we would still have to re-order in the
driver. The union here is decided in the driver instead, where the order is defined anyway.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from energon_ray.blend.base import Composition, Node, OfSeveral, PassContext, Provider, check_same_workers
from energon_ray.blend.lengths import add_per_worker, batch_count, worker_items, worker_samples
from energon_ray.loader.merge import EXHAUSTED
from energon_ray.plan.schedule import NeedFn

logger = logging.getLogger("energon_ray")

_BLEND_STREAM = 0xB1E4D


class _Draws:
    """Uniform draws of one worker's blend, generated in chunks from a seeded generator."""

    CHUNK = 1024

    def __init__(self, seed: int, pass_index: int, salt: int):
        self._rng = np.random.default_rng([seed & 0xFFFFFFFF, _BLEND_STREAM, pass_index, salt])
        self._buf = np.empty(0)
        self._pos = 0
        #: draws taken with ``next``
        self.count = 0

    def skip_to(self, count: int) -> None:
        """Continue as if ``count`` draws had been taken with ``next`` (a fresh ``_Draws`` only)."""
        chunks, self._pos = divmod(count, self.CHUNK)
        self._rng.bit_generator.advance(chunks * self.CHUNK)  # one 64-bit output per double
        self._buf = self.chunk() if self._pos else np.empty(0)
        self.count = count

    def chunk(self) -> np.ndarray:
        """The next ``CHUNK`` draws at once (for replaying the sequence; do not mix with ``next``)."""
        return self._rng.random(self.CHUNK)

    def next(self) -> float:
        if self._pos >= len(self._buf):
            self._buf, self._pos = self.chunk(), 0
        self._pos += 1
        self.count += 1
        return float(self._buf[self._pos - 1])


class _BlendNode(Node):
    def __init__(self, draws: List[_Draws], alive: List[List[bool]], seeds: Callable[[], List[_Draws]]):
        self.draws, self.alive, self._fresh = draws, alive, seeds

    def save(self, worker: int) -> Any:
        return {"draws": self.draws[worker].count, "alive": list(self.alive[worker])}

    def restore(self, worker: int, state: Any) -> None:
        fresh = self._fresh()[worker]
        fresh.skip_to(int(state["draws"]))
        self.draws[worker] = fresh
        self.alive[worker][:] = [bool(x) for x in state["alive"]]


def _pick(cumulative: np.ndarray, u: Any) -> Any:
    """The source index (or indices) a uniform draw ``u`` in [0, 1) selects under cumulative weights."""
    return np.minimum(np.searchsorted(cumulative, np.asarray(u) * cumulative[-1], side="right"), len(cumulative) - 1)


class _SourceReplay:
    """Replays one worker's blend draws (every source alive) to tell at which draw the source's
    ``j``-th item is taken — the exact schedule Ray's work should follow.

    Keeps one chunk of the source's positions: the scheduler asks for increasing ``j``, so an
    endless pass needs constant memory (an earlier ``j`` restarts the replay).
    """

    def __init__(self, make_draws: Callable[[], _Draws], cumulative: np.ndarray, source: int):
        self._make_draws, self._cumulative, self._source = make_draws, cumulative, source
        self._restart()

    def _restart(self) -> None:
        self._draws = self._make_draws()
        self._base = 0  # draw index of the current chunk's start
        self._first = 0  # item index of self._found[0]
        self._found = np.empty(0, dtype=np.int64)

    def position(self, item: int) -> int:
        if item < self._first:
            self._restart()
        while self._first + len(self._found) <= item:
            self._first += len(self._found)
            self._found = self._base + np.flatnonzero(_pick(self._cumulative, self._draws.chunk()) == self._source)
            self._base += _Draws.CHUNK
        return int(self._found[item - self._first])


def _check_weight(weight: Any, where: str) -> float:
    try:
        value = float(weight)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: weight must be a number, got {weight!r}") from None
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ValueError(f"{where}: weight must be a finite number >= 0, got {weight!r}")
    return value


class BlendDataset(OfSeveral):
    """Weighted blend: each item (a whole batch of one source) comes from a source drawn at random.

    Weights are normalised; an exhausted source drops out; the blend ends when all are exhausted
    (never, if a source repeats). Sources may have different task encoders and batch types.

    Args:
        *datasets: ``(dataset, weight)`` pairs.
        worker_config: accepted for Energon compatibility; must match the datasets'.

    Raises:
        ValueError: negative, NaN or all-zero weights, weights whose sum overflows, or datasets with
            different worker configs.

    Example:
        >>> loader = get_loader(BlendDataset((images, 0.6), (captions, 0.4)))  # doctest: +SKIP
    """

    def __init__(self, *datasets: Tuple[Composition, float], worker_config: Any = None, salt: int = 0):
        if not datasets:
            raise ValueError("BlendDataset needs at least one (dataset, weight) pair")
        parts, weights = [], []
        for i, entry in enumerate(datasets):
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise TypeError(f"BlendDataset: argument {i} must be a (dataset, weight) pair, got {entry!r}")
            parts.append(entry[0])
            weights.append(_check_weight(entry[1], f"BlendDataset source {i}"))
        total = sum(weights)
        if math.isinf(total):  # each weight / inf is 0: the blend would be empty or "all zero"
            raise ValueError(f"BlendDataset: weights {weights} sum to {total} (too large for a float); scale them down")
        if total <= 0:
            raise ValueError(f"BlendDataset: weights {weights} are all zero")
        self.worker_config = check_same_workers(parts, "BlendDataset")
        if worker_config is not None and worker_config != self.worker_config:
            raise ValueError("BlendDataset: worker_config differs from the datasets' WorkerConfig")
        self.datasets = parts
        self.weights = [w / sum(weights) for w in weights]
        #: the ``(dataset, weight)`` pairs as given (Energon's attribute; ``weights`` are normalised)
        self.dataset_weights = tuple((part, weight) for part, weight in zip(parts, weights))
        self.salt = salt

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        subs = [ds.provider(ctx, pass_index) for ds in self.datasets]
        workers = self.num_workers

        def fresh() -> List[_Draws]:
            return [_Draws(self.worker_config.worker_seed(w), pass_index, self.salt) for w in range(workers)]

        draws = fresh()
        alive = [[w > 0 for w in self.weights] for _ in range(workers)]
        ctx.register(_BlendNode(draws, alive, fresh))
        weights = [float(w) for w in self.weights]
        #: per worker: (which sources are alive, their cumulative weights), recomputed when one ends
        cumulatives: List[Optional[Tuple[Tuple[bool, ...], List[float]]]] = [None] * workers

        def next_item(worker: int) -> Any:
            live = alive[worker]
            while any(live):
                key = tuple(live)
                cached = cumulatives[worker]
                if cached is None or cached[0] != key:
                    # the sums numpy's cumsum of the masked weights gives (sequential float64 adds)
                    cached = cumulatives[worker] = (key, list(itertools.accumulate(w if on else 0.0 for w, on in zip(weights, live))))
                cumulative = cached[1]
                # _pick in plain Python (a sample blend draws per sample: numpy's call overhead dominated)
                choice = min(bisect.bisect_right(cumulative, draws[worker].next() * cumulative[-1]), len(cumulative) - 1)
                while not live[choice]:  # u landed exactly on a boundary next to a dead source
                    choice -= 1
                item = subs[choice](worker)
                if item is not EXHAUSTED:
                    return item
                live[choice] = False
            return EXHAUSTED

        return next_item

    def schedule_hints(self, pass_index: int, items_per_step: int = 1):
        flat = all(isinstance(ds, Composition) and ds.leaves() == [ds] for ds in self.datasets)
        if not flat or not all(ds.is_endless() for ds in self.datasets):
            return {}
        return {id(ds): self._need(pass_index, i, items_per_step) for i, ds in enumerate(self.datasets)}

    def _need(self, pass_index: int, source: int, items_per_step: int) -> NeedFn:
        """``need(worker, item)``: the global step that takes the source's ``item``-th item of ``worker``."""
        if self.weights[source] <= 0:
            return lambda worker, item: math.inf
        workers, cumulative = self.num_workers, np.cumsum(self.weights)
        replays = [
            _SourceReplay(lambda w=w: _Draws(self.worker_config.worker_seed(w), pass_index, self.salt), cumulative, source)
            for w in range(workers)
        ]
        return lambda worker, item: (replays[worker].position(item) // items_per_step) * workers + worker

    def leaf_shares(self):
        return {
            leaf: (share * weight, offset)
            for ds, weight in zip(self.datasets, self.weights)
            for leaf, (share, offset) in ds.leaf_shares().items()
        }

    def worker_items(self) -> List[int]:
        """Items per worker: the sum of the sources' (Energon's ``BlendDataset.len_worker``)."""
        return add_per_worker([worker_items(ds) for ds in self.datasets])

    def __len__(self) -> int:
        return sum(self.worker_items())

    def __repr__(self) -> str:
        return "BlendDataset(" + ", ".join(f"({ds!r}, {w:.3g})" for ds, w in zip(self.datasets, self.weights)) + ")"


class PooledBlendDataset(BlendDataset):
    """The train blend of a metadataset's leaves: a :class:`BlendDataset` whose length counts the
    batches of each worker's pooled samples, as Energon blends samples and then batches them.

    Args:
        *datasets: ``(dataset, weight)`` pairs of datasets from ``get_train_dataset`` (not compositions).
        batch_size: the leaves' batch size (``None``: unbatched).
        drop_last: whether a worker's last partial batch is dropped.

    Example:
        >>> # two leaves of 55 samples, batch_size=10, one worker: len() is 11 (not 6 + 6)
    """

    def __init__(self, *datasets: Tuple[Composition, float], batch_size: Optional[int], drop_last: bool = False):
        super().__init__(*datasets)
        self.batch_size = batch_size
        self.drop_last = drop_last

    def worker_items(self) -> List[int]:
        pooled = add_per_worker([worker_samples(ds) for ds in self.datasets])
        return [batch_count(n, self.batch_size, self.drop_last) for n in pooled]
