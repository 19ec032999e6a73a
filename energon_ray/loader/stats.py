"""``LoaderStats``: what a loader counts while it runs (``loader.stats``), and where the segments'
reports are filed: skips logged, and the user's error handler calls and fatal errors they ask for
(``HandlerCall``/``Failed``), which the queues place where Energon's worker meets them."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional, Tuple

from energon_ray.errors import FatalSampleError, ShardReadError, with_remote_traceback
from energon_ray.pipeline import rows
from energon_ray.pipeline.policy import Failure, FailureChain

logger = logging.getLogger("energon_ray")

#: samples read in a row, none of them encoded (all failed or skipped), before a warning says so
#: (then again at 10x, 100x, ...): an endless loader over such data would otherwise wait silently
DRY_WARNING_SAMPLES = 1000


class Failed:
    """A segment's fatal error, queued after the items its worker stream made before it: raised when
    the consumer reaches it (as Energon raises when the loader asks that worker for its next batch),
    so the batches ahead of it, of this and the other workers, come out first."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class HandlerCall:
    """A failure for the user's error handler (``policy.DeferredHandler``), queued where Energon's
    worker would meet it: after the batches made before the failed sample, before the batch it would
    have been in, so a handler that raises stops the loader there (``WorkerQueues.pop``)."""

    __slots__ = ("stage", "failure")

    def __init__(self, stage: str, failure: Failure):
        self.stage = stage
        self.failure = failure


#: ``(seq, at, HandlerCall | Failed)``: what a report asks of the consumer, and where (``Failure``)
Event = Tuple[float, Optional[int], Any]


def event_order(event: Event) -> Tuple[float, float]:
    """Events in the order Energon's worker meets them: by stream position (a batch's failure at its
    last sample, so after that sample's and before the next one's), then as they happened (``seq``:
    comparable within one process only; a segment's stages may run in several); unknown positions last."""
    seq, at, _ = event
    return (float("inf") if at is None else at, seq)


@dataclasses.dataclass(frozen=True)
class Counts:
    """What one segment's report adds to ``LoaderStats``' counters (``report_counts``)."""

    samples_read: int
    samples_encoded: int
    read_requests: int
    read_bytes: int
    read_retries: int
    node: Optional[str]
    skipped: Tuple[Tuple[str, int], ...]
    ignored: Tuple[Tuple[str, int], ...]


def report_counts(report: rows.Report) -> Counts:
    """The counters ``report`` adds (its samples, reads, node, skipped and ignored per stage)."""
    return Counts(
        report.samples_read, report.samples_encoded, getattr(report, "read_requests", 0), getattr(report, "read_bytes", 0),
        getattr(report, "read_retries", 0), report.node,
        tuple((run.stage, run.failures) for run in report.runs if run.failures),
        tuple((run.stage, run.ignored) for run in report.runs if run.ignored),
    )  # fmt: skip


