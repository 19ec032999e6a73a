"""Chained segments: a worker stream batched (or packed) as one stream across its segments.

Where a worker stream's batches start inside a segment, and which batch an output goes into
(``current_batch_index``), depend on every output before it when a sample may give any number of
outputs (a generator ``encode_sample``); where its packing buffers start, on every output before
it whenever samples may be skipped. Such a dataset's segments are chained: each takes the previous
segment's ``Carry`` (the stream's outputs so far and those of the batch, or packing buffer, still
open) and hands on its own, so a stream's segments run one after another
(``build._chained_segment_task``; a packed stream's segments are read and encoded side by side and
only pack one after another: ``encodes_without_carry``); the stages themselves (``stages``, ``batch_stages``) read
``SegmentData.carry`` to count outputs and open the first batch or buffer. No Ray imports.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import pyarrow as pa

from energon_ray.errors import FatalSampleError
from energon_ray.pipeline import rows
from energon_ray.pipeline.packing import restore_key_of, set_restore_key
from energon_ray.task_encoder.base import TaskEncoder, hook_reads, is_overridden, own_hook, sample_encode_hook
from energon_ray.task_encoder.context import worker_slot

if TYPE_CHECKING:
    from energon_ray.pipeline.stages import StageConfig


def chains_outputs(
    te: TaskEncoder, batch_size: Optional[int], packing: bool, across_sources: bool, chain_packs: bool = True,
    chain_batches: bool = True, chain_unbatched: bool = True, sample_hooks: bool = True,
) -> bool:
    """Whether a dataset's segments must be chained.

    Its ``encode_sample`` is a generator (any number of outputs per sample), so where the worker
    stream's batches start in a segment, and which batch an output goes into
    (``current_batch_index``), depend on the outputs of every segment before it. Energon batches a
    worker's outputs as one stream; a chained stream does the same, one segment after another per
    worker (the rank's worker streams still run side by side). Also where ``batch`` or
    ``encode_batch`` is marked ``@stateless(restore_seeds=True)``: its seed is Energon's batch
    count, which samples skipped in earlier segments lower; and where a sample hook reads such an
    index (``reads_shifted_indices``; ``sample_hooks``, off for states saved before). Not where
    the segments do not batch their own samples (grouping, batching across datasets, no batching; ``postencode_sample`` runs in
    the encode stage, on each output as it is made). An
    ``encode_sample`` that is a plain function returning a generator is not detected (a generator
    function is: ``yield`` in its body).

    Other batched streams too (``chain_batches``): a sample skipped (an error under a skip policy,
    ``SkipSample``, a cooker's ``None``) shifts every later batch of Energon's worker stream, so a
    segment's batches start where the outputs of the segments before it end. Their segments encode
    side by side and batch one after another (``encodes_without_carry``). ``chain_batches`` is off
    where a waiting task would hold more than CPUs, under ``executor="ray_data"`` and for states
    saved before (``savable.adopt_pack_batching``): each segment then batches its own samples and
    the trainer's pool the rest, the same batches wherever nothing is skipped.

    With packing (``chain_packs``; not across datasets): always. Energon's packing buffers are
    consecutive runs of ``packing_buffer_size`` outputs of the worker stream, so where they start in
    a segment depends on every output before it (samples skipped before packing, a generator
    ``encode_sample``): each segment gets the outputs of the buffer still open (``Carry.tail``).

    Unbatched (``chain_unbatched``; off for states saved before, ``savable.adopt_pack_batching``): a
    generator ``encode_sample``'s stream, or one whose sample hooks read shifted indices, as
    Energon's hooks read the worker's outputs given before (``current_batch_index``) and
    ``postencode_sample`` the outputs made before (``current_sample_index``): each segment counts on from the previous one's ``Carry.counts``."""
    if packing:
        return chain_packs and not across_sources
    if batch_size is None:
        return (
            chain_unbatched and not across_sources
            and (is_generator_encoder(te) or (sample_hooks and reads_shifted_indices(te)))
            and not is_overridden(te, "batch_group_criterion")
        )  # fmt: skip
    return (
        batch_size is not None
        and not across_sources
        and (chain_batches or counts_outputs(te, sample_hooks))
        and not is_overridden(te, "batch_group_criterion")
    )


def counts_outputs(te: TaskEncoder, sample_hooks: bool = True) -> bool:
    """Whether a chained (unpacked) stream's encode stage counts the stream's outputs: a generator
    ``encode_sample`` (a sample's outputs may straddle batches), a ``restore_seeds`` batch hook
    (seeded by the batch count) or, with ``sample_hooks`` (off for states saved before:
    ``savable.adopt_pack_batching``), a sample hook that reads what skipped samples shift
    (``reads_shifted_indices``). Their outputs' restore keys name their index in the stream
    (``chain_restore_key``) and each segment encodes once the previous one's carry has come."""
    return is_generator_encoder(te) or _restore_seeded_batch_hook(te) or (sample_hooks and reads_shifted_indices(te))


def reads_shifted_indices(te: TaskEncoder) -> bool:
    """Whether a sample hook reads an index that samples skipped before it shift (Energon counts them
    as its worker stream went): ``encode_sample``'s or ``cook_crude_sample``'s
    ``current_batch_index`` (the batches given before), ``postencode_sample``'s ``current_batch_index`` or ``current_sample_index`` (the outputs
    of ``encode_sample`` before it), or a ``postencode_sample`` marked ``restore_seeds`` (seeded by
    that index). Read in the hook's code (``hook_reads``); a segment cannot know them until the
    segments before it have encoded, so such a stream's segments encode one after another."""
    post = "postencode_sample"
    if is_overridden(te, post) and (
        getattr(own_hook(te, post), "__restore_seeds__", False) or hook_reads(te, post, _POST_INDICES)
    ):
        return True
    return any(is_overridden(te, hook) and hook_reads(te, hook, _BATCH_INDEX) for hook in (sample_encode_hook(te), "cook_crude_sample"))


_BATCH_INDEX = frozenset({"current_batch_index"})
_POST_INDICES = frozenset({"current_batch_index", "current_sample_index"})


def is_generator_encoder(te: TaskEncoder) -> bool:
    """Whether the sample encode hook is a generator function (any number of outputs per sample)."""
    hook = sample_encode_hook(te)
    return is_overridden(te, hook) and inspect.isgeneratorfunction(inspect.unwrap(own_hook(te, hook)))


def chain_unit(config: "StageConfig") -> int:
    """What a chained stream's carry holds the open one of: a packing buffer, else a batch (outputs)."""
    return int(config.packing_buffer_size or config.batch_size or 1)


def _restore_seeded_batch_hook(te: TaskEncoder) -> bool:
    """A ``batch``/``encode_batch`` marked ``@stateless(restore_seeds=True)``: its seed is Energon's
    batch count, which samples skipped in the segments before a batch lower (only a chained stream
    counts them)."""
    return any(getattr(own_hook(te, name), "__restore_seeds__", False) for name in ("batch", "encode_batch"))


@dataclasses.dataclass
class Carry:
    """What a chained segment hands the next segment of its worker stream.

    ``outputs``: encoded samples of the worker stream before the next segment; ``tail``: the last
    ``outputs % batch_size`` of them (``% packing_buffer_size`` where packs are chained:
    ``chain_unit``), ``(position, sub, sample)``, which open the next segment's first batch or
    buffer (``None``: not known, a replay that only rebuilds the carry, see ``TaskStream``).
    """

    outputs: int
    tail: Optional[List[Tuple[int, int, Any]]] = None
    #: a ``restore_sample`` re-read of single samples: the stream's outputs before each position
    bases: Optional[Dict[int, int]] = None
    #: ... of an unbatched stream: the outputs given before each position (``bases``: made before)
    given_bases: Optional[Dict[int, int]] = None
    #: batches: ``(outputs of batch, batches given)`` of the worker stream before the next segment
    #: (``batch_counts.Made``); ``None``: one each per whole batch of outputs (a stream's start, or a
    #: state saved before they were counted). Unbatched: ``(outputs of encode_sample, outputs given)``
    #: (``postencode_sample`` may drop some; ``None``: both ``outputs``). Packs: ``(select_samples_to_pack calls,
    #: postencode_sample calls, pack_selected_samples calls, packs given)`` (``packing.Packer``);
    #: ``None``: zeros at the stream's start, else the hooks read positions (a state saved before)
    counts: Optional[Tuple[int, ...]] = None


def chain_restore_key(output: Any, key: Any, sub: int, index: int, given: Optional[int] = None) -> None:
    """A chained stream's output keeps its sample's restore key plus which output it is: ``sub``
    (of its sample) and ``index`` (in its worker stream), so ``restore_sample`` can rebuild its batch
    (an output whose encoder set a key of its own keeps that); unbatched, also ``given``: the
    stream's outputs given before the sample's first (``GivenCount``)."""
    if not isinstance(key, tuple) or len(key) != 6 or key[0] != "Webdataset" or restore_key_of(output) != key:
        return
    set_restore_key(output, key + ((sub, index) if given is None else (sub, index, given)))


def sub_restore_key(output: Any, key: Any, sub: int) -> None:
    """An output of a generator ``encode_sample`` in a stream that is not chained keeps its sample's
    restore key plus ``sub`` (which of the sample's outputs it is), so ``restore_sample`` rebuilds a
    batch, pack or blend batch with that very output, not the sample's first (an output whose encoder
    set a key of its own keeps that)."""
    if not isinstance(key, tuple) or len(key) != 6 or key[0] != "Webdataset" or restore_key_of(output) != key:
        return
    set_restore_key(output, key + (sub,))


def encodes_without_carry(config: StageConfig) -> bool:
    """Whether a chained segment encodes its samples without the previous segment's carry: where
    packs are chained, or batches are and the encode stage counts no outputs (``counts_outputs``; a
    sample hook's batch index is then the sample's position over the batch size), only packing or
    batching reads the carry, so a segment is read and encoded while the one before it still runs
    and waits for the carry only to pack or batch (``chained_segment``)."""
    return bool(config.packing_buffer_size) or not config.counts_outputs


def groups_segments(config: StageConfig, segment_batches: bool, several: bool) -> bool:
    """Whether the loader's tasks may run several of a leaf's segments each (``TaskStream``'s
    groups, ``groups.group_block``): an unchained leaf's, and in a composition of ``several``
    leaves a chained one's of plain batches that encode without their carry and wait for it only to
    batch (not where each segment batches its own samples, ``segment_batches``: the tasks may not
    wait holding their CPUs).

    Not a single chained leaf's: a group's segments of a worker stream wait for the carry of its
    segment in the group before (running beside it), so a task holds its encoded samples until
    then, as much as the trainer held of the worker streams' partly taken blocks (measured at 2
    workers: +100 MiB)."""
    if not config.chained:
        return True
    return (
        several and not segment_batches and config.batch_size is not None and not config.packing_buffer_size
        and not config.batch_across_sources and encodes_without_carry(config)
    )  # fmt: skip


def chained_segment(
    data: rows.SegmentData, config: Union[StageConfig, Mapping[int, StageConfig]],
    carry: Any, carry_only: bool = False, node: Optional[str] = None,
) -> Tuple[Optional[pa.Table], Optional[Carry]]:
    """A segment of a chained stream (``StageConfig.chained``), read into ``data``: its output block
    and the ``Carry`` for the next segment. ``carry``: the previous segment's (its tail opens this
    segment's first batch; ``None``: the stream failed or closed before, nothing is made), or a
    ``build.LaterCarry`` (``ready()``, ``wait()``), waited for once the samples are encoded (only
    where ``encodes_without_carry``; plain batches are made as soon as it has come). ``carry_only``: only the carry is wanted (a restore rebuilding it
    from ``carry.outputs``; no batches): the segment's outputs must cover the tail it hands on."""
    if hasattr(carry, "wait"):
        return _encode_then_chain(data, config, carry, carry_only, node)
    if carry is None:
        return None, None
    from energon_ray.pipeline.batch_stages import EncodeAndBatch
    from energon_ray.pipeline.stages import output_table

    stage = EncodeAndBatch(config)
    stage.batch.node = node
    data.carry = carry
    if carry_only:
        stage.encode.encode(data)
        return None, _carry_on(data, carry, stage.encode.configs[data.spec.source])
    data.encoded = list(carry.tail or ())
    eager = stage.batch.eager(data)
    if eager is not None:
        eager.chain_from(carry)
    stage.encode.encode(data, eager)
    out = list(stage.batch.explode(data, eager))
    return output_table(out, data.spec.source), data.carry_out


def _encode_then_chain(
    data: rows.SegmentData, config: Union[StageConfig, Mapping[int, StageConfig]], later: Any, carry_only: bool,
    node: Optional[str],
) -> Tuple[Optional[pa.Table], Optional[Carry]]:
    """``chained_segment`` with its samples encoded before the carry is waited for: the same block
    and carry (the encode stage reads no carry where ``encodes_without_carry``)."""
    from energon_ray.pipeline.batch_stages import EncodeAndBatch
    from energon_ray.pipeline.stages import output_table

    stage = EncodeAndBatch(config)
    cfg = stage.encode.configs[data.spec.source]
    if not encodes_without_carry(cfg):
        raise RuntimeError(f"energon_ray: worker {data.spec.worker}'s segment {data.spec.index} needs its carry before it encodes")
    stage.batch.node = node
    if not (carry_only or cfg.packing_buffer_size):
        return _batch_when_carried(stage, data, later)
    stage.encode.encode(data)
    carry = later.wait()
    if carry is None:  # the stream failed or closed before this segment
        return None, None
    data.carry = carry
    if carry_only:
        return None, _carry_on(data, carry, cfg)
    data.encoded = list(carry.tail or ()) + data.encoded
    out = list(stage.batch.explode(data))
    return output_table(out, data.spec.source), data.carry_out


def _batch_when_carried(stage: Any, data: rows.SegmentData, later: Any) -> Tuple[Optional[pa.Table], Optional[Carry]]:
    """A chained segment of plain batches, encoded before its carry has come: the samples are held
    until it comes (looked for while encoding, waited for after), then batched as they are encoded
    (``EagerBatches``): the block and carry ``chained_segment`` makes with the carry at hand."""
    return batch_held(stage, data, encode_held(stage, data, later))


def encode_held(stage: Any, data: rows.SegmentData, later: Any) -> Any:
    """A chained segment of plain batches encoded before its carry (``later``: ``ready()``,
    ``wait()``) has come: batched while encoding once it has, else held (``batch_held``). Returns
    the segment's ``EagerBatches``."""
    eager = stage.batch.eager(data)
    if eager is None:
        raise RuntimeError(f"energon_ray: chained segment {data.spec.index} of worker {data.spec.worker} cannot batch as it encodes")
    eager.later = later
    stage.encode.encode(data, eager)
    return eager


def batch_held(stage: Any, data: rows.SegmentData, eager: Any) -> Tuple[Optional[pa.Table], Optional[Carry]]:
    """The block and carry of a segment ``encode_held`` encoded: its carry waited for, the samples
    still held batched (``None, None`` where the stream failed or closed before the segment)."""
    from energon_ray.pipeline.stages import output_table

    eager.take_carry(wait=True)
    if eager.dead:  # the stream failed or closed before this segment
        return None, None
    if data.fatal is None:  # the samples held while the carry had not come, batched as the encode stage would
        cfg = stage.encode.configs[data.spec.source]
        try:
            with worker_slot(data.spec.worker, cfg.num_workers):
                eager()
        except FatalSampleError as exc:
            data.fatal = ("FatalSampleError", str(exc))
    out = list(stage.batch.explode(data, eager))
    return output_table(out, data.spec.source), data.carry_out


def _carry_on(data: rows.SegmentData, carry: Carry, config: StageConfig) -> Optional[Carry]:
    """The carry a segment hands on, rebuilt from its encoded samples (``carry_only``; ``None``
    after a fatal error): its outputs so far and the open batch (buffer), which may reach back
    before this segment."""
    if data.fatal is not None:
        return None
    size = chain_unit(config)
    total = carry.outputs + len(data.encoded)
    need = total % size
    pool = list(carry.tail or ()) + data.encoded
    if need > len(pool):
        raise RuntimeError(
            f"energon_ray: rebuilding worker {data.spec.worker}'s batch across segment {data.spec.index}: "
            f"{need} samples needed, the segment gave {len(data.encoded)}"
        )
    # (the batches of the segments made again here were counted in ``carry.counts`` already)
    return Carry(total, pool[len(pool) - need :], counts=carry.counts)


def replay_chain(
    read: Callable[[Any], rows.SegmentData], config: Union[StageConfig, Mapping[int, StageConfig]], carry: Carry,
    rebuild: Optional[Any], specs: List[Any], node: Optional[str] = None,
) -> List[pa.Table]:
    """Segments of one chained worker stream made again one after another, as they were made (a
    restore re-making the packs a state's pools held): ``rebuild``'s outputs only give the carry
    into ``specs[0]`` (``carry_only``; ``None``: ``carry`` is that carry), then each of ``specs`` (its
    ``keep``: the items wanted) gives its block and the carry into the next. ``read``: a segment spec
    to its ``SegmentData``."""
    if rebuild is not None:
        _, carry = chained_segment(read(rebuild), config, carry, carry_only=True, node=node)
    tables = []
    for spec in specs:
        table, carry = chained_segment(read(spec), config, carry, node=node)
        if table is None:  # a fatal error (its report is in the previous block) or nothing to carry
            break
        tables.append(table)
    return tables


def rebuild_chained_batch(
    data: rows.SegmentData, config: Union[StageConfig, Mapping[int, StageConfig]], outputs: List[Tuple[int, ...]],
    counts: Optional[Tuple[int, int]] = None,
) -> List[Any]:
    """A chained stream's batch made again (``restore_sample``): ``data`` holds its samples, read at
    their positions; ``outputs``: ``(position, sub, index in the worker stream)`` of the batch's
    outputs, in order. Each sample is encoded with the outputs its stream had before it (so its
    hooks read the batch index they read then) and the batch hooks run with the batch's own index
    (and ``counts``, the stream's batch counts before the batch's group, counted on as then).
    Unbatched: the one output ``(position, sub, index, outputs given before its sample)``, its
    sample encoded (and post-encoded) with the counts it had, as a list of one.

    Raises:
        LookupError: an output is not made again (the data or the task encoder changed).
    """
    from energon_ray.pipeline.batcher import Batcher
    from energon_ray.pipeline.stages import EncodeSamples

    stage = EncodeSamples(config)
    bases = {int(out[0]): int(out[2]) - int(out[1]) for out in outputs}
    given = {int(out[0]): int(out[3]) for out in outputs if len(out) > 3}
    data.carry = Carry(0, None, bases=bases, given_bases=given or None)
    stage.encode(data)
    if data.fatal is not None:
        raise FatalSampleError(data.fatal[1])
    made = {(position, sub): item for position, sub, item in data.encoded}
    missing = [(out[0], out[1]) for out in outputs if (out[0], out[1]) not in made]
    if missing:
        raise LookupError(f"outputs (position, sub) {missing} of worker stream {data.spec.worker} were not made again")
    cfg = stage.config
    if cfg.batch_size is None:
        return [made[(outputs[0][0], outputs[0][1])]]
    batcher = Batcher(cfg.task_encoder.get(), cfg.error_handler)
    with worker_slot(data.spec.worker, cfg.num_workers):
        return batcher(
            [(position, sub, made[(position, sub)]) for position, sub, *_ in outputs], data.spec.seed, cfg.batch_size,
            batcher.new_runs(), outputs[0][2] // cfg.batch_size, None if counts is None else list(counts),
        )  # fmt: skip
