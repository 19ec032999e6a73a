"""Where a segment's report asks for something among its rows, driver side, without Ray.

A segment's report arrives after its items, but what it asks for (the user's error handler for a
failed sample, a fatal error when a run of failures grows too long: ``LoaderStats.account``) must
happen where Energon's worker meets it: after the batches made before the failed sample, before the
batch it would have been in. ``account_block`` counts a block's reports as the block arrives and
``place_events`` says before which of the segment's rows each event is queued (``WorkerQueues.feed``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from energon_ray.loader.merge import Row, WorkerQueues
from energon_ray.loader.stats import Event
from energon_ray.pipeline import rows


def place_events(events: Sequence[Event], bounds: Sequence[Optional[int]]) -> List[List[Any]]:
    """Where a segment's report events (``LoaderStats.account``, in ``event_order``) go among
    its rows: ``bounds`` holds, per row, the largest stream position of the samples it holds (an
    item's, a ``LEFTOVER`` row's; ``None``: unknown, then the next known one counts). An event goes
    before the first row that holds a sample after its own (Energon's worker meets a failure while it
    makes the batch its next good sample goes into: the batches before are given, that one is not);
    the last row (the report) takes those left. Returns the events to queue before each row."""
    out: List[List[Any]] = [[] for _ in bounds]
    if not events or not bounds:
        return out
    known: List[Optional[int]] = list(bounds)
    ahead: Optional[int] = None
    for j in range(len(known) - 1, -1, -1):
        if known[j] is None:
            known[j] = ahead
        else:
            ahead = known[j]
    i, last = 0, len(known) - 1
    for j, bound in enumerate(known):
        while i < len(events) and (j == last or (bound is not None and events[i][1] is not None and events[i][1] < bound)):
            out[j].append(events[i][2])
            i += 1
    return out


#: ``(reports, leftovers, placed)`` of ``account_block``, each by row index in the block
Accounted = Tuple[Dict[int, Row], Dict[int, Row], Dict[int, List[Any]]]


def account_block(
    block_rows: List[Row],
    sources: List[int],
    positions: List[Optional[List[int]]],
    queues_of: Callable[[int], WorkerQueues],
    decode: Callable[[Row], Row],
) -> Accounted:
    """Count a block's reports as it arrives (in plan order: the blocks before it are filed), before
    any of their segments' items is handed out, and place what each asks for among its segment's
    rows: the user's error handler is called, and a run of failures joined over segments raises,
    where Energon's worker would meet that failure, not as the report row is reached after the
    segment's items, nor all of them as the block arrives. ``queues_of(source)``: the source's
    queues; ``decode``: a row with its payload unpickled. Returns the decoded report rows and the
    ``LEFTOVER`` rows decoded to place events, by row index, and the events to queue before each row
    (every report row has an entry: counted already)."""
    reports: Dict[int, Row] = {}
    leftovers: Dict[int, Row] = {}
    placed: Dict[int, List[Any]] = {}
    segment_rows: Dict[Tuple[int, int, int], List[int]] = {}
    for i, row in enumerate(block_rows):
        key = (sources[i], row[1], row[2])
        segment_rows.setdefault(key, []).append(i)
        if row[0] != rows.REPORT:
            continue
        reports[i] = decoded = decode(row)
        queues = queues_of(sources[i])
        events = queues.account(decoded[4])
        indices = segment_rows.pop(key)
        placed[i] = []
        if not events:
            continue
        bounds = [_bound(block_rows, j, positions, queues.hand_out, decode, leftovers) for j in indices]
        ending = getattr(decoded[4], "ending_items", 0)
        if ending and not queues.hand_out:  # the stream's short last batch: made after every failure in it
            items = [n for n, j in enumerate(indices) if block_rows[j][0] == rows.ITEM]
            for n in items[-ending:]:
                bounds[n] = float("inf")
        for j, queued in zip(indices, place_events(events, bounds)):
            placed.setdefault(j, []).extend(queued)
    return reports, leftovers, placed


def _bound(
    block_rows: List[Row], j: int, positions: List[Optional[List[int]]], hand_out: bool, decode: Callable[[Row], Row],
    leftovers: Dict[int, Row],
) -> Optional[int]:
    """Row ``j``'s largest sample position for ``place_events`` (a ``LEFTOVER`` row is decoded for it,
    kept in ``leftovers``); None where it holds no sample or the queues hand items out as they come."""
    kind = block_rows[j][0]
    if hand_out or kind == rows.REPORT:
        return None
    if kind == rows.ITEM:
        return max(positions[j]) if positions[j] else None
    if kind == rows.LEFTOVER:
        leftovers[j] = left = decode(block_rows[j])
        held = [position for _, _, items in left[4] for position, _, _ in items]
        return max(held) if held else None
    return None
