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


def test_sigint_is_ignored_only_inside_our_task_bodies_and_heard_while_a_private_ray_starts():
    """``deaf_to_cancel``: SIGINT ignored while the body runs (a cancel is dropped), the handler
    before it back after, also when the body raises. ``sigint_at_default``: where SIGINT is ignored,
    Python's default while the block runs (what a private Ray's processes inherit), ignored again
    after; a handler of the user's is left in place. Outside the main thread neither changes it."""
    import signal

    from energon_ray.signals import deaf_to_cancel, sigint_at_default

    def mine(signum, frame):  # a handler of the user's
        pass

    before = signal.signal(signal.SIGINT, mine)
    try:
        seen = []
        deaf_to_cancel(lambda: seen.append(signal.getsignal(signal.SIGINT)))()
        assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) is mine

        def fails():
            raise ValueError("in the body")

        with pytest.raises(ValueError, match="in the body"):
            deaf_to_cancel(fails)()
        assert signal.getsignal(signal.SIGINT) is mine

        with sigint_at_default():
            assert signal.getsignal(signal.SIGINT) is mine
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with sigint_at_default():
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, mine)
        elsewhere = []  # outside the main thread (Ray's threaded actors) nothing can change
        thread = threading.Thread(target=deaf_to_cancel(lambda: elsewhere.append(signal.getsignal(signal.SIGINT))))
        thread.start()
        thread.join()
        assert elsewhere == [mine] and signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_cluster_address_nothing_listens_on_is_named_at_once():
    """A host:port that refuses connections: a ConnectionError naming the address and what to do
    (ensure_ray checks before ray.init, which retried the GCS there without end: see
    test_prepare_job); addresses Ray resolves itself (auto, ray://) are left to Ray, a listening port passes."""
    import socket
    import time

    from energon_ray.ray_env import check_reachable

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ConnectionError, match=rf"^energon_ray: no Ray cluster at 127\.0\.0\.1:{port} \(Connection refused\): start one"):
            check_reachable(f"127.0.0.1:{port}")
        assert time.monotonic() - started < 5
        sock.listen()
        check_reachable(f"127.0.0.1:{port}")
    check_reachable("auto")
    check_reachable(f"ray://127.0.0.1:{port}")
