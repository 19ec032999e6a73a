"""The wrappers that hold items between calls: ``BatchDataset``, ``PackingDataset``,
``IterMapDataset``, ``ShuffleBufferDataset``, ``GroupBatchDataset`` (exported by ``blend.wrappers``).

Their state is a few integers; a restore pulls the held items again (see ``blend.replay``), so
their functions must give the same outputs for the same inputs (as for Energon's ``restore_sample``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Iterator, List, Optional, Tuple

from energon_ray.blend.base import Composition, PassContext, Provider
from energon_ray.blend.compose import _Draws
from energon_ray.blend.epoch_map import Wrapper
from energon_ray.blend.lengths import batch_count, worker_items
from energon_ray.blend.replay import GroupNode, LiveNode, SubTree
from energon_ray.blend.wrapper_hooks import check_size, check_worker_config, hook_outputs, hook_runner, ignored
from energon_ray.loader.merge import EXHAUSTED

_SHUFFLE_SALT = 0x5B0F


class _GroupWrapper(Wrapper):
    """Pulls ``group_size`` items (fewer at the end), makes outputs of them, gives them one by one."""

    group_size: int
    drop_last = False

    def _maker(self, ctx: PassContext) -> Callable[[int, List[Any]], List[Any]]:
        raise NotImplementedError

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        first = len(ctx.nodes)
        inner = self.dataset.provider(ctx, pass_index)
        node = GroupNode(SubTree(ctx, first, ctx.leaf_indices(self.dataset)), self.num_workers)
        ctx.register(node)
        make = self._maker(ctx)
        pending: List[List[Any]] = [[] for _ in range(self.num_workers)]

        def next_item(worker: int) -> Any:
            while not pending[worker]:
                node.begin(worker)
                group = []
                while len(group) < self.group_size:
                    item = inner(worker)
                    if item is EXHAUSTED:
                        break
                    group.append(item)
                if not group or (self.drop_last and len(group) < self.group_size):
                    node.end(worker)
                    return EXHAUSTED
                out = make(worker, group)
                pending[worker] = list(reversed(out[node.take_discard(worker) :]))
            return node.give(worker, pending[worker])

        return next_item


class BatchDataset(_GroupWrapper):
    """Groups ``batch_size`` consecutive items of each worker stream and calls ``batcher`` on the
    list (a generator ``batcher`` gives several batches; ``SkipSample`` or an error drops the group
    under the error policy). The last short batch is kept unless ``drop_last``."""

    def __init__(
        self,
        dataset: Composition,
        batch_size: int,
        batcher: Callable[[List[Any]], Any],
        *,
        batcher_stateless: bool = False,
        batcher_config: Any = None,
        drop_last: bool = False,
        failure_tolerance: int = 100,
        worker_config: Any = None,
    ):
        check_size("BatchDataset", "batch_size", batch_size)
        super().__init__(dataset, "BatchDataset")
        check_worker_config(self, worker_config)
        ignored("BatchDataset", batcher_stateless=batcher_stateless, batcher_config=batcher_config)
        self.batch_size = self.group_size = batch_size
        self.batcher = batcher
        self.drop_last = drop_last
        self.failure_tolerance = failure_tolerance

    def _maker(self, ctx: PassContext):
        runner = hook_runner(self, "batcher", self.batcher, self.failure_tolerance)
        runs = [runner.new_run() for _ in range(self.num_workers)]
        return lambda worker, group: hook_outputs(ctx, runner, runs[worker], group, f"batcher on {len(group)} items of worker stream {worker}")

    def is_endless(self) -> bool:
        return self.dataset.is_endless()

    def worker_items(self) -> List[int]:
        return [batch_count(n, self.batch_size, self.drop_last) for n in worker_items(self.dataset)]

    def __len__(self) -> int:
        return sum(self.worker_items())


class PackingDataset(_GroupWrapper):
    """Reads ``buffer_size`` items, lets ``pre_packer`` choose packs (lists of them; items in no
    pack are dropped, as Energon's), encodes each item of a pack with ``sample_encoder`` (if any)
    and gives ``final_packer(pack)`` (a generator gives several) pack by pack."""

    def __init__(
        self,
        dataset: Composition,
        buffer_size: int,
        pre_packer: Callable[[List[Any]], List[List[Any]]],
        final_packer: Callable[[List[Any]], Any],
        *,
        final_packer_stateless: bool = False,
        sample_encoder: Optional[Callable[[Any], Any]] = None,
        sample_encoder_stateless: bool = False,
        packer_config: Any = None,
        pre_packer_failure_tolerance: int = 100,
        final_packer_failure_tolerance: int = 100,
        sample_encoder_failure_tolerance: int = 100,
        worker_config: Any = None,
    ):
        check_size("PackingDataset", "buffer_size", buffer_size)
        super().__init__(dataset, "PackingDataset")
        check_worker_config(self, worker_config)
        ignored("PackingDataset", final_packer_stateless=final_packer_stateless, sample_encoder_stateless=sample_encoder_stateless, packer_config=packer_config)
        self.buffer_size = self.group_size = buffer_size
        self.pre_packer, self.final_packer, self.sample_encoder = pre_packer, final_packer, sample_encoder
        self.tolerances = (pre_packer_failure_tolerance, final_packer_failure_tolerance, sample_encoder_failure_tolerance)

    def _maker(self, ctx: PassContext):
        pre = hook_runner(self, "pre_packer", self.pre_packer, self.tolerances[0])
        final = hook_runner(self, "final_packer", self.final_packer, self.tolerances[1])
        enc = None if self.sample_encoder is None else hook_runner(self, "sample_encoder", self.sample_encoder, self.tolerances[2])
        runs = [(pre.new_run(), final.new_run(), None if enc is None else enc.new_run()) for _ in range(self.num_workers)]

        def make(worker: int, buffer: List[Any]) -> List[Any]:
            r_pre, r_final, r_enc = runs[worker]
            where = f"worker stream {worker}"
            packs = hook_outputs(ctx, pre, r_pre, buffer, f"pre_packer on {len(buffer)} items of {where}", many=False)
            out: List[Any] = []
            for pack in packs[0] if packs else []:
                if enc is not None:
                    pack = [x for item in pack for x in hook_outputs(ctx, enc, r_enc, item, f"sample_encoder in {where}", many=False)]
                if pack:
                    out.extend(hook_outputs(ctx, final, r_final, list(pack), f"final_packer on a pack of {len(pack)} in {where}"))
            return out

        return make

    def __len__(self) -> int:
        return len(self.dataset)


class IterMapDataset(Wrapper):
    """Feeds each worker stream, as an iterator, to ``iter_map_fn`` and gives what it yields.

    Restore is exact: with ``stateless_iter_fn=True`` (outputs after an item depend only on that item
    and later ones) the item is pulled again and the outputs already given are dropped; otherwise
    the worker stream is mapped again from the start of the pass up to the saved point.
    Errors raised by ``iter_map_fn`` end the loader (Energon restarts the function and goes on).
    """

    def __init__(
        self,
        dataset: Composition,
        iter_map_fn: Callable[[Iterator[Any]], Iterator[Any]],
        *,
        len_map_fn: Callable[[int], int] = lambda n: n,
        stateless_iter_fn: bool = False,
        iter_map_fn_config: Any = None,
        worker_config: Any = None,
    ):
        super().__init__(dataset, "IterMapDataset")
        check_worker_config(self, worker_config)
        ignored("IterMapDataset", iter_map_fn_config=iter_map_fn_config)
        self.iter_map_fn = iter_map_fn
        self.len_map_fn = len_map_fn
        self.stateless_iter_fn = stateless_iter_fn

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        first = len(ctx.nodes)
        inner = self.dataset.provider(ctx, pass_index)
        gens: List[Optional[Iterator[Any]]] = [None] * self.num_workers
        # a restored worker starts its iter_map_fn afresh
        node = GroupNode(SubTree(ctx, first, ctx.leaf_indices(self.dataset)), self.num_workers, on_restore=lambda w: gens.__setitem__(w, None))
        ctx.register(node)

        def source(worker: int) -> Iterator[Any]:
            while True:
                if self.stateless_iter_fn:
                    node.begin(worker)
                item = inner(worker)
                if item is EXHAUSTED:
                    return
                yield item

        def next_item(worker: int) -> Any:
            if node.done[worker]:
                return EXHAUSTED
            if gens[worker] is None:
                if not self.stateless_iter_fn:
                    node.begin(worker)
                gens[worker] = iter(self.iter_map_fn(source(worker)))
            while True:
                try:
                    item = next(gens[worker])
                except StopIteration:
                    node.end(worker)
                    node.done[worker] = True
                    return EXHAUSTED
                node.gave(worker)
                if node.discard[worker]:
                    node.discard[worker] -= 1
                    continue
                return item

        return next_item

    def worker_items(self) -> List[int]:
        return [self.len_map_fn(n) for n in worker_items(self.dataset)]

    def __len__(self) -> int:
        return sum(self.worker_items())


class ShuffleBufferDataset(Wrapper):
    """Shuffles each worker stream through a buffer of ``size`` items: filled to ``size``, then a
    uniformly drawn item leaves per call (seeded by the worker seed and pass). The state is the draws
    taken and which of the recent pulls are still buffered (ranges of integers)."""

    def __init__(self, dataset: Composition, size: int, *, worker_config: Any = None):
        check_size("ShuffleBufferDataset", "size", size)
        super().__init__(dataset, "ShuffleBufferDataset")
        check_worker_config(self, worker_config)
        self.size = size

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        first = len(ctx.nodes)
        inner = self.dataset.provider(ctx, pass_index)
        workers = self.num_workers

        def fresh(worker: int) -> _Draws:
            return _Draws(self.worker_config.worker_seed(worker), pass_index, _SHUFFLE_SALT)

        draws = [fresh(w) for w in range(workers)]
        buffers: List[List[Tuple[int, Any]]] = [[] for _ in range(workers)]

        def set_extra(worker: int, extra: Dict[str, Any]) -> None:
            draws[worker] = fresh(worker)
            draws[worker].skip_to(int(extra["draws"]))
            buffers[worker].clear()

        node = LiveNode(SubTree(ctx, first, ctx.leaf_indices(self.dataset)), workers, lambda w: {"draws": draws[w].count}, set_extra)
        ctx.register(node)

        def add(worker: int, index: int, item: Any) -> None:
            buffers[worker].append((index, item))

        def next_item(worker: int) -> Any:
            if node.replay[worker] is not None:
                node.replay_into(worker, inner, EXHAUSTED, add)
            buf = buffers[worker]
            while len(buf) < self.size:
                index, item = node.pull(worker, inner, EXHAUSTED)
                if item is EXHAUSTED:
                    break
                buf.append((index, item))
            if not buf:
                return EXHAUSTED
            index, item = buf.pop(min(int(draws[worker].next() * len(buf)), len(buf) - 1))
            node.release(worker, index)
            return item

        return next_item


class _Bucket:
    def __init__(self, key: Hashable, batch_size: Optional[int]):
        self.key, self.batch_size = key, batch_size
        self.items: List[Tuple[int, Any]] = []


class GroupBatchDataset(Wrapper):
    """Batches items whose ``sample_group_key(item) -> (key, batch_size)`` agree: a bucket is batched
    by ``batcher`` when it holds its batch size (``fixed_batch_size`` if set, else the size the key
    function returns); at the end of a pass the partial buckets follow in the order their keys first
    appeared, unless ``drop_last``."""

    def __init__(
        self,
        dataset: Composition,
        fixed_batch_size: Optional[int],
        sample_group_key: Callable[[Any], Tuple[Hashable, Optional[int]]],
        batcher: Callable[[List[Any]], Any],
        *,
        batcher_stateless: bool = False,
        batcher_config: Any = None,
        drop_last: bool = False,
        failure_tolerance: int = 100,
        worker_config: Any = None,
    ):
        if fixed_batch_size is not None:
            check_size("GroupBatchDataset", "fixed_batch_size", fixed_batch_size)
        super().__init__(dataset, "GroupBatchDataset")
        check_worker_config(self, worker_config)
        ignored("GroupBatchDataset", batcher_stateless=batcher_stateless, batcher_config=batcher_config)
        self.fixed_batch_size = fixed_batch_size
        self.sample_group_key, self.batcher = sample_group_key, batcher
        self.drop_last, self.failure_tolerance = drop_last, failure_tolerance

    def _key(self, item: Any) -> Tuple[Hashable, int]:
        key, size = self.sample_group_key(item)
        if (size is None) == (self.fixed_batch_size is None):
            raise ValueError(
                f"GroupBatchDataset: sample_group_key gave batch size {size!r} for group {key!r} with fixed_batch_size="
                f"{self.fixed_batch_size!r}; exactly one of the two must be None"
            )
        return key, size if self.fixed_batch_size is None else self.fixed_batch_size

    def provider(self, ctx: PassContext, pass_index: int) -> Provider:
        first = len(ctx.nodes)
        inner = self.dataset.provider(ctx, pass_index)
        workers = self.num_workers
        # buckets by repr(key), in the order keys first appeared (placeholders after a restore)
        buckets: List[Dict[str, Optional[_Bucket]]] = [{} for _ in range(workers)]

        def set_extra(worker: int, extra: Dict[str, Any]) -> None:
            buckets[worker] = {name: None for name in extra["order"]}

        node = LiveNode(
            SubTree(ctx, first, ctx.leaf_indices(self.dataset)), workers, lambda w: {"order": list(buckets[w])}, set_extra
        )
        ctx.register(node)
        runner = hook_runner(self, "batcher", self.batcher, self.failure_tolerance)
        runs = [runner.new_run() for _ in range(workers)]

        def add(worker: int, index: int, item: Any) -> Optional[_Bucket]:
            key, size = self._key(item)
            name = repr(key)
            bucket = buckets[worker].get(name)
            if bucket is None:
                bucket = buckets[worker][name] = _Bucket(key, size)
            elif bucket.batch_size != size:
                raise ValueError(f"GroupBatchDataset: group {key!r} got batch size {size}, earlier {bucket.batch_size}")
            bucket.items.append((index, item))
            return bucket

        def flush(worker: int, bucket: _Bucket) -> List[Any]:
            taken, bucket.items = bucket.items, []
            for index, _ in taken:
                node.release(worker, index)
            items = [item for _, item in taken]
            return hook_outputs(ctx, runner, runs[worker], items, f"batcher on group {bucket.key!r} of worker stream {worker}", many=False)

        def next_item(worker: int) -> Any:
            if node.replay[worker] is not None:
                node.replay_into(worker, inner, EXHAUSTED, add)
            while True:
                index, item = node.pull(worker, inner, EXHAUSTED)
                if item is EXHAUSTED:
                    break
                bucket = add(worker, index, item)
                if len(bucket.items) >= bucket.batch_size:
                    out = flush(worker, bucket)
                    if out:
                        return out[0]
            for bucket in buckets[worker].values():
                if bucket is not None and bucket.items and not self.drop_last:
                    out = flush(worker, bucket)
                    if out:
                        return out[0]
            return EXHAUSTED

        return next_item

    def __len__(self) -> int:
        return len(self.dataset)
