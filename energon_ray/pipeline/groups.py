"""Several short segments in one Ray task: what ``TaskStream`` runs for a group of consecutive
segments of its plan (any leaves, any worker streams, in the order the trainer takes their
batches). The group's block is its segments' blocks one after another, so the trainer holds about
the block it is taking, not a partly taken one per leaf and worker stream.

A chained worker stream's segment (plain batches, ``chained.groups_segments``) encodes before its
carry is there; all segments of the group encode first, then batch in order, each waiting for its
carry: from an earlier task (``build.LaterCarry``), or from the group's own earlier segment of that
stream. No Ray imports.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import pyarrow as pa

from energon_ray.pipeline import rows
from energon_ray.pipeline.chained import Carry, batch_held, chained_segment, encode_held


class InGroup:
    """The carry a segment gets from the group's earlier segment of its worker stream, set once
    that one has batched (``ready()``, ``wait()``, as ``build.LaterCarry``)."""

    __slots__ = ("value", "done")

    def __init__(self, value: Any = None, done: bool = False):
        self.value = value
        self.done = done

    def ready(self) -> bool:
        return self.done

    def wait(self) -> Any:
        if not self.done:
            raise RuntimeError("energon_ray: a grouped segment's carry was wanted before its segment batched")
        return self.value


def stream_keys(specs: Sequence[Any], chained: Callable[[int], bool]) -> List[Tuple[int, int]]:
    """``(source, worker)`` of the chained worker streams among ``specs``, in order of first
    appearance: the carries a group hands on (each its stream's last segment's in the group)."""
    keys: List[Tuple[int, int]] = []
    for spec in specs:
        key = (spec.source, spec.worker)
        if chained(spec.source) and key not in keys:
            keys.append(key)
    return keys


def group_block(
    specs: Sequence[Any], read: Callable[[Any], rows.SegmentData], configs: Mapping[int, Any],
    carries: Sequence[Any], node: Optional[str] = None,
) -> Tuple[Optional[pa.Table], List[Optional[Carry]]]:  # fmt: skip
    """The block of ``specs`` (their segments' blocks in order) and the carry each chained worker
    stream among them hands on (``stream_keys`` order). ``read(spec)`` reads a segment; ``carries``:
    per spec, the carry a chained stream's first segment in the group takes (a ``Carry`` at hand,
    or one to wait for: ``ready()``, ``wait()``), ``None`` for the others."""
    from energon_ray.pipeline.batch_stages import EncodeAndBatch

    tables: List[Optional[pa.Table]] = [None] * len(specs)
    held: List[Tuple[int, Any, rows.SegmentData, Any, InGroup]] = []
    latest: Dict[Tuple[int, int], InGroup] = {}  # each chained stream's carry after its latest segment
    for i, (spec, carry) in enumerate(zip(specs, carries)):
        data = read(spec)
        config = configs[spec.source]
        if not config.chained:
            stage = EncodeAndBatch(configs)
            stage.batch.node = node
            tables[i] = stage.segment(data)
            continue
        key = (spec.source, spec.worker)
        if key in latest:
            carry = latest[key].value if latest[key].ready() else latest[key]
        elif carry is None:
            raise RuntimeError(f"energon_ray: no carry for worker {spec.worker}'s segment {spec.index} (source {spec.source})")
        out = latest[key] = InGroup()
        if not hasattr(carry, "wait"):  # at hand (or None: the stream failed or closed before)
            tables[i], out.value = chained_segment(data, configs, carry, False, node)
            out.done = True
            continue
        stage = EncodeAndBatch(configs)
        stage.batch.node = node
        held.append((i, stage, data, encode_held(stage, data, carry), out))
    for i, stage, data, eager, out in held:  # in order: a stream's segment batches before its next one
        tables[i], out.value = batch_held(stage, data, eager)
        out.done = True
    keys = stream_keys(specs, lambda source: configs[source].chained)
    return rows.concat([t for t in tables if t is not None]), [latest[key].value for key in keys]
