"""What the trainer does with an output row and with a group task's table: a row's payload loaded
zero-copy (``decode_row``), and the batches a group task made (seams, a sample blend's groups, packed
groups) read, chained for pinning and counted (``GroupItems``, ``seam_items``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from energon_ray.errors import unwrap_error
from energon_ray.loader.events import place_events
from energon_ray.loader.merge import Row
from energon_ray.loader.stats import LoaderStats, event_order
from energon_ray.loader.pinning import Pinner, chained, pin_now
from energon_ray.pipeline import rows, serde


def decode_row(row: Row, pin: bool) -> Row:
    """A row of an output block with its payload loaded zero-copy (items pinned if asked)."""
    kind, worker, segment, seq, payload = row
    value = serde.loads(payload, copy=False)
    if pin and kind == rows.ITEM:
        value = pin_now(value)
    return kind, worker, segment, seq, value


def _ours(exc: BaseException) -> BaseException:
    return unwrap_error(exc) or exc


def seam_items(
    wait: Callable[[], Any], pinner: Optional[Pinner], stats: LoaderStats, chain: Any
) -> Tuple[List[Any], List[List[int]], List[rows.Report]]:
    """The items a seam-batch task made (``wait`` gives its table) with their samples' positions, and
    its reports; they are counted in ``stats`` (skips joined by ``chain``), and the user's error handler calls and
    fatal errors it asks for are placed among the items as ``HandlerCall``/``Failed`` entries (with
    no positions) where they happened, for ``WorkerQueues.pop``; a task's error is raised as ours.
    With a ``pinner`` (pinning), the items are ``Pinning``s chained in order (``pinning.chained``), to
    be handed out with ``pinning.handed_out``: the pin thread copies each while the one before it trains."""
    group = GroupItems(wait, pinner, stats, chain)
    items, spans = group(placed=True)
    return items, spans, group.reports


def read_finished(groups: Dict[int, "GroupItems"]) -> None:
    """Read the tables of the ``groups`` (by worker) whose tasks have finished, and drop those
    from ``groups`` (the blends' groups started ahead, for pinning: tried at each call)."""
    for worker in [w for w, group in groups.items() if group.read_if_ready()]:
        del groups[worker]


class GroupItems:
    """``seam_items`` of a group task, in two steps: ``read_if_ready`` reads the table once the task
    has finished (``wait.ready()``) and chains its batches for pinning as the worker stream
    ``stream``'s next ones, so the first is copied ahead of its turn, not while the trainer waits
    for it; calling it gives the items (reading the table first if not read yet) after counting the
    task's report, whose error is raised then, where it was without reading ahead
    (``count_seams``: and counting its batches in ``stats.seam_batches``)."""

    def __init__(self, wait: Callable[[], Any], pinner: Optional[Pinner], stats: LoaderStats, chain: Any,
                 stream: Optional[Any] = None, count_seams: bool = False):  # fmt: skip
        self._wait = wait
        self._pinner = pinner
        self._stats = stats
        self._chain = chain
        self._stream = stream
        self._count_seams = count_seams
        self._read: Optional[Tuple[List[Any], List[List[int]], List[Any]]] = None
        self._error: Optional[BaseException] = None

    def read_if_ready(self) -> bool:
        """Read the table if the task has finished; whether it is read (or failed) now."""
        if self._read is None and self._error is None:
            ready = getattr(self._wait, "ready", None)
            if ready is None or not ready():
                return False
            self._take()
        return True

    def _take(self) -> None:
        try:
            table = self._wait()
        except Exception as exc:
            self._error = _ours(exc)
            return
        items, spans, reports = [], [], []
        for row, positions in zip(rows.iter_rows(table), rows.positions(table)):
            kind, _, _, _, value = decode_row(row, False)
            if kind == rows.REPORT:
                reports.append(value)
            else:
                items.append(value)
                spans.append(positions or [])
        if self._pinner is not None:
            items = chained(self._pinner, items, stream=self._stream)
        self._read = (items, spans, reports)

    @property
    def reports(self) -> List[rows.Report]:
        """The task's reports (none before its table is read)."""
        return self._read[2] if self._read is not None else []

    def __call__(self, placed: bool = False) -> Tuple[List[Any], List[List[int]]]:
        """The items and their positions; ``placed``: with the report's events among them (``seam_items``),
        else done at once (a handler's or a fatal error raised here)."""
        if self._read is None and self._error is None:
            self._take()
        if self._error is not None:
            raise self._error from None
        items, spans, reports = self._read
        if self._count_seams:
            self._stats.seam_batches += len(items)
        if not placed:
            for report in reports:
                self._stats.add_report(report, self._chain)
            return items, spans
        events = sorted((e for report in reports for e in self._stats.account(report, self._chain)), key=event_order)
        if not events:
            return items, spans
        before = place_events(events, [max(span) if span else None for span in spans] + [None])
        out_items: List[Any] = []
        out_spans: List[List[int]] = []
        for queued, item, span in zip(before, [*items, None], [*spans, None]):
            out_items.extend(queued)
            out_spans.extend([] for _ in queued)
            if span is not None:
                out_items.append(item)
                out_spans.append(span)
        return out_items, out_spans
