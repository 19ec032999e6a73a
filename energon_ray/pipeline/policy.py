"""Energon's error policy for hooks: skip and count bad samples, stop after too many in a row.

``SkipSample`` drops an item silently (counted as *ignored*). System errors (``ImportError``,
``MemoryError``…) abort at once. Anything else goes to the user's error handler, the item is dropped
and counted, and ``tolerance`` consecutive failures of one stage raise ``FatalSampleError``.
Runs of failures that cross segment boundaries are joined in the driver (``FailureChain``).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import traceback
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from energon_ray.errors import SYSTEM_EXCEPTIONS, FatalSampleError, SkipSample, log_exception

#: Failures kept with their message per segment and stage (the counts are always exact).
MAX_REPORTED = 20

#: Numbers the failures of a process in the order they happen (a segment's failures of all its
#: stages, interleaved as eager batching interleaves them): the driver calls the user's handler for
#: them, and raises a joined run's ``FatalSampleError``, in that order.
_SEQ = itertools.count()


def next_seq() -> int:
    """The next failure's number (``_SEQ``)."""
    return next(_SEQ)


class Failure(NamedTuple):
    """A failure deferred to the user's error handler (``DeferredHandler``): the handler's arguments,
    where it happened (``at``: the stream position of the sample, or of a batch's last sample;
    ``None``: unknown) and when (``seq``)."""

    exc: BaseException
    item: Any
    sources: List[Any]
    at: Optional[int] = None
    seq: int = 0
    #: the traceback in the Ray task, as text (``errors.with_remote_traceback``)
    trace: str = ""


class DeferredHandler:
    """The user's error handler as Ray tasks see it: each failure is recorded in the stage's run
    (``Failure``: with its stream position) and travels with the segment's report; the loader calls
    the handler with it in the training process (where the handler's state lives) when the consumer
    reaches the failed sample's place, after the batches made before it (``loader.events``), and
    a handler that raises aborts loading there with its own exception (as Energon's)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DeferredHandler()"


def deferred_handler(handler: Any) -> Any:
    """What Ray tasks get for the user's ``handler``: the default (log) as it is, any other deferred."""
    return handler if handler is log_exception else DeferredHandler()


class FailedItem:
    """What the error handler gets for an item that cannot leave its Ray task (not picklable)."""

    def __init__(self, key: Any):
        self.__key__ = key

    def __repr__(self) -> str:
        return f"FailedItem(__key__={self.__key__!r})"


def item_key(item: Any) -> Any:
    """An item's ``__key__`` (a dict's entry or an attribute; None without one)."""
    return item.get("__key__") if isinstance(item, dict) else getattr(item, "__key__", None)


def _picklable(value: Any) -> bool:
    import pickle

    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return True
    except Exception:
        return False


@dataclasses.dataclass
class StageRun:
    """Consecutive-failure bookkeeping of one stage within one segment."""

    stage: str
    tolerance: int
    lead: int = 0
    trail: int = 0
    had_success: bool = False
    failures: int = 0
    ignored: int = 0
    messages: List[str] = dataclasses.field(default_factory=list)
    last_error: str = ""
    #: failures for the user's error handler, which the loader calls (``DeferredHandler``), each
    #: made picklable
    deferred: List[Failure] = dataclasses.field(default_factory=list)
    #: ``(seq, at, message)`` of the lead's failures (as many as ``tolerance``): where a run joined
    #: with the previous segments' becomes too long (``FailureChain``)
    lead_at: List[Tuple[int, Optional[int], str]] = dataclasses.field(default_factory=list)

    def defer(
        self, exc: BaseException, item: Any, sources: Optional[Sequence[Any]], at: Optional[int] = None, seq: Optional[int] = None
    ) -> None:
        trace = format_traceback(exc)
        if not _picklable(exc):
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        if not _picklable(item):
            item = FailedItem(item_key(item))
        sources = list(sources or ())
        seq = next(_SEQ) if seq is None else seq
        self.deferred.append(Failure(exc, item, sources if _picklable(sources) else [], at, seq, trace))

    def success(self) -> None:
        self.had_success = True
        self.trail = 0

    def failure(self, message: str, at: Optional[int] = None, seq: Optional[int] = None) -> None:
        """Count a failure (``at``: its stream position; ``seq``: its number, ``Failure.seq``); raise
        ``FatalSampleError`` when it makes ``tolerance`` in a row."""
        seq = next(_SEQ) if seq is None else seq
        self.failures += 1
        self.trail += 1
        if not self.had_success:
            self.lead += 1
            if len(self.lead_at) <= self.tolerance:  # (one more: ``EmptyRounds`` allows ``tolerance``)
                self.lead_at.append((seq, at, message))
        self.last_error = message
        if len(self.messages) < MAX_REPORTED:
            self.messages.append(message)
        if self.exceeded(self.trail):
            raise FatalSampleError(self.too_many(self.trail))

    def exceeded(self, count: int) -> bool:
        """Whether ``count`` failures in a row are too many."""
        return bool(self.tolerance) and count >= self.tolerance

    def too_many(self, count: int, where: str = "") -> str:
        """The message of ``FatalSampleError`` for ``count`` failures in a row (``where``: of which stream)."""
        return f"{count} consecutive failures in stage {self.stage!r}{where} (failure_tolerance={self.tolerance}); last: {self.last_error}"


