"""``get_loader``: iterate a dataset (or a blend, mix, concatenation of datasets) into training.

Each leaf dataset is its own stream of segments, all executed by one stream of Ray tasks per pass
(or one Ray Data execution per window: ``MultiFeed``); the composition's provider decides which
stream gives each worker's next item; ``round_robin`` interleaves the workers like a torch
``DataLoader`` does. Nothing about the order depends on Ray's scheduling.
Saving and restoring the loader is ``loader.loader_saving``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import weakref
from typing import Any, Dict, Iterator, Optional

import torch

from energon_ray.blend.base import Composition, PassContext
from energon_ray.loader.elastic import Redistribution
from energon_ray.loader.feed import MultiFeed, check_executor
from energon_ray.loader.handout import handed_out
from energon_ray.loader.options import check_object_store_limit, check_pin_memory, check_prefetch_batches
from energon_ray.loader.round_robin import RoundRobin
from energon_ray.loader.stats import LoaderStats
from energon_ray.loader.passes import check_something_to_repeat, repeats_passes
from energon_ray.loader.loader_saving import LoaderSaving
from energon_ray.loader.savable import PassRun, starts_of
from energon_ray.errors import log_exception
from energon_ray.loader.state import LoaderState
from energon_ray.pipeline.remote_args import check_remote_args, task_needs, waits_holding_cpus_only
from energon_ray.ray_env import check_resources, ensure_ray, warm_up

#: Bytes of finished blocks one execution may hold in the object store ahead of the trainer.
DEFAULT_OBJECT_STORE_LIMIT = 1 << 30

#: What ``ray_stats()`` says while no execution has stats (Ray Data's come once an execution has ended).
NO_PASS_YET = "no pass has run yet: iterate the loader, then ray_stats() reports its Ray execution"


class EnergonLoader(LoaderSaving):
    """Iterates the batches of a dataset or composition (what ``get_loader`` returns).

    Args:
        dataset: from ``get_train_dataset`` / ``get_val_dataset``, or a ``BlendDataset``,
            ``ConcatDataset``, ``MixBatchDataset``, ``EpochizeDataset``, ``MapDataset`` of them.
        prefetch_batches: with ``executor="ray_data"``, the feeder's blocks requested ahead of the loop
            (the tasks executor keeps one task per CPU slot running and as many queued).
        ray_remote_args: resources per segment task, e.g. ``{"num_cpus": 1}``.
        pin_memory: pin batches (default: when CUDA is available).
        object_store_limit: bytes of finished blocks Ray may hold ahead of the trainer (bounds memory).
        executor: ``"tasks"`` (default; ``$ENERGON_RAY_EXECUTOR`` if set): segments run as plain Ray
            tasks submitted by this process; ``"ray_data"``: as Ray Data executions in a feeder actor
            (``ray_stats()`` then gives Ray Data's per-operator stats). Same batches either way.
    """

    def __init__(
        self,
        dataset: Composition,
        *,
        prefetch_batches: int = 4,
        ray_remote_args: Optional[dict] = None,
        pin_memory: Optional[bool] = None,
        object_store_limit: Optional[int] = DEFAULT_OBJECT_STORE_LIMIT,
        executor: Optional[str] = None,
    ):
        if not isinstance(dataset, Composition):
            raise TypeError(
                "get_loader expects the result of get_train_dataset/get_val_dataset (or a blend of them), "
                f"got {type(dataset).__name__}"
            )
        pin_memory = check_pin_memory(pin_memory)
        if pin_memory and not torch.cuda.is_available():
            raise ValueError(
                "pin_memory=True needs CUDA, and this torch has no CUDA device; leave it unset to pin only when CUDA is available"
            )
        self.dataset = dataset
        self.prefetch_batches = check_prefetch_batches(prefetch_batches)
        self.ray_remote_args = check_remote_args(ray_remote_args)
        self.pin = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        self.stats = LoaderStats()
        handler = getattr(dataset.worker_config, "global_error_handler", log_exception)
        self.stats.error_handler = None if handler is log_exception else handler  # see policy.DeferredHandler
        self._passes = 0
        self._stream: Optional[Iterator[Any]] = None
        #: the pass being iterated (what a save reads), a state waiting for the next iter(), items of
        #: the current iter() of an epochized loader
        self._live: Optional[PassRun] = None
        self._restore: Optional[LoaderState] = None
        #: a pass whose streams start with another world size's unfinished epoch (see loader.elastic)
        self._redist: Optional[Redistribution] = None
        self._epoch_items = 0
        #: the iter() of an epochized loader counting ``_epoch_items`` (an older one, closed, leaves it)
        self._epoch_iter: Optional[object] = None
        self._started = False
        #: restores so far: an iterator opened before the latest one refuses to go on (``_check_restores``)
        self._restores = 0
        self._executions: Dict[str, Any] = {}
        self.object_store_limit = check_object_store_limit(object_store_limit)
        self.executor = check_executor(executor)
        leaves = dataset.leaves()
        if len({id(leaf) for leaf in leaves}) != len(leaves):
            raise ValueError("a dataset object appears twice in this composition; build each source separately")
        self._training = any(leaf.options.training for leaf in leaves)
        for leaf in leaves:  # Ray Data's operators, or a task that may not wait for its carry: no chained batches
            leaf.batch_in_segments(self.executor == "ray_data" or not waits_holding_cpus_only(self.ray_remote_args))
            leaf.run_as_tasks(self.executor == "tasks", len(leaves) > 1)
        ensure_ray()
        check_resources(task_needs(self.ray_remote_args), "ray_remote_args: a segment task")
        warm_up()  # the workers' imports (torch, the stages): the first batch's critical path
        self._early: Optional[MultiFeed] = None
        # The first pass starts now, while the caller builds its model: by the first next() the
        # feeder's Ray Data execution (opt-in: plain Ray tasks first) is under way.
        self._early = self._multi_feed(0)
        self._early.start()
        weakref.finalize(self, self._early.close)
        # Close a suspended endless stream before Ray shuts down at exit (Ray's own atexit hook runs
        # after ours, since ours is registered later), instead of letting Ray complain at teardown.
        atexit.register(_close_loader, weakref.ref(self))

    # -- public --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[Any]:
        check_something_to_repeat(self.dataset)
        epoch_len = self.dataset.virtual_epoch_length()
        if epoch_len or self.dataset.is_endless() or repeats_passes(self.dataset):
            return self._continue(epoch_len or None, self._restores)
        return self._pass(self._restores)

    def _check_restores(self, restores: int) -> None:
        """An iterator opened before a restore would go on with its old pass (or take the restored
        items from the new ``iter()`` of an endless loader): it raises instead."""
        if restores != self._restores:
            raise RuntimeError(
                "this iterator was opened before the loader was restored (restore_state_rank/restore_state_global); "
                "call iter(loader) again to continue from the restored state"
            )

    def _pass(self, restores: int) -> Iterator[Any]:
        self._check_restores(restores)
        restore, self._restore = self._restore, None
        self._started = True
        if restore is not None and restore.pass_index is not None:
            items = self._one_pass(restore.pass_index, restore)
        else:
            items = self._one_pass(self._next_pass())
        with contextlib.closing(items):
            for item in items:
                yield item
                self._check_restores(restores)

    def _continue(self, count: Optional[int], restores: int) -> Iterator[Any]:
        """``count`` (``None``: all) items of the loader's one endless stream. The stream outlives
        this iterator: a ``break`` or an abandoned ``iter()`` leaves it where it was, and the next
        ``iter()`` continues from there (as Energon's loaders do). ``next()`` rather than ``yield
        from``, which would close the shared stream along with this iterator. An exception out of
        the stream (a fatal sample error, Ctrl-C while waiting for a batch) ends it: it is raised,
        and the next ``iter()`` continues after the last item handed out, as from a saved state."""
        self._check_restores(restores)
        produced = 0
        if self._restore is not None and count is not None:  # the restored iter() ends its epoch
            produced = self._restore.epoch_items
            self._restore = dataclasses.replace(self._restore, epoch_items=0)
        self._epoch_items = produced
        self._started = True
        self._epoch_iter = token = object()
        while count is None or produced < count:
            self._check_restores(restores)
            if self._stream is None:
                self._stream = self._forever()
            try:
                item = next(self._stream)
            except StopIteration:
                self._stream = None
                self._epoch_items = 0
                return
            except BaseException:  # _one_pass left where it stood in _restore: the next iter() goes on there
                self._stream = None  # finished by the exception: its next next() would end the loop
                raise
            produced += 1
            self._epoch_items = produced
            try:
                yield item
            except GeneratorExit:
                # a break (or the iterator dropped): the next iter() starts a new epoch, so a state
                # saved from now on must say so too (unless a later iter() took over)
                if self._epoch_iter is token:
                    self._epoch_items = 0
                raise
        self._epoch_items = 0  # this iter() is over: the next one starts a new epoch

    def close(self) -> None:
        """Stop a running endless stream and release its Ray executions."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        early, self._early = self._early, None
        if early is not None:
            early.close()
        live, self._live = self._live, None
        if live is not None:
            live.multi.close()

    def ray_stats(self) -> str:
        """The latest execution's stats: its segment tasks' (count, bytes, time waited for blocks),
        or with ``executor="ray_data"`` Ray Data's per-operator stats (throughput per stage), which
        Ray Data gives once an execution has ended; before that, a sentence saying no pass has run
        (not an empty line under ``print``)."""
        reports = [text for text in (stream.stats() for stream in self._executions.values()) if text]
        return "\n".join(reports) if reports else NO_PASS_YET

    # -- internals -----------------------------------------------------------------------------
    def _next_pass(self) -> int:
        """The index of a pass that starts afresh. A restored redistribution is over: it shared out
        the rest of the pass it was saved in, and a validation loader's passes all have index 0."""
        index = self._passes if self._training else 0
        self._passes += 1
        self._redist = None
        return index

    def _forever(self) -> Iterator[Any]:
        restore, self._restore = self._restore, None
        while True:
            produced = False
            restored = restore is not None and restore.pass_index is not None
            if restored:
                items = self._one_pass(restore.pass_index, restore, endless=True)
            else:
                items = self._one_pass(self._next_pass(), endless=True)
            restore = None
            for item in items:
                produced = True
                yield item
            if not produced and not restored:  # a pass restored at its very end gives nothing; the next goes on
                return

    def _remember(self, leaf_name: str):
        # a weak reference: a feed (kept by the close-at-collection finalizer) must not keep its loader alive
        loader_ref = weakref.ref(self)

        def on_execute(stream) -> None:
            loader = loader_ref()
            if loader is not None:
                loader._executions.pop(leaf_name, None)
                loader._executions[leaf_name] = stream

        return on_execute

    def _multi_feed(self, pass_index: int, restore: Optional[LoaderState] = None) -> MultiFeed:
        early, self._early = self._early, None
        if early is not None:
            if early.pass_index == pass_index and early.restored is restore:
                return early
            early.close()
        leaves = self.dataset.leaves()
        shares = self.dataset.leaf_shares()
        hints = self.dataset.schedule_hints(pass_index)
        return MultiFeed(
            leaves,
            [shares[id(leaf)] for leaf in leaves],
            pass_index,
            needs=[hints.get(id(leaf)) for leaf in leaves],
            pin=self.pin,
            stats=self.stats,
            prefetch_batches=self.prefetch_batches,
            ray_remote_args=self.ray_remote_args,
            object_store_limit=self.object_store_limit,
            executor=self.executor,
            on_execute=self._remember("all"),
            starts=starts_of(restore),
            restored=restore,
            plan_for=self._redist.plan if self._redist is not None and self._redist.pass_index == pass_index else None,
        )

    def _one_pass(self, pass_index: int, restore: Optional[LoaderState] = None, endless: bool = False) -> Iterator[Any]:
        multi = self._multi_feed(pass_index, restore)
        feeds = {id(leaf): feed for leaf, feed in zip(multi.leaves, multi.feeds)}
        ctx = PassContext(feeds, self.stats)
        provider = self.dataset.provider(ctx, pass_index)
        run = PassRun(pass_index, multi, ctx, RoundRobin(self.dataset.num_workers, provider, caps=self.dataset.caps(), stats=self.stats))
        read_before, yielded = self.stats.samples_read, 0
        # items the pass gave before the state restored here was saved (a pass restored at its end
        # re-reads what the state pooled, gives nothing, and did give batches: no warning then)
        given_before = sum(restore.round_robin.emitted) if restore is not None and restore.round_robin is not None else 0
        try:
            if restore is not None and restore.streams:
                run.restore(restore)
            elif restore is not None and restore.round_robin is not None:  # a rebatched pass: its worker next
                run.round_robin.restore(restore.round_robin)
            self._live = run
            for item in run.round_robin:
                yielded += 1
                yield handed_out(item, self.pin)
            if not yielded and not given_before and self.stats.samples_read > read_before:
                self.stats.warn_no_batch(pass_index, self.stats.samples_read - read_before)
        except GeneratorExit:
            raise
        except BaseException:
            if endless and self._live is run:
                self._restore = self._state_at_failure()
            raise
        finally:
            multi.close()
            if self._live is run:
                self._live = None


def _close_loader(ref: "weakref.ref[EnergonLoader]") -> None:
    loader = ref()
    if loader is not None:
        try:
            loader.close()
        except Exception:  # interpreter shutdown: nothing useful left to report
            pass
