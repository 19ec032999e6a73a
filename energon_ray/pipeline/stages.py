"""The task-encoder stages, as small callables over Arrow tables (no Ray imports): their config
(``StageConfig``) and the first, ``EncodeSamples``: raw parts → decode → ``field_map`` →
``cook_crude_sample`` → ``encode_sample``. Batching is ``pipeline.batch_stages``.
Every hook call is seeded from its stream position, so a stage gives the same output wherever it runs.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import pyarrow as pa

from energon_ray.cache.cooking import AuxConfig, cook_aux, cook_context
from energon_ray.errors import FatalSampleError, log_exception
from energon_ray.pipeline import rows, serde
from energon_ray.pipeline.chained import chain_restore_key, is_generator_encoder, sub_restore_key
from energon_ray.pipeline.load import SampleLoader
from energon_ray.pipeline.packing import restore_key_of
from energon_ray.pipeline.policy import HookRunner
from energon_ray.pipeline.shipping import Shipped
from energon_ray.samples import CrudeSample
from energon_ray.task_encoder.base import TaskEncoder, is_overridden, matching_cooker, own_hook, sample_encode_hook
from energon_ray.task_encoder.context import hook_call, set_batch_index, worker_slot
from energon_ray.task_encoder.decorators import get_failure_tolerance


@dataclasses.dataclass
class StageConfig:
    """What every stage needs besides its input (shipped to Ray tasks)."""

    task_encoder: Shipped
    loader: Shipped
    batch_size: Optional[int]
    error_handler: Any = log_exception
    #: Energon's ``packing_buffer_size`` (None: no packing).
    packing_buffer_size: Optional[int] = None
    #: Leave every sample to the trainer's pool, batched across datasets (a validation metadataset
    #: batches its datasets' streams as one, like Energon's concatenation before batching).
    batch_across_sources: bool = False
    #: Leave every pack to the trainer's pool, which batches a worker stream's packs in order (Energon
    #: batches them as one stream; a segment cannot know how many packs the segments before it made).
    pool_packs: bool = False
    #: The dataset's auxiliary stores, its own path and the loader's cache pool (for cookers).
    aux: Optional[AuxConfig] = None
    #: Run ``postencode_sample`` here (off where the samples are packed later: a sample blend's
    #: packing runs it on each pack's members, as Energon's does).
    postencode: bool = True
    #: logical workers of the rank (hooks count samples and batches across them, as Energon's do)
    num_workers: int = 1
    #: Each segment continues its worker stream's batches, or packing buffers (``chains_outputs``): it
    #: gets the previous segment's ``Carry`` and hands its own to the next, so its segments run one
    #: after the other.
    chained: bool = False
    #: A chained stream's encode stage counts the stream's outputs (``chained.counts_outputs``; not
    #: where packs are chained): its outputs' restore keys name their index in the stream.
    counts_outputs: bool = False
    #: Drop each worker stream's last, short batch (a chained stream batches it in its last segment).
    drop_last: bool = False
    #: Per logical worker, the samples of its stream in the datasets before this one, where a
    #: validation metadataset batches across datasets: the hooks' sample and batch indices (and
    #: Energon's per-sample seeds) count on over them, as in Energon's concatenated stream.
    index_offsets: Optional[Tuple[int, ...]] = None
    #: A chained packed stream's packing hooks read Energon's indices, counted in ``Carry.counts``
    #: (``packing.Packer``); off for a state saved before (its hooks read their first sample's position).
    pack_counts: bool = True

    def index_offset(self, worker: int) -> int:
        return 0 if self.index_offsets is None else int(self.index_offsets[worker])


def _runner(te: TaskEncoder, name: str, stage: str, handler: Any, call: Optional[Callable[[Any], Any]] = None) -> HookRunner:
    fn = getattr(te, name)
    runner = HookRunner(stage, fn, get_failure_tolerance(fn, te.__default_failure_tolerance__), handler, refuse_none=True)
    if call is not None:
        runner.fn = call
    return runner


def _cook_call(te: TaskEncoder) -> Callable[[Any], Any]:
    """``te.cook_crude_sample`` as the loader calls it on a crude sample: an override with Energon's
    signature ``(sample, cooker, aux)`` (or ``*args``/``**kwargs``) gets the cooker matching the
    sample's subflavors and the dataset's aux stores, as Energon's loader passes them; one taking only
    the sample gets the sample."""
    hook = te.cook_crude_sample
    try:
        inspect.signature(own_hook(te, "cook_crude_sample")).bind(te, None, cooker=None, aux=None)
    except (TypeError, ValueError):
        return hook

    def call(sample: Any) -> Any:
        cooker = matching_cooker(te.cookers, sample.get("__subflavors__"))
        return hook(sample, cooker=cooker, aux=cook_aux(cooker))

    return call


def _what(sample: Any) -> str:
    if isinstance(sample, dict):
        key, sources = sample.get("__key__"), sample.get("__sources__")
    else:
        key, sources = getattr(sample, "__key__", None), getattr(sample, "__sources__", None)
    first = sources[0] if sources else None  # a SourceInfo, or its dict after dataclasses.asdict
    if isinstance(first, dict):
        shard, root = first.get("shard_name"), first.get("dataset_path")
    else:
        shard, root = getattr(first, "shard_name", None), getattr(first, "dataset_path", None)
    # the dataset too: a blend's datasets often share shard names and keys
    return f"dataset {root}: {shard or '?'}: sample {key!r}" if root else f"{shard or '?'}: sample {key!r}"


def _configs(config: Union[StageConfig, Mapping[int, StageConfig]]) -> Dict[int, StageConfig]:
    return dict(config) if isinstance(config, Mapping) else {0: config}


def _one_source(batch: pa.Table) -> int:
    found = set(rows.sources(batch))
    if len(found) > 1:
        raise RuntimeError(f"energon_ray: a block mixes segments of sources {sorted(found)}")
    return found.pop() if found else 0


class EncodeSamples:
    """Stage 1: decode, load, cook and encode every sample of a segment.

    Args:
        config: the stage config, or one per leaf dataset (by source index) for compositions.
    """

    def __init__(self, config: Union[StageConfig, Mapping[int, StageConfig]]):
        self.configs = _configs(config)
        self.post: Optional[_Postencode] = None

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = []
        source = _one_source(batch)
        for kind, worker, segment, seq, payload in rows.iter_rows(batch):
            data = serde.loads(payload)
            if kind == rows.SEGMENT:
                self.encode(data)
            out.append((kind, worker, segment, seq, data))
        return rows.table(out, source=source)

    def encode(self, data: rows.SegmentData, sink: Optional[Callable[[], None]] = None) -> None:
        """Encode the segment's samples into ``data.encoded``; ``sink`` is called after each sample's
        outputs were added (it may take them out: ``EagerBatches``)."""
        self.config = config = self.configs[data.spec.source]
        te: TaskEncoder = config.task_encoder.get()
        loader: SampleLoader = config.loader.get()
        handler = config.error_handler
        load = HookRunner("load", loader, te.__default_failure_tolerance__, handler)
        cook = _runner(te, "cook_crude_sample", "cook_crude_sample", handler, call=_cook_call(te))
        # a preencode_sample override replaces encode_sample (before the packing buffer, if any)
        hook = sample_encode_hook(te)
        encode = _runner(te, hook, "encode_sample", handler)
        runs = {r.stage: r for r in (load.new_run(), cook.new_run(), encode.new_run())}
        data.runs.extend(runs.values())
        self.post = _Postencode.where_run(te, config, handler, data.runs)
        if data.fatal is None:
            try:
                with cook_context(config.aux), worker_slot(data.spec.worker, config.num_workers):
                    self._encode_all(data, te, load, cook, encode, runs, sink)
            except FatalSampleError as exc:
                data.fatal = ("FatalSampleError", str(exc))
        data.raw = []

    def _add(
        self, data: rows.SegmentData, position: int, sub: int, item: Any, seed: int, before: int, per_batch: int,
        counted: Optional[int] = None,
    ) -> None:
        """Add an output of ``encode_sample`` to ``data.encoded`` (through ``postencode_sample`` where
        the stage runs it; not where that failed or skipped it). ``counted``: the worker stream's
        outputs before it, where the stage counts them."""
        if self.post is not None:
            item = self.post(item, seed, position, before, per_batch, counted)
            if item is HookRunner.FAILED or item is HookRunner.IGNORED:
                return
        data.encoded.append((position, sub, item))

    def _encode_all(self, data, te, load, cook, encode, runs, sink) -> None:
        run = _SegmentRun(self.config, data, te, encode, self.post)
        raws, data.raw = data.raw, []
        raws.reverse()
        while raws:  # pop as we go: a segment of videos never holds all raw and decoded data at once
            position, _, raw = raws.pop()
            run.at(position)
            what = _what(raw)
            sources = raw.get("__sources__")
            sample = load.call(runs["load"], raw, what, sources, at=position)
            if sample is HookRunner.FAILED or sample is HookRunner.IGNORED:
                continue
            if isinstance(sample, CrudeSample):
                with hook_call(run.seed, run.cook_kind, run.cook_seed(position), sample_index=position, batch_index=run.batch_of(position)):
                    sample = cook.call(runs["cook_crude_sample"], sample, what, sources, at=position)
                if sample is HookRunner.FAILED or sample is HookRunner.IGNORED:
                    continue
            if not run.encode_one(self, data, encode, runs["encode_sample"], sample, what, sources, position):
                continue
            del sample
            if sink is not None:
                sink()
        if run.given is not None:
            data.counted = (run.given.made, run.given.given)


class _SegmentRun:
    """What ``EncodeSamples`` keeps while it encodes one segment: the hooks' seeding and the indices
    they read (Energon's: a sample's position in its worker stream, or the outputs made before it
    where a chained stream counts them)."""

    def __init__(self, config: StageConfig, data: rows.SegmentData, te: TaskEncoder, encode: HookRunner, post: Optional["_Postencode"]):
        self.do_encode = is_overridden(te, sample_encode_hook(te))
        self.generator = self.do_encode and is_generator_encoder(te)
        self.seed = data.spec.seed
        # a hook marked @stateless(restore_seeds=True) gets Energon's seed for the sample (hook_seed)
        self.encode_kind = None if getattr(encode.fn, "__restore_seeds__", False) else "encode"
        # Energon cooks each dataset in its own map, before a blend or a validation metadataset's
        # concatenation: a cook call's current_sample_index (and a restore_seeds override's seed) is
        # the sample's position in its own dataset's worker stream
        self.cook_kind = None if getattr(own_hook(te, "cook_crude_sample"), "__restore_seeds__", False) else "cook"
        self.per_batch = config.batch_size or 1  # a sample hook sees the index of the batch it will be in
        # a chained stream that counts its outputs does (Energon's batch index: outputs before it //
        # batch size); else a sample's position stands for the outputs before it (so it does where
        # packs are chained, a batch holding packs, and where batches are chained only for skips)
        self.chain = data.carry if config.counts_outputs and not config.packing_buffer_size else None
        self.before = config.index_offset(data.spec.worker)
        # unbatched: the outputs made and given (after postencode_sample) are counted apart
        chained_unbatched = self.chain is not None and config.batch_size is None
        self.given = GivenCount(self.chain, post, self.seed, self.before) if chained_unbatched else None
        self.produced = None if self.chain is None or self.given is not None else [self.chain.outputs]

    def at(self, position: int) -> None:
        """The next sample is at ``position``."""
        if self.produced is not None and self.chain.bases is not None:  # a restore_sample re-read
            self.produced[0] = self.chain.bases[position]

    def cook_seed(self, position: int) -> int:
        return position if self.cook_kind is None else self.before + position

    def batch_of(self, position: int) -> int:
        if self.given is not None:
            return self.before + self.given.given
        return (self.before + position) // self.per_batch if self.produced is None else self.produced[0] // self.per_batch

    def next_output(self, n: int) -> None:
        set_batch_index((self.produced[0] + n) // self.per_batch)

    def encode_one(self, stage: EncodeSamples, data: rows.SegmentData, encode: HookRunner, run: Any, sample: Any,
                   what: str, sources: Any, position: int) -> bool:  # fmt: skip
        """``encode_sample`` on one loaded sample, its outputs added to ``data.encoded``; ``False``
        where the hook failed or skipped it."""
        seed, before, per_batch, given, produced = self.seed, self.before, self.per_batch, self.given, self.produced
        if not self.do_encode:
            stage._add(data, position, 0, sample, seed, before, per_batch)
            return True
        if given is not None:
            given.sample(position, restore_key_of(sample))
            with hook_call(seed, self.encode_kind, before + position, sample_index=before + position, batch_index=self.batch_of(position)):
                outputs = encode.call_many(run, sample, what, sources, before_each=given.before_each, at=position, after_each=given.after_each)
            given.made_by_plain_hook(outputs)
            data.encoded.extend((position, sub, item) for sub, item in given.take())
            return True
        with hook_call(seed, self.encode_kind, before + position, sample_index=before + position, batch_index=self.batch_of(position)):
            outputs = encode.call_many(run, sample, what, sources, before_each=None if produced is None else self.next_output, at=position)
        if outputs is HookRunner.FAILED or outputs is HookRunner.IGNORED:
            return False
        first = None if produced is None else produced[0]  # the stream's outputs before these
        if produced is not None:
            key = restore_key_of(sample)
            for n, item in enumerate(outputs):
                chain_restore_key(item, key, n, produced[0] + n)
            produced[0] += len(outputs)
        elif self.generator:
            key = restore_key_of(sample)
            for n, item in enumerate(outputs):
                sub_restore_key(item, key, n)
        for sub, item in enumerate(outputs):
            stage._add(data, position, sub, item, seed, before, per_batch, None if first is None else first + sub)
        return True


class _Postencode:
    """``postencode_sample`` on each output of ``encode_sample`` as it is made (Energon maps it right
    after ``encode_sample`` where it does not pack), so a chained stream batches postencoded samples
    as the rest. Where a packer runs it (on a pack's members), the encode stage does not."""

    def __init__(self, runner: HookRunner, run: Any):
        self.runner, self.run = runner, run
        # a hook marked @stateless(restore_seeds=True) gets Energon's seed (hook_seed)
        self.kind = None if getattr(runner.fn, "__restore_seeds__", False) else "postencode"

    @classmethod
    def where_run(cls, te: TaskEncoder, config: StageConfig, handler: Any, runs: List[Any]) -> Optional["_Postencode"]:
        """The stage's ``postencode_sample`` (its run added to ``runs``), or ``None`` where it is not
        overridden or a packer runs it (packing here or in a sample blend: ``config.postencode`` off)."""
        if not config.postencode or config.packing_buffer_size or not is_overridden(te, "postencode_sample"):
            return None
        runner = _runner(te, "postencode_sample", "postencode_sample", handler)
        run = runner.new_run()
        runs.append(run)
        return cls(runner, run)

    def __call__(
        self, sample: Any, seed: int, position: int, before: int, per_batch: int, counted: Optional[int] = None,
        given: Optional[int] = None,
    ) -> Any:
        """The hook's sample for the output of the sample at stream ``position`` (``before``: the
        stream's samples in the datasets of a validation metadataset before this one), or
        ``HookRunner.FAILED``/``IGNORED``. Its ``current_sample_index`` (and a ``restore_seeds``
        hook's seed) is Energon's, the worker stream's outputs before it, where the stage counts
        them (``counted``); else the sample's position, which is that until a sample is skipped or
        gives other than one output. ``current_batch_index``: that over ``per_batch``, or ``given``
        (an unbatched chained stream: the outputs given before, as Energon's)."""
        at = before + (position if counted is None else counted)
        batch_index = at // per_batch if given is None else before + given
        # (energon_ray's own seed stays the position's; the RNG of a generator encode_sample that
        # runs this between its outputs is kept for it)
        with hook_call(seed, self.kind, at if self.kind is None else before + position, sample_index=at, batch_index=batch_index,
                       restore_rng=given is not None):  # fmt: skip
            return self.runner.call(self.run, sample, _what(sample), at=position)


class GivenCount:
    """An unbatched chained stream's counts as Energon's hooks read them: ``made``, the worker
    stream's outputs of ``encode_sample`` so far (``postencode_sample``'s ``current_sample_index``),
    and ``given``, those ``postencode_sample`` kept (handed out: ``current_batch_index`` in every
    sample hook, one more between a generator's outputs). Each output is post-encoded as it is made,
    before the generator resumes, as Energon's lazy maps do. Counted on from ``carry``
    (``Carry.counts``; a ``restore_sample`` re-read: ``Carry.bases``/``given_bases`` per position)."""

    def __init__(self, carry: Any, post: Optional[_Postencode], seed: int, before: int):
        self.carry, self.post, self.seed, self.before = carry, post, seed, before
        self.given = int(carry.outputs)
        self.made = self.given if carry.counts is None else int(carry.counts[0])
        self._at: Tuple[int, Any, int] = (0, None, 0)  # the sample's position, restore key, outputs given before it
        self._kept: List[Tuple[int, Any]] = []
        self._sub = 0

    def sample(self, position: int, key: Any) -> None:
        """A sample's outputs are about to be made."""
        carry = self.carry
        if carry.bases is not None:  # a restore_sample re-read
            self.made = carry.bases[position]
            self.given = (carry.given_bases or carry.bases)[position]
        self._at, self._kept, self._sub = (position, key, self.given), [], 0

    def before_each(self, n: int) -> None:
        set_batch_index(self.before + self.given)

    def after_each(self, item: Any) -> None:
        """An output as it is made: keyed (``chain_restore_key``), post-encoded, counted."""
        position, key, first = self._at
        sub, self._sub = self._sub, self._sub + 1
        chain_restore_key(item, key, sub, self.made, first)
        if self.post is not None:
            item = self.post(item, self.seed, position, self.before, 1, self.made, self.given)
        self.made += 1
        if item is HookRunner.FAILED or item is HookRunner.IGNORED:
            return
        self.given += 1
        self._kept.append((sub, item))

    def made_by_plain_hook(self, outputs: Any) -> None:
        """The output of a hook that is not a generator (``call_many`` calls ``after_each`` for a
        generator's only), counted as a generator's would be."""
        if isinstance(outputs, list):
            for item in outputs[self._sub :]:
                self.after_each(item)

    def take(self) -> List[Tuple[int, Any]]:
        """The sample's outputs kept, ``(sub, output)``."""
        kept, self._kept = self._kept, []
        return kept


def output_table(out: List[Tuple[int, int, int, int, Any, Optional[List[int]]]], source: int) -> pa.Table:
    """A stage's output rows ``(kind, worker, segment, seq, payload, positions)`` as a block (``rows.table``)."""
    return rows.table([row[:5] for row in out], source=source, positions=[row[5] for row in out])
