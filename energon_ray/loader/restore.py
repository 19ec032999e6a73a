"""Making pooled samples again for a restore (one batch again for ``restore_sample``: ``loader.rebuild``).

A saved state names pooled samples by ``(leaf, position, sub)``; ``restore_reads`` turns them into
restore segments (``SegmentSpec.keep``), ``run_reads`` runs those in one small Ray execution, and
``restore_streams`` puts every worker stream of every leaf where its state says.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from energon_ray.errors import reraise_exception, unwrap_error
from energon_ray.loader.state import StateError, StreamState
from energon_ray.pipeline import rows, serde
from energon_ray.pipeline.policy import DeferredHandler
from energon_ray.plan.stream import SegmentPlan, SegmentSpec


def restore_streams(
    feeds: Sequence[Any], states: Sequence[Sequence[StreamState]], reread: Callable[[Sequence[Sequence[StreamState]]], Dict]
) -> None:
    """Re-make the pooled samples the states name (``reread``), then restore every leaf's worker
    queues, in leaf order (a concatenation's next dataset after the one that hands it its remainder)."""
    payloads = reread(states)
    for feed, per_worker in zip(feeds, states):
        for worker, state in enumerate(per_worker):
            feed.queues.restore(worker, state, payloads)


@dataclasses.dataclass
class ChainedRead:
    """The pooled packs of a chained worker stream made again (``chained.replay_chain``): the
    segments from where its checkpoint's chain starts up to the checkpoint's segment, one after
    another, as the stream made them (a packing buffer runs across segments)."""

    #: the carry into ``specs[0]``, or (``rebuild`` set) into ``rebuild``, whose outputs give it
    carry: Any
    rebuild: Optional[SegmentSpec]
    #: each with ``keep``: the pooled packs
    specs: List[SegmentSpec]


def _chained_read(plan: SegmentPlan, worker: int, state: StreamState, refs: Sequence[Tuple[int, int]]) -> ChainedRead:
    """The ``ChainedRead`` that makes ``refs`` (pooled packs of a chained stream) again: the
    checkpoint's ``chain`` is ``[segment, outputs before it, first position of the buffer open there
    or None]``, reaching back to the segment that made the oldest pooled pack (``WorkerQueues``)."""
    from energon_ray.pipeline.chained import Carry

    cp = state.checkpoint
    first, outputs, open_from = (0, 0, None) if cp.chain is None else cp.chain[:3]
    # the packing hook counts before the first segment packed again (``ChainPoints``; None: positions)
    counts = tuple(int(c) for c in cp.chain[7:11]) if cp.chain is not None and len(cp.chain) == 11 else None
    keep = tuple(sorted(refs))
    if open_from is None:  # no buffer open into ``first``
        carry, rebuild, start = Carry(int(outputs), [], counts=counts), None, int(first)
    else:
        carry, rebuild, start = Carry(int(outputs), None, counts=counts), plan.segment(worker, int(first)), int(first) + 1
    specs = [SegmentSpec(**{**_spec_fields(plan.segment(worker, index)), "keep": keep}) for index in range(start, cp.segment)]
    if not specs:
        raise StateError(f"restoring the loader state: worker stream {worker}'s pooled packs {list(keep)[:4]} come from no segment before {cp.segment}")
    return ChainedRead(carry, rebuild, specs)


def restore_reads(
    leaves: Sequence[Any], plans: Sequence[SegmentPlan], streams: Sequence[Sequence[StreamState]]
) -> List[Union[SegmentSpec, ChainedRead]]:
    """Segments that make the pooled samples of a saved state again, returning only those.

    A plain sample is re-read at its own position (hook seeds follow positions, so it comes out the
    same); a pack is only defined by its segment's packing buffer, so its whole segment is re-run
    (a chained stream's: the segments from where its chain starts, ``ChainedRead``).
    """
    wanted: Dict[Tuple[int, int], set] = {}
    for per_worker in streams:
        for worker, state in enumerate(per_worker):
            for leaf, position, sub in state.checkpoint.refs():
                wanted.setdefault((leaf, worker), set()).add((int(position), int(sub)))
    specs: List[Union[SegmentSpec, ChainedRead]] = []
    for (leaf, worker), refs in sorted(wanted.items()):
        plan = plans[leaf]
        if leaves[leaf].options.packing_buffer_size and leaves[leaf].stage_config().chained:
            specs.append(_chained_read(plan, worker, streams[leaf][worker], sorted(refs)))
            continue
        if leaves[leaf].options.packing_buffer_size:
            index_of = plan.layout.index
            for index in sorted({index_of(p) for p, _ in refs}):
                spec = plan.segment(worker, index)
                keep = tuple(sorted(r for r in refs if index_of(r[0]) == index))
                specs.append(SegmentSpec(**{**_spec_fields(spec), "keep": keep}))
            continue
        stream = plan.streams[worker]
        positions = np.array(sorted({p for p, _ in refs}), dtype=np.int64)
        samples = np.concatenate([stream.samples(int(p), int(p) + 1) for p in positions])
        if len(samples) != len(positions):
            raise StateError(f"restoring the loader state: positions {positions.tolist()} lie beyond worker stream {worker}'s end")
        specs.append(
            SegmentSpec(
                worker=worker, global_worker=stream.config.global_worker, seed=stream.config.hook_seed,
                index=-2 - len(specs), start=int(positions[0]), samples=samples, last=False, source=leaf,
                positions=positions, keep=tuple(sorted(refs)),
            )  # fmt: skip
        )
    return specs


def _spec_fields(spec: SegmentSpec) -> Dict[str, Any]:
    names = ("worker", "global_worker", "seed", "index", "start", "samples", "last", "source", "positions", "keep")
    return {name: getattr(spec, name) for name in names}


def run_reads(specs: List[SegmentSpec], readers, configs, remote_args, leaves) -> Dict[Tuple[int, int, int, int], Any]:
    """Run restore reads (``spec.keep``) in one small Ray execution: ``(leaf, worker, position, sub)``
    → the serialized sample or pack.

    A hook that fails on a sample being made again goes to the dataset's
    ``WorkerConfig.restore_error_handler`` (called here, with the exception, the sample and its
    sources, as Energon calls it), which by default raises that exception.

    Raises:
        StateError: a read failed, or a kept sample was not made again.
    """
    if not specs:
        return {}
    from energon_ray.pipeline.build import replay_chain
    from energon_ray.pipeline.data_stream import BlockStream

    chains = [spec for spec in specs if isinstance(spec, ChainedRead)]
    specs = [spec for spec in specs if not isinstance(spec, ChainedRead)]
    wanted = {(spec.source, spec.worker, p, s) for spec in specs + [c.specs[0] for c in chains] for p, s in spec.keep}
    found: Dict[Tuple[int, int, int, int], Any] = {}
    # every failure travels back with its exception, for the restore handler
    configs = {source: dataclasses.replace(config, error_handler=DeferredHandler()) for source, config in configs.items()}
    failures: List[str] = []
    stream = BlockStream(specs, readers, configs, 2, name="EnergonRestore", ray_remote_args=remote_args) if specs else None

    def blocks():
        for chain in chains:
            source = chain.specs[0].source
            yield from replay_chain(readers[source], configs[source], chain.carry, chain.rebuild, chain.specs, remote_args)
        if stream is not None:
            yield from stream

    try:
        for block in blocks():
            for (kind, worker, _, _, payload), source in zip(rows.iter_rows(block), rows.sources(block)):
                value = serde.loads(payload, copy=False)
                if kind == rows.LEFTOVER:
                    for _, _, items in value:
                        for position, sub, sample in items:
                            found[(source, worker, position, sub)] = sample
                elif kind == rows.REPORT:
                    handler = getattr(leaves[source].worker_config, "restore_error_handler", reraise_exception)
                    for run in value.runs:
                        failures.extend(run.messages)
                    # in the order Energon meets them (a segment's stages interleave: ``stats.event_order``)
                    failures_here = [f for run in value.runs for f in run.deferred]
                    for failure in sorted(failures_here, key=lambda f: (float("inf") if f.at is None else f.at, f.seq)):
                        handler(failure.exc, failure.item, failure.sources)
                    if value.fatal is not None:
                        raise StateError(f"restoring: re-reading samples failed: {value.fatal[1]}")
    except StateError:
        raise
    except Exception as exc:
        ours = unwrap_error(exc)
        if ours is not None:
            raise StateError(f"restoring: re-reading samples failed: {ours}") from None
        raise
    finally:
        if stream is not None:
            stream.close()
    missing = sorted(wanted - set(found))
    if missing:
        source, worker, position, sub = missing[0]
        raise StateError(
            f"restoring: {len(missing)} sample(s) could not be made again, e.g. position {position} (sub {sub}) of "
            f"worker stream {worker} of {leaves[source]!r}"
            + (f" ({failures[0]})" if failures else "")
            + "; the dataset, its task encoder or the error policy changed since they were saved"
        )
    return found
