"""Pinned memory for the trainer's batches, copied off the training thread.

On CUDA each finished batch is copied once into pinned (page-locked) memory so the trainer's
host-to-device copy can run asynchronously. ``Pinner`` does those copies in one background thread
per pass. A block that arrives (or a group task's batches: seams, a sample blend's groups;
``chained``) becomes a ``Pinning`` per batch, each linked to the next one of its worker stream
(``successor``), and a block's first batch to the last of the stream's block before it while that
one waits for its turn. Handing a batch out to the trainer (``handed_out``) asks for the copy of its
successor, which the trainer takes about a round of steps later.

The pin thread copies at most ``PIN_AHEAD`` batches not handed out yet. Further asks wait, ordered
by when the trainer will want them: by the step at which their stream's batch before them was handed
out (a round-robin takes each stream again a round after), a stream's first batches first. Pinned
memory is thus a few batches, not a batch per worker stream nor every batch of the blocks that
arrived (torch's host allocator keeps what it pinned, rounded up to a power of two, for the rest of
the process). ``pin_batch`` is looked up on this module at each copy (tests replace it with a
recording copy on CPU-only machines).
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

from energon_ray.samples.base import pin_batch

#: Batches the pin thread copies ahead of the trainer (copies asked for beyond these wait): enough
#: for its copies to keep ahead of the steps, a few batches of pinned memory whatever the workers.
PIN_AHEAD = 4
#: The order of an ask that the trainer wants before any other: a worker stream's first batches, a
#: group task's first (made when the trainer reached it).
FIRST = -1


def pin_now(value: Any) -> Any:
    """``value``'s tensors copied into pinned memory, on the calling thread."""
    return pin_batch(value)


class Pinning:
    """A queued batch to copy into pinned memory: ``start`` asks the pin thread for the copy (once),
    ``result`` gives the copy (``handed_out`` then asks for ``successor``'s, the same worker
    stream's next batch)."""

    __slots__ = ("future", "value", "pinner", "successor", "stream", "asked", "taken", "__weakref__")

    def __init__(self, value: Any, pinner: "Pinner", stream: Optional[Hashable] = None):
        self.future: Optional[Future] = None
        self.value = value
        self.pinner = pinner
        self.successor: Optional["Pinning"] = None
        #: its worker stream's key (``chained``), if known
        self.stream = stream
        #: its copy was asked for (started, or waiting for one of the ``PIN_AHEAD`` places)
        self.asked = False
        #: handed out (``result`` was called)
        self.taken = False

    def start(self, order: int = FIRST) -> None:
        """Ask the pin thread for the copy: at once if a place is free, else before the asks of a
        later ``order`` (the step the trainer is expected to want it a round after)."""
        if not self.asked and not self.taken:
            self.asked = True
            self.pinner.ask(self, order)

    def result(self) -> Any:
        """The pinned copy: the pin thread's, or, if that thread has not started on it (not asked
        yet, waiting for a place, or behind other copies), made here, so a batch never waits behind
        others' copies."""
        self.taken = True
        self.pinner.handed(self)
        future, self.future = self.future, None
        if future is None:
            return pin_now(self.value)
        self.pinner.done(self)
        if future.cancel():
            return pin_now(self.value)
        return future.result()


