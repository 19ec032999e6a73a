"""Sample packing inside a segment, with Energon's buffer semantics.

Fill a reading buffer to ``packing_buffer_size`` encoded samples; when no packs are pending, hand the
whole buffer to ``select_samples_to_pack`` (samples it does not select are dropped and empty groups
ignored, as in Energon); emit one ``pack_selected_samples`` per step (after ``postencode_sample`` on
the pack's members) and top the buffer up; at the end flush pending packs, then pack the partial
buffer. A dataset's segments are chained (``chained.chains_outputs``): each Ray task packs its
segment's outputs after the partial buffer the previous segment of its worker stream left
(``Packer.partial``), so buffers run across segments as in Energon's worker, and the hooks' counts
(``Packer.counts``), so they read Energon's indices and seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Dict, List, Optional, Tuple

from energon_ray.errors import FatalSampleError
from energon_ray.pipeline.policy import HookRunner, StageRun, item_key, next_seq
from energon_ray.task_encoder.base import TaskEncoder, is_overridden
from energon_ray.task_encoder.context import hook_call, set_batch_index
from energon_ray.task_encoder.decorators import get_failure_tolerance

Item = Tuple[int, int, Any]


#: first element of a pack's ``__restore_key__``: ``(PACKED, position, sub, *member restore keys)``
PACKED = "Packed"

#: first element of a tuple right after ``(PACKED, position, sub)`` where the packing hooks read
#: Energon's counts (``Packer.counts``): ``(PACK_MADE, pack call, packs before it, *postencode calls
#: of the members)``, which ``restore_sample`` reads the pack's hooks with again (a key without it:
#: every call read the first member's position)
PACK_MADE = "PackMade"


def _key(sample: Any) -> Any:
    key = item_key(sample)
    return "?" if key is None else key


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _listed(value: Any, what: str, expected: str) -> List[Any]:
    """What ``select_samples_to_pack`` returned where ``expected`` (a list) belongs, as a list.

    Raises:
        FatalSampleError: naming the hook's call and what it returned instead (``None``, a sample).
    """
    key = item_key(value)
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict)) and key is None:
        return list(value)
    got = f"a {type(value).__name__} ({key!r})" if key is not None else f"{_short(value)} ({type(value).__name__})"
    raise FatalSampleError(f"{what}: must return {expected}, got {got}")


def restore_key_of(sample: Any) -> Any:
    """A sample's (or batch's) ``__restore_key__``, whether it is an object or a dict."""
    return sample.get("__restore_key__") if isinstance(sample, dict) else getattr(sample, "__restore_key__", None)


def set_restore_key(pack: Any, key: tuple) -> None:
    """Set ``__restore_key__`` (a dict's item, an object's attribute, frozen or not; silently not on
    types without the attribute)."""
    if isinstance(pack, dict):
        pack["__restore_key__"] = key
        return
    try:
        object.__setattr__(pack, "__restore_key__", key)
    except (AttributeError, TypeError):  # a pack type without the attribute: no restore_sample for it
        pass


@dataclasses.dataclass
class EmptyRounds(StageRun):
    """Buffers in a row for which ``select_samples_to_pack`` gave no pack (Energon's pre-packer rounds).
    Not failures (nothing is counted or logged), but joined across a worker stream's segments like
    them (``FailureChain``), so a selection that never packs fails after ``tolerance`` + 1 buffers, as
    in Energon, even where each segment (or a blend's chunk) holds fewer buffers than that."""

    def empty(self, message: str, at: Optional[int] = None) -> None:
        seq = next_seq()
        self.trail += 1
        if not self.had_success:
            self.lead += 1
            if len(self.lead_at) <= self.tolerance:
                self.lead_at.append((seq, at, message))
        self.last_error = message
        if self.exceeded(self.trail):
            raise FatalSampleError(self.too_many(self.trail))

    def exceeded(self, count: int) -> bool:
        return bool(self.tolerance) and count > self.tolerance

    def too_many(self, count: int, where: str = "") -> str:
        return (
            f"select_samples_to_pack returned no packs for {count} buffers in a row{where} (failure_tolerance="
            f"{self.tolerance}; last: {self.last_error}); likely the packing code or the data is broken"
        )


class Packer:
    """Runs a task encoder's packing hooks over one segment's encoded samples.

    Where ``counts`` is given (a list the caller owns: a chained stream's ``Carry.counts``), the
    hooks read Energon's indices, counted on there: ``[select_samples_to_pack calls,
    postencode_sample calls, pack_selected_samples calls, packs given]`` of the worker stream so far;
    each call's ``current_sample_index`` (and a ``@stateless(restore_seeds=True)`` hook's seed) is
    its own hook's calls before it, ``current_batch_index`` the packs given before over the batch
    size (Energon's batch being filled, where each batch of packs is one batch). Without it
    (streams whose segments pack on their own, a blend's chunks, states saved before): ``batch_size``
    and ``before`` (the samples of the stream in the datasets before this one) give the hooks'
    ``current_batch_index``: their first sample's position over the batch size, as a sample hook's,
    and ``current_sample_index`` is that position. ``offsets`` (``id`` of an item given to the call →
    the samples of the stream before its dataset's, a packed validation metadataset's drawn
    samples): added to that item's position in both indices."""

    def __init__(self, te: TaskEncoder, buffer_size: int, handler: Any, batch_size: Optional[int] = None, before: int = 0,
                 offsets: Optional[Dict[int, int]] = None):  # fmt: skip
        self.te = te
        self.buffer_size = buffer_size
        self.per_batch = batch_size or 1
        self.before = before
        self.offsets = offsets or {}
        tol = te.__default_failure_tolerance__
        self.select = HookRunner("select_samples_to_pack", te.select_samples_to_pack, get_failure_tolerance(te.select_samples_to_pack, tol), handler)
        pack, post = te.pack_selected_samples, te.postencode_sample
        self.pack = HookRunner("pack_selected_samples", pack, get_failure_tolerance(pack, tol), handler, refuse_none=True)
        self.post = HookRunner("postencode_sample", post, get_failure_tolerance(post, tol), handler, refuse_none=True)
        self.do_post = is_overridden(te, "postencode_sample")
        self.tolerance = tol
        self.counts: Optional[List[int]] = None

    def _seeding(self, runner: HookRunner, kind: str, position: int, index: int) -> Tuple[Optional[str], int]:
        """``(kind, seed index)`` of a packing hook's call where Energon's counts are read: a hook
        marked ``@stateless(restore_seeds=True)`` gets Energon's seed, from its call count
        (``hook_seed``); others ours, from the position."""
        return (None, index) if getattr(runner.fn, "__restore_seeds__", False) else (kind, position)

    def _counted(self, runner: HookRunner, kind: str, position: int, slot: int) -> hook_call:
        """The ``hook_call`` of one counted call (``counts[slot]`` its index, counted on)."""
        counts = self.counts
        index = counts[slot]
        counts[slot] += 1
        return hook_call(self._seed, *self._seeding(runner, kind, position, index), sample_index=index,
                         batch_index=counts[3] // self.per_batch)  # fmt: skip

    def new_runs(self) -> List[StageRun]:
        empty = EmptyRounds(stage="select_samples_to_pack (no pack)", tolerance=self.tolerance)
        return [self.select.new_run(), self.post.new_run(), self.pack.new_run(), empty]

    def _batch_of(self, position: int, offset: int = 0) -> int:
        return (self.before + offset + position) // self.per_batch

    def _offset(self, entry: Item) -> int:
        return self.offsets.get(id(entry), 0)

    def _given(self, _: Any) -> None:
        """A generator ``pack_selected_samples`` gave an output: the next one is the next pack."""
        self.counts[3] += 1
        set_batch_index(self.counts[3] // self.per_batch)

    def _groups(self, buffer: List[Item], seed: int, runs: List[StageRun]) -> List[List[Item]]:
        samples = [item for _, _, item in buffer]
        by_id = {id(item): entry for entry, item in zip(buffer, samples)}
        what = f"select_samples_to_pack on {len(samples)} samples starting at {_key(samples[0])!r}"
        first, offset = buffer[0][0], self._offset(buffer[0])
        if self.counts is not None:
            call = self._counted(self.select, "pre_pack", first, 0)
        else:
            call = hook_call(seed, "pre_pack", first, sample_index=offset + first, batch_index=self._batch_of(first, offset))
        with call:
            groups = self.select.call(runs[0], samples, what, at=buffer[-1][0])
        if groups is HookRunner.FAILED or groups is HookRunner.IGNORED:
            return []
        out, seen = [], set()
        for group in _listed(groups, what, "a list of packs (each a list of samples from the buffer)"):
            group = _listed(group, what, "a pack (a list of samples from the buffer)")
            if not group:  # as Energon: an empty group is no pack (e.g. samples[1:3] of a short last buffer)
                continue
            entries = []
            for sample in group:
                if id(sample) not in by_id:
                    if item_key(sample) is None:  # an index, a string: no sample at all
                        raise FatalSampleError(
                            f"{what}: returned {_short(sample)} ({type(sample).__name__}), which is not a sample from "
                            "the buffer (return the samples themselves, not their indexes)"
                        )
                    raise FatalSampleError(f"{what}: returned sample {_key(sample)!r}, which is not from the buffer")
                if id(sample) in seen:
                    raise FatalSampleError(f"{what}: returned sample {_key(sample)!r} twice")
                seen.add(id(sample))
                entries.append(by_id[id(sample)])
            out.append(entries)
        return out

    def pack_group(
        self, group: List[Item], seed: int, runs: List[StageRun], at: Optional[Tuple[int, int]] = None,
        made: Optional[Tuple[int, ...]] = None,
    ) -> List[Item]:  # fmt: skip
        """The packs of one selected group: ``postencode_sample`` on its members, then
        ``pack_selected_samples``, as ``(position, sub, pack)`` items. ``at``: the group's first
        sample's ``(position, sub)``, where ``group`` holds only the members a pack's restore key
        names (those ``postencode_sample`` kept): its packs' positions and hook seeds stay the same;
        ``made``: that key's ``(pack call, packs before it, *postencode calls)`` (``PACK_MADE``), the
        indices its hooks read then, read again."""
        position, sub = at if at is not None else group[0][:2]
        if made is not None:
            self.counts = [0, 0, int(made[0]), int(made[1])]
        self._seed = seed
        counted = self.counts is not None
        offset = self._offset(group[0]) if group else 0
        members, keys_of_members, index = [], [], self._batch_of(position, offset)
        post_calls: List[int] = []
        for n, entry in enumerate(group):
            member_at, _, sample = entry
            key = restore_key_of(sample)
            if self.do_post:
                if made is not None and 2 + n < len(made):  # (a key's members all post-encoded)
                    self.counts[1] = int(made[2 + n])
                if counted:
                    post_at = self.counts[1]
                    call = self._counted(self.post, "postencode", member_at, 1)
                else:
                    call = hook_call(seed, "postencode", member_at, sample_index=self._offset(entry) + member_at, batch_index=index)
                with call:
                    sample = self.post.call(runs[1], sample, f"postencode_sample of {_key(sample)!r}", at=member_at)
                if sample is HookRunner.FAILED or sample is HookRunner.IGNORED:
                    continue
                if counted:
                    post_calls.append(post_at)
            members.append(sample)
            keys_of_members.append(key)
        if not members:
            if counted:  # Energon calls pack_selected_samples([]) here
                self.counts[2] += 1
            return []
        keys = [_key(m) for m in members]
        if counted:
            pack_call, before = self.counts[2], self.counts[3]
            call = self._counted(self.pack, "pack", position, 2)
        else:
            call = hook_call(seed, "pack", position, sample_index=offset + position, batch_index=index)
        with call:
            packs = self.pack.call_many(runs[2], members, f"pack_selected_samples of {keys}", at=position,
                                        after_each=self._given if counted else None)  # fmt: skip
        if counted:  # (the packs given: none where the call failed)
            self.counts[3] = before + (0 if packs is HookRunner.FAILED or packs is HookRunner.IGNORED else len(packs))
        if packs is HookRunner.FAILED or packs is HookRunner.IGNORED:
            return []
        # as Energon's: a pack's restore key names its members, those postencode_sample kept
        # (restore_sample packs them again), after the counts its hooks read (``PACK_MADE``)
        member_keys = tuple(keys_of_members)
        if counted:
            member_keys = ((PACK_MADE, pack_call, before, *post_calls),) + member_keys
        out = []
        for i, pack in enumerate(packs):
            set_restore_key(pack, (PACKED, position, sub * 1000 + i) + member_keys)
            out.append((position, sub * 1000 + i, pack))
        return out

    def __call__(
        self, encoded: List[Item], seed: int, runs: List[StageRun], final: bool = True, counts: Optional[List[int]] = None
    ) -> List[Item]:
        """Packs of one segment, as ``(position, sub, pack)`` items in emission order. ``final``: the
        worker stream ends here, the last, partial buffer is packed too; else it is left in
        ``partial`` (a chained segment hands it to the next one of its worker stream). ``counts``:
        the stream's hook counts so far, counted on (see the class)."""
        self.partial: List[Item] = []
        self.counts = counts
        self._seed = seed
        source = iter(encoded)
        reading: List[Item] = []
        pending: List[List[Item]] = []
        out: List[Item] = []

        def fill() -> bool:
            while len(reading) < self.buffer_size:
                try:
                    reading.append(next(source))
                except StopIteration:
                    return False
            return True

        while fill():
            if not pending:
                first, last = _key(reading[0][2]), reading[-1][0]
                pending, reading[:] = self._groups(list(reading), seed, runs), []
                if not pending:
                    runs[3].empty(f"no pack from the buffer starting at {first!r}", last)
                    continue
            runs[3].success()
            out += self.pack_group(pending.pop(0), seed, runs)
        while pending:
            out += self.pack_group(pending.pop(0), seed, runs)
        if reading and not final:
            self.partial = list(reading)
        elif reading:
            pending = self._groups(list(reading), seed, runs)
            while pending:
                out += self.pack_group(pending.pop(0), seed, runs)
        return out