class ChainFatal(NamedTuple):
    """Where a joined run of failures became too long: the message of its ``FatalSampleError``, and
    the ``seq``/``at`` of the failure that made it so (as ``Failure``'s; ``at`` None: unknown)."""

    message: str
    seq: float
    at: Optional[int]


class FailureChain:
    """Joins per-segment ``StageRun`` summaries of one worker stream, in stream order (driver side)."""

    def __init__(self) -> None:
        self._runs: Dict[Tuple[int, str], int] = {}

    def check(self, worker: int, run: StageRun) -> Optional[ChainFatal]:
        """Account for one segment's run of ``run.stage``: where the run it continues becomes too long
        (the failure of its lead that makes ``tolerance`` in a row, as Energon raises at that very
        failure), or ``None``."""
        key = (worker, run.stage)
        carried = self._runs.get(key, 0)
        joined = carried + run.lead
        self._runs[key] = run.trail if run.had_success else joined
        if not (run.exceeded(joined) and (run.lead or carried)):
            return None
        n = next((n for n in range(1, run.lead + 1) if run.exceeded(carried + n)), run.lead)
        where = f" of worker stream {worker}"
        if n and n <= len(run.lead_at):
            seq, at, message = run.lead_at[n - 1]
            if run.last_error != message:  # the message names that failure, not the segment's last
                run = dataclasses.replace(run, last_error=message)
            return ChainFatal(run.too_many(carried + n, where), seq + 0.5, at)
        return ChainFatal(run.too_many(joined, where), float("inf"), None)

    def runs_of(self, worker: int) -> Dict[Tuple[int, str], int]:
        """``worker``'s open runs (per stage), to put back with ``put_runs``."""
        return {key: n for key, n in self._runs.items() if key[0] == worker}

    def put_runs(self, worker: int, runs: Dict[Tuple[int, str], int]) -> None:
        """Make ``worker``'s open runs ``runs`` again (from ``runs_of``): its later segments not counted."""
        self._runs = {key: n for key, n in self._runs.items() if key[0] != worker}
        self._runs.update(runs)

    def add(self, worker: int, run: StageRun) -> None:
        """Account for one segment's run of ``run.stage``; raise when the joined run is too long."""
        fatal = self.check(worker, run)
        if fatal is not None:
            raise FatalSampleError(fatal.message)


def _file_of(frame: Any) -> str:
    """The file of ``frame``'s code, also for user code pickled by value: cloudpickle names its code
    ``<dynamic-code>`` and keeps the module's ``__file__`` in the function's globals."""
    filename = frame.f_code.co_filename
    if filename == "<dynamic-code>":
        filename = frame.f_globals.get("__file__") or filename
    return filename


def describe_error(exc: BaseException) -> str:
    """``Type: message`` plus the innermost frame (its file, line and function), for logs that travel
    to the driver."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    if not frames:
        return f"{type(exc).__name__}: {exc}"
    frame, line = frames[-1]
    return f"{type(exc).__name__}: {exc} (at {_file_of(frame)}:{line} in {frame.f_code.co_name})"


def format_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as ``traceback.format_exception`` writes it, each frame with its file and
    source line, also in user code pickled by value (``_file_of``)."""
    shown = traceback.TracebackException(type(exc), exc, exc.__traceback__, lookup_lines=False)
    todo, seen = [(shown, exc)], set()
    while todo:
        summary, error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        for frame_summary, (frame, _) in zip(summary.stack, traceback.walk_tb(error.__traceback__)):
            frame_summary.filename = _file_of(frame)
        todo += [(summary.__cause__, error.__cause__), (summary.__context__, error.__context__)]
    return "".join(shown.format())


