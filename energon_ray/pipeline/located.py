"""Where a pooled sample's payload lies in Ray's object store, so that the trainer hands on a place,
never the bytes: ``Located`` (a leftover row's sample in a block), ``BlockRefs`` (a pass's pooled
samples, by number) and ``resolve_located`` (what a batching task reads back).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Tuple

import pyarrow as pa

from energon_ray.pipeline import serde
from energon_ray.pipeline.rows import LEFTOVER, iter_rows


class Located(NamedTuple):
    """Where a leftover sample's payload lies: item ``item`` of group ``group`` of the ``LEFTOVER``
    row ``row`` of an output block in Ray's object store (``block``: its reference). A sample
    blend's trainer pools these instead of the bytes, and the Ray task that batches the samples
    reads them from the store (``resolve_located``): no sample bytes pass through the trainer."""

    block: Any
    row: int
    group: int
    item: int


class BlockRefs:
    """Where a pass's pooled samples lie, for the garbage collector's sake (one per pass).

    A sample blend's trainer pools every sample of its leaves until a group takes it. Pooled as a
    ``Located`` (a named tuple holding the block's ObjectRef), each was an object the collector
    tracks and keeps: thousands per pass, which made the trainer's full collections (a walk over
    the whole process: torch's objects, the user's model) come every few hundred batches, up to
    155 ms each. ``locate`` names a sample's place by a number instead, as an exact tuple of ints
    (the collector stops tracking those); ``ship`` turns it back into a ``Located`` as its sample
    leaves for a Ray task, and drops the block's reference once its last pooled sample did.
    """

    def __init__(self) -> None:
        #: number → [the block's reference, its pooled samples not shipped yet]
        self._rows: Dict[int, List[Any]] = {}
        self._next = 0

    def locate(self, payload: List[Any], block: Any, row: int) -> List[Any]:
        """A decoded ``LEFTOVER`` payload of row ``row`` of ``block`` with each sample's bytes
        replaced by ``(number, row, group, item)``."""
        number = self._next
        self._next += 1
        located = [
            (key, size, [(position, sub, (number, row, g, i)) for i, (position, sub, _) in enumerate(items)])
            for g, (key, size, items) in enumerate(payload)
        ]
        count = sum(len(items) for _, _, items in payload)
        if count:
            self._rows[number] = [block, count]
        return located

    def ship(self, payload: Any) -> Any:
        """A pooled sample's payload as a Ray task reads it: its ``Located`` (other payloads as they are)."""
        if type(payload) is not tuple:
            return payload
        number, row, group, item = payload
        entry = self._rows.get(number)
        if entry is None:
            raise RuntimeError(f"energon_ray: a pooled sample of block row {number} was shipped twice")
        entry[1] -= 1
        if not entry[1]:
            del self._rows[number]
        return Located(entry[0], row, group, item)

    def __len__(self) -> int:
        """Block rows with pooled samples not shipped yet."""
        return len(self._rows)


def resolve_located(groups: List[Tuple[int, List[Tuple[int, int, Any]]]], get: Callable[[List[Any]], List[pa.Table]]) -> List[Any]:
    """``groups`` with every ``Located`` payload replaced by the sample's bytes (``get``: fetches blocks)."""
    refs = list({p.block: None for _, group, *_ in groups for _, _, p in group if isinstance(p, Located)})
    if not refs:
        return groups
    tables = dict(zip(refs, get(refs)))
    decoded: Dict[Tuple[Any, int], Any] = {}

    def payload(loc: Located) -> Any:
        key = (loc.block, loc.row)
        if key not in decoded:
            for i, (kind, _, _, _, buffer) in enumerate(iter_rows(tables[loc.block])):
                if i == loc.row:
                    if kind != LEFTOVER:
                        raise RuntimeError(f"energon_ray: row {loc.row} of a block is not a leftover row")
                    decoded[key] = serde.loads(buffer, copy=False)
                    break
        return decoded[key][loc.group][2][loc.item][2]

    return [
        (size, [(position, sub, payload(p) if isinstance(p, Located) else p) for position, sub, p in group], *rest)
        for size, group, *rest in groups
    ]
