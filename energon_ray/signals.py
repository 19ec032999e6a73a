"""SIGINT around Ray's cancel, and the logging locks an interrupted task leaves held.

Ray cancels a running task (``ray.cancel``; Ray Data when it closes an execution) by sending SIGINT
to the worker's main thread: a ``KeyboardInterrupt`` wherever the task is. Our task bodies run deaf
to it (``deaf_to_cancel``) and first release locks an earlier, interrupted task of the same worker
left held (``release_leaked_logging_locks``). A private Ray started while SIGINT is ignored would
hand that to every worker, so ``ray_env.ensure_ray`` starts it inside ``sigint_at_default``.
Nothing here imports Ray.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
from typing import Any, Callable, Iterator

logger = logging.getLogger("energon_ray")


@contextlib.contextmanager
def _sigint(handler: Any) -> Iterator[None]:
    """SIGINT set to ``handler`` in the main thread while the block runs, then what it was (signal
    dispositions are the main thread's to set: elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def sigint_at_default() -> "contextlib.AbstractContextManager[None]":
    """SIGINT at Python's default while the block runs, where it was ignored: processes started in
    the block (a private Ray: its raylet, and through it every worker) inherit an ignored SIGINT,
    and ``ray.cancel`` of any of their tasks then does nothing. A handler of the user's stays."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return contextlib.nullcontext()
    return _sigint(signal.default_int_handler)


def deaf_to_cancel(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` with SIGINT ignored in the main thread (restored after): Ray's cancel of a running
    task raises ``KeyboardInterrupt`` wherever the task is, which can leave a lock held (see
    ``release_leaked_logging_locks``) or a module half imported in a worker Ray reuses. Our tasks
    finish their segment instead (a closed execution's output is not read, and tasks not yet started
    read nothing: ``ray_env.mark_closed``). Restored after each call, so other tasks in the same
    worker process stay cancellable."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _sigint(signal.SIG_IGN):
            return fn(*args, **kwargs)

    return run


def release_leaked_logging_locks() -> int:
    """Release the logging locks this thread holds although it is in no logging call; returns how many.

    A ``KeyboardInterrupt`` (Ray's cancel) that lands right after ``logging`` took its module lock
    (``logging._acquireLock``, before the ``try`` that releases it) or a handler's lock leaves that
    lock held by the main thread for good. Ray reuses the process: the next task's reader threads
    then block forever on their first log call (seen in CI: a remote read's botocore debug call, the
    suite hung). Our tasks call this first, where the main thread is in no logging call, so any lock
    it holds is such a leftover.
    """
    locks = [getattr(logging, "_lock", None)]
    for ref in list(getattr(logging, "_handlerList", ())):
        handler = ref()
        if handler is not None:
            locks.append(handler.lock)
    released = 0
    for lock in locks:
        owned = getattr(lock, "_is_owned", None)
        while owned is not None and owned():
            lock.release()
            released += 1
    if released:
        logger.warning("energon_ray: released %d logging lock(s) an interrupted task left held in this worker", released)
    return released
