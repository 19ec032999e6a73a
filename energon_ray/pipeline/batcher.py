"""A group of samples made into batches (no Ray imports): ``Batcher`` runs the ``batch`` and
``encode_batch`` hooks on one group, with Energon's hook indices and seeds, and keys each batch it
makes (``BATCH``, ``BATCHED``; ``batch_counts.MADE``) so that ``restore_sample`` can make it again.
The stages that cut groups out of a stream are ``batch_stages`` (a segment's) and ``seam_stages``
(pooled samples).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Tuple

from energon_ray.pipeline.batch_counts import MADE, Made
from energon_ray.pipeline.packing import restore_key_of, set_restore_key
from energon_ray.pipeline.policy import HookRunner, StageRun
from energon_ray.pipeline.stages import _runner, _what
from energon_ray.task_encoder.base import TaskEncoder, is_overridden
from energon_ray.task_encoder.context import hook_call, set_batch_index


@dataclasses.dataclass
class _GroupCall:
    """One group's batch hook calls (``Batcher``): where the group is, its samples' keys, the runs,
    its counts and the batches made."""

    seed: int
    sub: int
    position: int
    what: str
    at: int  # the group's last sample's position (where a failure is placed)
    keys: Tuple[Any, ...]
    runs: List[StageRun]
    count: Made
    out: List[Any] = dataclasses.field(default_factory=list)


class Batcher:
    """Runs ``batch`` then ``encode_batch`` on exact groups of encoded samples (tasks and driver)."""

    def __init__(self, te: TaskEncoder, handler: Any, restore_rng: bool = False):
        self.te = te
        self.batch = _runner(te, "batch", "batch", handler)
        self.encode_batch = _runner(te, "encode_batch", "encode_batch", handler)
        self.do_encode_batch = is_overridden(te, "encode_batch")
        self.restore_rng = restore_rng

    def new_runs(self) -> List[StageRun]:
        return [self.batch.new_run(), self.encode_batch.new_run()]

    def __call__(
        self, group: List[Tuple[int, int, Any]], seed: int, batch_size: int, runs: List[StageRun],
        batch_index: Optional[int] = None, made: Optional[List[int]] = None,
    ) -> List[Any]:
        """``(position, sub, sample)`` group → the encoded batch(es) (0, 1 or more); ``batch_index``:
        the group's index in its worker stream (default: its first sample's position over the size).

        ``made``: ``[outputs of batch, batches]`` the worker stream made before the group, counted on
        here (``Made``): as in Energon, ``batch`` reads the group's index as ``current_sample_index``
        and the batches given before as ``current_batch_index`` (one more per batch given, also between
        a generator's outputs), ``encode_batch`` the outputs of ``batch`` before it and the batches
        given. ``None``: every hook call reads the group's index (a stream whose batches are not
        counted: each segment batches its own samples, or a key from before these were counted)."""
        position, sub = group[0][0], group[0][1]
        samples = [item for _, _, item in group]
        what = f"batch of {len(samples)} starting at {_what(samples[0])}"
        index = position // batch_size if batch_index is None else batch_index
        call = _GroupCall(seed, sub, position, what, group[-1][0], tuple(restore_key_of(s) for s in samples), runs, Made(index, made))
        done: List[Any] = []  # outputs of batch encode_batch has run on

        def each(item: Any) -> None:  # a generator's output, encoded (and given) before it resumes
            self._encode(call, item, len(done), several=True)
            done.append(item)
            set_batch_index(call.count.batches)

        # as Energon counts them, a batch hook's current_sample_index is its call's: the group's index
        with hook_call(seed, *self._seeding(self.batch, f"batch.{sub}", position, index), sample_index=index,
                       batch_index=call.count.batches, restore_rng=self.restore_rng):  # fmt: skip
            raws = self.batch.call_many(runs[0], samples, what, at=call.at, after_each=each)
        if raws is HookRunner.FAILED or raws is HookRunner.IGNORED:
            return call.out
        for item in raws[len(done) :]:
            self._encode(call, item, len(done), several=_several(self.batch, raws))
            done.append(item)
        return call.out

    def _encode(self, call: "_GroupCall", item: Any, i: int, several: bool) -> None:
        """Output ``i`` of ``batch`` (one of ``several``), keyed, through ``encode_batch`` (if
        overridden) into ``call.out``, counted on in ``call.count``."""
        count, index = call.count, call.count.index
        made = count.key(several or self.encode_batch.is_generator)
        _key_batch(item, call.keys, index, (i, 0) if several else None, made)
        if not self.do_encode_batch:
            call.out.append(item)
            count.encoded()
            count.given(1)
            return
        # inside a generator batch, its RNG state is kept for it
        with hook_call(call.seed, *self._seeding(self.encode_batch, f"encode_batch.{call.sub}.{i}", call.position, count.outputs),
                       sample_index=count.outputs, batch_index=count.batches,
                       restore_rng=self.restore_rng or self.batch.is_generator):  # fmt: skip
            results = self.encode_batch.call_many(call.runs[1], item, call.what, at=call.at)
        count.encoded()
        if results is HookRunner.FAILED or results is HookRunner.IGNORED:
            return
        if several or _several(self.encode_batch, results):
            for j, result in enumerate(results):
                _key_batch(result, call.keys, index, (i, j), made)
        call.out.extend(results)
        count.given(len(results))

    @staticmethod
    def _seeding(runner: HookRunner, kind: str, position: int, index: int) -> Tuple[Optional[str], int]:
        """``(kind, seed index)`` of a batch hook's call: a hook marked ``@stateless(restore_seeds=True)``
        gets Energon's seed, from the batch index (``hook_seed``); others ours, from the position."""
        return (None, index) if getattr(runner.fn, "__restore_seeds__", False) else (kind, position)

    def with_positions(
        self, group: List[Tuple[int, int, Any]], seed: int, batch_size: int, runs: List[StageRun],
        batch_index: Optional[int] = None, counts: Optional[List[int]] = None,
    ) -> List[Tuple[Any, List[int]]]:
        """``__call__``'s batches, the last one carrying the group's positions (the group is consumed
        when its last batch is)."""
        made = self(group, seed, batch_size, runs, batch_index, counts)
        positions = [position for position, _, _ in group]
        return [(item, positions if i == len(made) - 1 else []) for i, item in enumerate(made)]


