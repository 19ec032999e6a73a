"""Pinned memory for the trainer's batches, copied off the training thread.

On CUDA each finished batch is copied once into pinned (page-locked) memory so the trainer's
host-to-device copy can run asynchronously. ``Pinner`` does those copies in one background thread
per pass as a block of batches arrives; the queues hold a ``Pinning`` for each batch and hand out
its copy when the trainer reaches it. ``pin_batch`` is looked up on this module at each copy (tests
replace it with a recording copy on CPU-only machines).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional

from energon_ray.samples.base import pin_batch


def pin_now(value: Any) -> Any:
    """``value``'s tensors copied into pinned memory, on the calling thread."""
    return pin_batch(value)


class Pinning:
    """A queued batch being copied into pinned memory by the pin thread; ``WorkerQueues.pop`` hands
    out the copy (``result``)."""

    __slots__ = ("future", "value", "pin")

    def __init__(self, future: Future, value: Any, pin: Callable[[Any], Any]):
        self.future = future
        self.value = value
        self.pin = pin

    def result(self) -> Any:
        """The pinned copy: the pin thread's, or, if that thread has not started on it yet (busy
        with batches needed later), made here, so a batch never waits behind others' copies."""
        if self.future.cancel():
            return self.pin(self.value)
        return self.future.result()


class Pinner:
    """Copies batches into pinned memory in one background thread, started on first use on the
    training thread's CUDA device: torch copies without holding the GIL, and the copies of the next
    batches overlap the training step (as ``DataLoader``'s pin-memory thread does). A batch needed
    before the thread started on it is copied by the training thread instead (``Pinning.result``)."""

    def __init__(self) -> None:
        self._pool: Optional[ThreadPoolExecutor] = None

    def submit(self, value: Any) -> Pinning:
        if self._pool is None:
            device = _cuda_device()
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="energon_ray_pin", initializer=_use_device, initargs=(device,))
        return Pinning(self._pool.submit(pin_now, value), value, pin_now)

    def close(self) -> None:
        """Stops the thread; copies not started are dropped (the pass ended or was abandoned)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _cuda_device() -> Optional[int]:
    """The training thread's CUDA device (the pin thread allocates there, not on device 0)."""
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else None


def _use_device(device: Optional[int]) -> None:
    if device is not None:
        import torch

        torch.cuda.set_device(device)
