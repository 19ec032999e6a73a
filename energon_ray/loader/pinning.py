"""Pinned memory for the trainer's batches, copied off the training thread.

On CUDA each finished batch is copied once into pinned (page-locked) memory so the trainer's
host-to-device copy can run asynchronously. ``Pinner`` does those copies in one background thread
per pass. A block that arrives (or a group task's batches: seams, a sample blend's groups;
``chained``) becomes a ``Pinning`` per batch, each linked to the next one of its worker stream
(``successor``); the copy of the first batch starts at once, and handing a batch out to the trainer
(``handed_out``) starts the copy of its successor (the trainer takes the worker streams in turn,
so that copy has a whole round of steps to finish). Pinned memory is thus about one batch per worker
stream, not every batch of the blocks that arrived (torch's host allocator keeps what it pinned,
rounded up to a power of two, for the rest of the process). ``pin_batch`` is
looked up on this module at each copy (tests replace it with a recording copy on CPU-only machines).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, List, Optional

from energon_ray.samples.base import pin_batch


def pin_now(value: Any) -> Any:
    """``value``'s tensors copied into pinned memory, on the calling thread."""
    return pin_batch(value)


class Pinning:
    """A queued batch to copy into pinned memory: ``start`` hands the copy to the pin thread (once),
    ``result`` gives the copy (``handed_out`` first starts ``successor``'s, the same worker stream's
    next batch)."""

    __slots__ = ("future", "value", "pinner", "successor")

    def __init__(self, value: Any, pinner: "Pinner"):
        self.future: Optional[Future] = None
        self.value = value
        self.pinner = pinner
        self.successor: Optional["Pinning"] = None

    def start(self) -> None:
        """Have the pin thread copy it (from now, behind the copies already asked for)."""
        if self.future is None:
            self.future = self.pinner.submit(pin_now, self.value)

    def result(self) -> Any:
        """The pinned copy: the pin thread's, or, if that thread has not started on it (not asked
        yet, or busy with other batches), made here, so a batch never waits behind others' copies."""
        if self.future is None or self.future.cancel():
            return pin_now(self.value)
        return self.future.result()


class Pinner:
    """Copies batches into pinned memory in one background thread, started on first use on the
    training thread's CUDA device: torch copies without holding the GIL, and the copies of the next
    batches overlap the training step (as ``DataLoader``'s pin-memory thread does). A batch needed
    before the thread started on it is copied by the training thread instead (``Pinning.result``)."""

    def __init__(self) -> None:
        self._pool: Optional[ThreadPoolExecutor] = None

    def pinning(self, value: Any) -> Pinning:
        """A ``Pinning`` of ``value``, its copy not started."""
        return Pinning(value, self)

    def submit(self, fn: Callable[[Any], Any], value: Any) -> Future:
        if self._pool is None:
            device = _cuda_device()
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="energon_ray_pin", initializer=_use_device, initargs=(device,))
        return self._pool.submit(fn, value)

    def close(self) -> None:
        """Stops the thread; copies not started are dropped (the pass ended or was abandoned)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def chained(pinner: "Pinner", values: List[Any]) -> List[Pinning]:
    """``Pinning``s of one worker stream's next batches, in the order the trainer takes them: each
    linked to the next, the first one's copy started."""
    out = [pinner.pinning(value) for value in values]
    for before, after in zip(out, out[1:]):
        before.successor = after
    if out:
        out[0].start()
    return out


def handed_out(item: Any) -> Any:
    """What the trainer gets for a queued item: a ``Pinning``'s copy (its successor's copy started
    first, a round of steps ahead of its turn), anything else as it is."""
    if type(item) is not Pinning:
        return item
    if item.successor is not None:
        item.successor.start()
    return item.result()


def _cuda_device() -> Optional[int]:
    """The training thread's CUDA device (the pin thread allocates there, not on device 0)."""
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else None


def _use_device(device: Optional[int]) -> None:
    if device is not None:
        import torch

        torch.cuda.set_device(device)
