"""Which sample or batch a hook is working on (``current_sample_index`` / ``current_batch_index``).

Stages set these before calling a hook; nothing here depends on Ray.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
from typing import Iterator, Optional

import numpy as np
import torch

_local = threading.local()


def current_sample_index() -> int:
    """Stream position of the sample the current hook is processing."""
    value = getattr(_local, "sample_index", None)
    if value is None:
        raise RuntimeError("current_sample_index is only available inside a task-encoder hook of a running loader")
    return value


def current_batch_index() -> int:
    """Index of the batch the current hook is building (per logical worker stream)."""
    value = getattr(_local, "batch_index", None)
    if value is None:
        raise RuntimeError("current_batch_index is only available inside a task-encoder hook of a running loader")
    return value


def hook_seed(worker_seed: int, kind: str, index: int) -> int:
    """32-bit seed of one hook call: a pure function of the stream seed, the hook kind and the position."""
    digest = hashlib.sha1(f"{worker_seed}|{kind}|{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


@contextlib.contextmanager
def hook_call(
    worker_seed: int,
    kind: str,
    seed_index: int,
    *,
    sample_index: Optional[int] = None,
    batch_index: Optional[int] = None,
    restore_rng: bool = False,
) -> Iterator[None]:
    """Seed python/numpy/torch RNGs for one hook call (from ``seed_index``) and expose its indices.

    Seeding every call from its position is what makes augmentations identical whichever Ray
    process runs the call. ``restore_rng`` puts the caller's RNG state back afterwards (used when a
    hook runs in the trainer process).
    """
    seed = hook_seed(worker_seed, kind, seed_index)
    saved = None
    if restore_rng:
        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    random.seed(seed)
    np.random.seed(seed)
    # The CPU generator only: torch.manual_seed also queues CUDA seeding with a captured stack
    # trace per call (~1 ms), which would dominate a per-sample hook.
    torch.default_generator.manual_seed(seed)
    prev = (getattr(_local, "sample_index", None), getattr(_local, "batch_index", None))
    _local.sample_index = sample_index
    _local.batch_index = batch_index
    try:
        yield
    finally:
        _local.sample_index, _local.batch_index = prev
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])