class LoaderStats:
    """Counters the user can read while iterating (``loader.stats``)."""

    def __init__(self) -> None:
        self.samples_read = 0
        self.samples_encoded = 0
        self.batches = 0
        self.seam_batches = 0
        self.skipped: Dict[str, int] = {}
        self.ignored: Dict[str, int] = {}
        #: segments made per Ray node id
        self.segments_per_node: Dict[str, int] = {}
        #: segments made by plain Ray tasks: all of them with the default executor; with
        #: ``executor="ray_data"`` a pass's start (none with ENERGON_RAY_START_WITH_TASKS=0), the
        #: rest by Ray Data executions
        self.segments_as_tasks = 0
        #: read requests of the segments (remote: requests to the store), bytes they read, and
        #: retries of transient store errors (each retried request gave the same bytes)
        self.read_requests = 0
        self.read_bytes = 0
        self.read_retries = 0
        #: the user's error handler, called here for the failures Ray tasks deferred to it
        self.error_handler: Any = None
        #: samples read since the last one encoded, and when to warn about them
        self._dry = 0
        self._dry_warn_at = DRY_WARNING_SAMPLES
        self._said_no_batch = False

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def as_dict(self) -> Dict[str, Any]:
        return {
            "samples_read": self.samples_read,
            "samples_encoded": self.samples_encoded,
            "batches": self.batches,
            "seam_batches": self.seam_batches,
            "skipped": dict(self.skipped),
            "ignored": dict(self.ignored),
            "segments_per_node": dict(self.segments_per_node),
            "segments_as_tasks": self.segments_as_tasks,
            "read_requests": self.read_requests,
            "read_bytes": self.read_bytes,
            "read_retries": self.read_retries,
        }

    def __repr__(self) -> str:
        return f"LoaderStats({self.as_dict()})"

    def handle_failure(self, stage: str, exc: BaseException, item: Any, sources: List[Any], trace: str = "") -> None:
        """Call the user's error handler (if any) for a failure a Ray task deferred to it (``stage``:
        the hook that failed; ``trace``: its traceback there), inside an ``except`` that caught it,
        as Energon calls it (``traceback.format_exc``, ``logger.exception`` in the handler show it,
        caused by the Ray task's traceback)."""
        if self.error_handler is None:
            return
        try:
            raise with_remote_traceback(exc, trace)
        except BaseException:
            # a handler that raises aborts loading with its own exception, as in Energon
            self.error_handler(exc, item, sources)

    def _note_dry(self, report: rows.Report) -> None:
        """Warn when many samples in a row were read and none was encoded."""
        if report.samples_encoded:
            self._dry, self._dry_warn_at = 0, DRY_WARNING_SAMPLES
            return
        self._dry += report.samples_read
        if report.samples_read and self._dry >= self._dry_warn_at:
            logger.warning(
                "none of the last %d samples read was encoded (skipped so far: %s; ignored, e.g. SkipSample: %s): "
                "a batch waits for a sample that gets through the task encoder, and an endless loader waits forever",
                self._dry, self.skipped, self.ignored,
            )  # fmt: skip
            self._dry_warn_at *= 10

    def warn_no_batch(self, pass_index: int, read: int) -> None:
        """A pass that read ``read`` samples ended without an item: say so (it would end silently);
        once per loader (an endless loader over such data would say it every pass)."""
        if self._said_no_batch:
            return
        self._said_no_batch = True
        logger.warning(
            "pass %d gave no batch although it read %d samples (skipped so far: %s; ignored so far, e.g. SkipSample "
            "or a generator hook that yielded nothing: %s; encoded in all: %d)",
            pass_index, read, self.skipped, self.ignored, self.samples_encoded,
        )  # fmt: skip

    def add_report(self, report: rows.Report, chain: FailureChain) -> None:
        """Count a segment's report, log its skips, call the user's error handler and raise its fatal
        error, in the order they happened (``account``, at once)."""
        for _, _, event in self.account(report, chain):
            self.run_event(event)

    def run_event(self, event: Any) -> None:
        """Do what an ``account`` event asks: raise a ``Failed``'s error, call the handler for a ``HandlerCall``."""
        if type(event) is Failed:
            error = event.error
            raise type(error)(str(error))
        failure = event.failure
        self.handle_failure(event.stage, failure.exc, failure.item, failure.sources, failure.trace)

    def add_counts(self, counts: Counts, sign: int = 1) -> None:
        """Add a report's ``counts`` to the counters (``sign=-1``: take them back, the segment is
        made again after Ray lost its execution: ``loader.ledger``)."""
        self.samples_read += sign * counts.samples_read
        self.samples_encoded += sign * counts.samples_encoded
        self.read_requests += sign * counts.read_requests
        self.read_bytes += sign * counts.read_bytes
        self.read_retries += sign * counts.read_retries
        if counts.node is not None:
            _add(self.segments_per_node, counts.node, sign)
        for stage, n in counts.skipped:
            _add(self.skipped, stage, sign * n)
        for stage, n in counts.ignored:
            _add(self.ignored, stage, sign * n)

    def account(self, report: rows.Report, chain: FailureChain) -> List[Event]:
        """Count a segment's report and log its skips; the user's error handler calls (``HandlerCall``)
        and the fatal errors (``Failed``: a run joined over segments that became too long, the
        segment's own) it asks for, as ``(seq, at, event)`` in the order they happened (``event_order``)."""
        events: List[Event] = []
        self.add_counts(report_counts(report))
        for run in report.runs:
            if self.error_handler is not None:
                events.extend((failure.seq, failure.at, HandlerCall(run.stage, failure)) for failure in run.deferred)
            if run.failures and self.error_handler is None:  # the default handler's log; a user's handler replaces it, as in Energon
                for message in run.messages:
                    logger.warning("skipped (%s): %s", run.stage, message)
                if run.failures > len(run.messages):
                    logger.warning(
                        "skipped (%s): %d more in segment %d of worker %d",
                        run.stage, run.failures - len(run.messages), report.segment, report.worker,
                    )  # fmt: skip
            fatal = chain.check(report.worker, run)
            if fatal is not None:
                events.append((fatal.seq, fatal.at, Failed(FatalSampleError(fatal.message))))
        self._note_dry(report)
        if report.fatal is not None:
            kind, message = report.fatal
            error = (ShardReadError if kind == "ShardReadError" else FatalSampleError)(message)
            events.append((float("inf"), None, Failed(error)))
        events.sort(key=event_order)
        return events


def _add(counter: Dict[str, int], key: str, n: int) -> None:
    """Add ``n`` to ``counter[key]``; a count taken back to 0 leaves the dict, as if never counted."""
    total = counter.get(key, 0) + n
    if total:
        counter[key] = total
    else:
        counter.pop(key, None)
