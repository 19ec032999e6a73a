"""One ``FileStoreCachePool`` per process: the registry an unpickled pool is found again in, and
every pool's reset in a forked child (see :mod:`energon_ray.cache.file_pool`)."""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import Future
from typing import TYPE_CHECKING, Dict, Optional

if TYPE_CHECKING:
    from energon_ray.cache.file_pool import FileStoreCachePool

#: this process's pools by token (see ``FileStoreCachePool.__reduce__``)
_POOLS: Dict[str, "FileStoreCachePool"] = {}
_POOLS_LOCK = threading.Lock()


def register(token: str, pool: "FileStoreCachePool") -> None:
    """Make ``pool`` this process's pool for ``token``."""
    with _POOLS_LOCK:
        _POOLS[token] = pool
    _ALL_POOLS.add(pool)


def registered(token: str) -> Optional["FileStoreCachePool"]:
    """This process's pool for ``token``, or ``None``."""
    with _POOLS_LOCK:
        return _POOLS.get(token)


def unregister(token: str, pool: "FileStoreCachePool") -> None:
    """Forget ``pool`` as the pool for ``token`` (a closed pool); another pool of it stays."""
    with _POOLS_LOCK:
        if _POOLS.get(token) is pool:
            del _POOLS[token]


def _reset_after_fork() -> None:
    """In a forked child: none of the parent's fetch threads exist, its buffered files are the
    parent's; every pool starts an empty buffer of its own (its lazies read directly)."""
    global _POOLS_LOCK
    _POOLS_LOCK = threading.Lock()  # another thread may have held it at the fork
    _POOLS.clear()
    for pool in list(_ALL_POOLS):
        pool._lock = threading.RLock()
        pool._space = threading.Condition(pool._lock)
        pool._executor = None
        for entry in list(pool._pending.values()):
            done: Future = Future()
            done.cancel()
            entry.send_to_cache_future, entry.cache_path = done, None
        pool._pending.clear()
        pool.current_cache_size = pool.current_cache_count = 0
        pool._cache_dir = None  # made on first use
        if not pool._closed:
            with _POOLS_LOCK:
                _POOLS[pool._token] = pool


#: every pool of this process (for ``_reset_after_fork``)
_ALL_POOLS: "weakref.WeakSet[FileStoreCachePool]" = weakref.WeakSet()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
