"""Process pools for preparing and checking datasets, safe to start from any process."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import threading
from typing import Any, Callable, Optional, Tuple


def threads_running() -> int:
    """Threads of this process, native ones included (Ray's, torch's OpenMP pool), where the platform
    shows them (``/proc/self/task``); Python's own count elsewhere."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def process_pool(max_workers: int, initializer: Optional[Callable[..., Any]] = None, initargs: Tuple = ()) -> concurrent.futures.ProcessPoolExecutor:
    """A process pool of ``max_workers``, forked only from a single-threaded process.

    A forked child inherits the locks other threads held at the fork and never sees them released:
    after ``ray.init`` or a decode with torch in this process (a notebook that built a loader, then
    prepares a dataset) a forked worker can hang for good. With other threads running, the workers
    come from a fresh server process instead (``forkserver``: their functions and arguments are
    pickled), otherwise from the platform's default start method (fork on Linux: they start at once).
    """
    context = None
    if threads_running() > 1 and multiprocessing.get_start_method() == "fork":
        context = multiprocessing.get_context("forkserver")
    return concurrent.futures.ProcessPoolExecutor(max_workers=max_workers, mp_context=context, initializer=initializer, initargs=initargs)


#: Most processes the commands start by default (as Energon's ``--num-workers`` default).
MAX_DEFAULT_WORKERS = 16


def default_workers() -> int:
    """``min(16, CPUs this process may run on)``: the ``--num-workers`` default of ``prepare`` and
    ``prepare-media`` (Energon's is 16 on any machine; a small box is not oversubscribed)."""
    try:
        cpus = len(os.sched_getaffinity(0))  # a container's or taskset's CPUs, not the host's
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_WORKERS, cpus))