class HookRunner:
    """Calls one hook under the policy.

    Args:
        stage: stage name used in messages and counters.
        fn: the hook.
        tolerance: consecutive failures before ``FatalSampleError`` (0 = unlimited).
        handler: ``(exception, item, sources) -> None``; may raise to abort.
        refuse_none: a ``None`` result is the hook's failure (a forgotten ``return``), not an
            item handed on to the next hook, which would fail there or reach the trainer.
    """

    FAILED = object()
    IGNORED = object()

    def __init__(
        self, stage: str, fn: Callable[[Any], Any], tolerance: int, handler: Callable[..., None], refuse_none: bool = False
    ):
        self.stage = stage
        self.fn = fn
        self.tolerance = tolerance
        self.handler = handler
        self.refuse_none = refuse_none
        self.is_generator = inspect.isgeneratorfunction(getattr(fn, "__func__", fn))

    def new_run(self) -> StageRun:
        return StageRun(stage=self.stage, tolerance=self.tolerance)

    def call(self, run: StageRun, item: Any, what: str, sources: Optional[Sequence[Any]] = None, at: Optional[int] = None) -> Any:
        """Run the hook on ``item``: its result, or ``FAILED`` / ``IGNORED``. ``at``: the item's stream
        position (a batch's: its last sample's), where the driver places a failure's handler call."""
        return self._call(run, item, what, sources, many=False, at=at)

    def call_many(
        self, run: StageRun, item: Any, what: str, sources: Optional[Sequence[Any]] = None,
        before_each: Optional[Callable[[int], None]] = None, at: Optional[int] = None,
        after_each: Optional[Callable[[Any], None]] = None,
    ) -> Any:
        """Run a hook that may be a generator: the list of its outputs, or ``FAILED`` / ``IGNORED``.
        ``before_each(n)`` is called before the generator is resumed for its output ``n``;
        ``after_each(output)`` as each output is made, before the generator is resumed (what it
        raises is not the hook's failure: it propagates)."""
        return self._call(run, item, what, sources, many=True, before_each=before_each, at=at, after_each=after_each)

    def _call(
        self, run: StageRun, item: Any, what: str, sources: Optional[Sequence[Any]], many: bool,
        before_each: Optional[Callable[[int], None]] = None, at: Optional[int] = None,
        after_each: Optional[Callable[[Any], None]] = None,
    ) -> Any:
        # a generator that fails (or skips) after some outputs keeps them, as Energon's lazy map does:
        # they were given before it raised
        partial: List[Any] = []
        try:
            result = self.fn(item)
            if result is None and self.refuse_none:
                raise TypeError(f"{self.stage} returned None (a missing `return`?)")
            if many:
                if self.is_generator or inspect.isgenerator(result):
                    result = _drain(result, before_each, partial, after_each)
                else:
                    result = [result]
        except _Escaped as escaped:  # raised by after_each, not by the hook
            raise escaped.error from None
        except SkipSample:
            run.ignored += 1
            return partial or HookRunner.IGNORED
        except SYSTEM_EXCEPTIONS as exc:
            if isinstance(exc, FatalSampleError):
                raise
            raise FatalSampleError(f"{what}: {self.stage} raised a system error: {describe_error(exc)}") from exc
        except Exception as exc:  # the policy: log, count, skip
            if partial:
                run.success()  # its outputs count as successes (the failure after them is the first)
            seq = next(_SEQ)
            if isinstance(self.handler, DeferredHandler):
                run.defer(exc, item, sources, at, seq)
            elif self.handler is not log_exception:
                # a handler that raises aborts loading with its own exception, as in Energon
                self.handler(exc, item, list(sources or ()))
            run.failure(f"{what}: {describe_error(exc)}" + (f" (after {len(partial)} outputs, kept)" if partial else ""), at, seq)
            return partial or HookRunner.FAILED
        run.success()
        return result


class _Escaped(BaseException):
    """What an ``after_each`` callback raised, carried past the hook's own error policy."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


def _drain(
    outputs: Any, before_each: Optional[Callable[[int], None]], out: List[Any], after_each: Optional[Callable[[Any], None]] = None
) -> List[Any]:
    """A generator's outputs, collected into ``out`` (kept if it raises), with ``before_each(n)``
    called before it is resumed for output ``n`` and ``after_each(output)`` after each output."""
    iterator = iter(outputs)
    while True:
        if before_each is not None:
            before_each(len(out))
        try:
            out.append(next(iterator))
        except StopIteration:
            return out
        if after_each is not None:
            try:
                after_each(out[-1])
            except BaseException as exc:  # noqa: B036 (re-raised as it is by the caller)
                raise _Escaped(exc) from None
