"""What our Ray tasks do first in a reused worker process (no Ray needed to check it)."""

from __future__ import annotations

import logging
import os
import threading
import uuid

import pytest

from energon_ray.ray_env import import_task_modules


def _held_by_this_thread(lock) -> bool:
    return lock._is_owned()


def test_a_task_start_releases_logging_locks_an_interrupted_task_left_held():
    """A KeyboardInterrupt (Ray's cancel) right after logging took its module lock, or a handler's,
    leaves them held by the main thread; another thread's first log call then blocks for good. The
    entry every task of ours calls releases them, so a reader thread can log again."""
    handler = logging.StreamHandler()
    logging.getLogger("energon_ray_test_leak").addHandler(handler)
    logging._lock.acquire()  # as the interrupt leaves them (inside logging._acquireLock)
    handler.acquire()
    try:
        import_task_modules()
        assert not _held_by_this_thread(logging._lock) and not _held_by_this_thread(handler.lock)

        done = threading.Event()

        def reader():
            logging.getLogger(f"energon_ray_test_{uuid.uuid4().hex}")  # takes logging's module lock
            handler.acquire()
            handler.release()
            done.set()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        assert done.wait(5), "a reader thread blocked on a logging lock the main thread still held"
    finally:
        while _held_by_this_thread(logging._lock):
            logging._lock.release()
        while _held_by_this_thread(handler.lock):
            handler.release()
        logging.getLogger("energon_ray_test_leak").removeHandler(handler)


@pytest.mark.parametrize("value,mode", [("", "auto"), ("1", "auto"), (" ON ", "auto"), ("auto", "auto"), ("0", "off"),
                                        ("no", "off"), ("False", "off"), ("off", "off"), ("always", "always")])  # fmt: skip
def test_local_start_mode_reads_the_environment(monkeypatch, value, mode):
    from energon_ray.pipeline.local_start import local_start_mode

    monkeypatch.setenv("ENERGON_RAY_LOCAL_START", value)
    assert local_start_mode() == mode


def test_a_worker_nice_that_is_no_number_is_named_in_a_warning_and_changes_nothing(monkeypatch, caplog):
    """``ENERGON_RAY_WORKER_NICE=abc``: a warning naming the variable and its value; the priority stays."""
    import os

    import energon_ray.ray_env as ray_env

    monkeypatch.setenv("ENERGON_RAY_WORKER_NICE", "abc")
    monkeypatch.setattr(ray_env, "_gave_way", False)
    mine = os.nice(0)
    with caplog.at_level(logging.WARNING, logger="energon_ray"):
        ray_env.give_way()
    assert "ENERGON_RAY_WORKER_NICE='abc' is not a number" in caplog.text
    assert os.nice(0) == mine


def test_memory_a_local_block_left_free_goes_back_to_the_system():
    """``give_back_memory`` (after a block made in the trainer at a cold start): what Arrow's pool
    and glibc's heap hold free is returned, not kept for the process's life."""
    import numpy as np
    import pyarrow as pa

    from energon_ray.pipeline.local_start import give_back_memory

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    give_back_memory()
    base = rss_mib()
    block = pa.allocate_buffer(256 << 20)  # a block's serialized batches
    np.frombuffer(block, dtype=np.uint8)[:] = 1
    buffers = [bytes(np.full(4000, i % 251, dtype=np.uint8)) for i in range(50000)]  # decoding's buffers
    assert rss_mib() > base + 400
    del block, buffers
    give_back_memory()
    assert rss_mib() < base + 64