#: first element of the ``__restore_key__`` the loader gives a batch: ``(BATCH, batch index, *key)``
#: (Energon's ``("BatchDataset", batch index, *the samples' keys)``), where ``key`` is the samples'
#: keys or, for one of several outputs, ``(BATCHED, i, j, *the samples' keys)``; ``restore_sample``
#: makes the batch again with that index (after skipped samples, packs or groups it is not the first
#: sample's position over the batch size)
BATCH = "Batch"

#: first element of the key (after ``(BATCH, batch index)``) of a batch that a ``batch`` (or
#: ``encode_batch``) hook made among others from one group of samples (a generator):
#: ``(BATCHED, i, j, *the samples' keys)``, output ``j`` of ``encode_batch`` on output ``i`` of
#: ``batch`` (``j`` is 0 without ``encode_batch``)
BATCHED = "Batched"


def _several(runner: HookRunner, outputs: List[Any]) -> bool:
    """Whether a batch hook's outputs need keys naming which output each is: a generator function
    (however many it yielded, as Energon keys them) or a hook that gave more than one."""
    return runner.is_generator or len(outputs) > 1


def _key_batch(
    batch: Any, keys: Tuple[Any, ...], index: int, output: Optional[Tuple[int, int]] = None, made: Optional[Tuple[int, int]] = None
) -> None:
    """Give a batch that has a ``__restore_key__`` (an attribute, or a dict's item) its index and its
    samples' keys (``BATCH``), whatever the ``batch`` hook put there, as Energon's batching does
    (``restore_sample`` reads them); ``output``: ``(i, j)`` of an output of generator hooks, put
    before the samples' keys (``BATCHED``); ``made``: the stream's counts before the group, put
    right before the samples' keys (``MADE``). Samples without keys leave it as the hook made it."""
    has_key = "__restore_key__" in batch if isinstance(batch, dict) else hasattr(batch, "__restore_key__")
    if has_key and keys and all(key is not None for key in keys):
        rest = keys if made is None else (MADE, *made, *keys)
        set_restore_key(batch, (BATCH, int(index), *(rest if output is None else (BATCHED, *output, *rest))))