class Pinner:
    """Copies batches into pinned memory in one background thread, started on first use on the
    training thread's CUDA device: torch copies without holding the GIL, and the copies of the next
    batches overlap the training step (as ``DataLoader``'s pin-memory thread does). At most
    ``ahead`` copies are started and not handed out; the other asks wait (module docstring). A
    batch needed before the thread started on it is copied by the training thread instead
    (``Pinning.result``). Used from the training thread only."""

    def __init__(self, ahead: int = PIN_AHEAD) -> None:
        if ahead < 1:
            raise ValueError(f"Pinner: ahead must be at least 1, not {ahead}")
        self.ahead = ahead
        #: batches handed out so far
        self.steps = 0
        self._pool: Optional[ThreadPoolExecutor] = None
        #: copies started and not handed out (a batch dropped unseen, say skipped after a restore,
        #: leaves this set with its last reference)
        self._started: "weakref.WeakSet[Pinning]" = weakref.WeakSet()
        #: ``(order, ask number, Pinning)`` of the asks waiting for a place (a heap)
        self._waiting: List[Tuple[int, int, "weakref.ref[Pinning]"]] = []
        self._asks = itertools.count()
        #: each worker stream's last batch so far, and the step its last handed out batch went at
        self._tails: "Dict[Hashable, weakref.ref[Pinning]]" = {}
        self._last_out: Dict[Hashable, int] = {}

    def pinning(self, value: Any, stream: Optional[Hashable] = None) -> Pinning:
        """A ``Pinning`` of ``value``, its copy not started."""
        return Pinning(value, self, stream)

    def submit(self, fn: Callable[[Any], Any], value: Any) -> Future:
        if self._pool is None:
            device = _cuda_device()
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="energon_ray_pin", initializer=_use_device, initargs=(device,))
        return self._pool.submit(fn, value)

    def ask(self, pinning: Pinning, order: int) -> None:
        """Start ``pinning``'s copy when a place is free and no ask of an earlier ``order`` waits."""
        heapq.heappush(self._waiting, (order, next(self._asks), weakref.ref(pinning)))
        self._fill()

    def handed(self, pinning: Pinning) -> None:
        """``pinning`` goes to the trainer: one step more."""
        if pinning.stream is not None:
            self._last_out[pinning.stream] = self.steps
        self.steps += 1

    def done(self, pinning: Pinning) -> None:
        """``pinning``'s copy was handed out: its place goes to the first ask still wanted."""
        self._started.discard(pinning)
        self._fill()

    def _fill(self) -> None:
        while self._waiting and len(self._started) < self.ahead:
            pinning = heapq.heappop(self._waiting)[2]()
            if pinning is not None and not pinning.taken:
                self._started.add(pinning)
                pinning.future = self.submit(pin_now, pinning.value)

    def chain(self, stream: Hashable, first: Pinning, last: Pinning) -> None:
        """``first`` to ``last``: ``stream``'s next batches. ``first`` is linked to the stream's
        batch before it while that one waits for its turn (its hand-out asks for ``first``'s copy);
        else its copy is asked for now, in the order of that batch's step (it is the stream's next)."""
        before = self._tails.get(stream)
        self._tails[stream] = weakref.ref(last)
        previous = before() if before is not None else None
        if previous is not None and not previous.taken:
            previous.successor = first
        else:
            first.start(self._last_out.get(stream, FIRST))

    def close(self) -> None:
        """Stops the thread; copies not started are dropped (the pass ended or was abandoned)."""
        self._waiting.clear()
        self._tails.clear()
        self._last_out.clear()
        self._started = weakref.WeakSet()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def chained(pinner: "Pinner", values: List[Any], stream: Optional[Hashable] = None) -> List[Pinning]:
    """``Pinning``s of one worker stream's next batches, in the order the trainer takes them, each
    linked to the next. The first one's copy is asked for now, unless ``stream`` (the worker
    stream's key) has a batch before them still waiting for its turn (``Pinner.chain``)."""
    out = [pinner.pinning(value, stream) for value in values]
    for before, after in zip(out, out[1:]):
        before.successor = after
    if out:
        if stream is None:
            out[0].start()
        else:
            pinner.chain(stream, out[0], out[-1])
    return out


def handed_out(item: Any) -> Any:
    """What the trainer gets for a queued item: a ``Pinning``'s copy (then its successor's copy is
    asked for, in the order of this step: about a round of steps ahead of its turn), anything else
    as it is."""
    if type(item) is not Pinning:
        return item
    pinned = item.result()
    if item.successor is not None:
        item.successor.start(item.pinner.steps - 1)
    return pinned


def _cuda_device() -> Optional[int]:
    """The training thread's CUDA device (the pin thread allocates there, not on device 0)."""
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else None


def _use_device(device: Optional[int]) -> None:
    if device is not None:
        import torch

        torch.cuda.set_device(device)
