"""Which sample or batch a hook is working on (``current_sample_index`` / ``current_batch_index``).

Stages set these before calling a hook; nothing here depends on Ray.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
from typing import Iterator, Optional, Tuple

import numpy as np
import torch

_local = threading.local()


def _slot() -> Tuple[int, int]:
    return getattr(_local, "slot", (0, 1))


def rank_index(local: int) -> int:
    """A worker stream's ``local`` sample or batch index as Energon counts it within the rank: the
    rank's workers interleaved (``local × workers + worker``, see ``worker_slot``)."""
    worker, workers = _slot()
    return local * workers + worker


@contextlib.contextmanager
def worker_slot(worker: int, workers: int) -> Iterator[None]:
    """Hooks called inside run for logical worker ``worker`` of the rank's ``workers``: their
    ``current_sample_index`` and ``current_batch_index`` count as Energon's do (the rank's workers
    take turns: worker 1's first batch is batch 1), and Energon's per-sample seeds follow."""
    prev = _slot()
    _local.slot = (int(worker), max(1, int(workers)))
    try:
        yield
    finally:
        _local.slot = prev


def current_sample_index() -> int:
    """Index of the sample the current hook is processing, as Energon counts it in the rank (the
    position in its worker stream, interleaved with the rank's other workers: ``rank_index``)."""
    value = getattr(_local, "sample_index", None)
    if value is None:
        raise RuntimeError("current_sample_index is only available inside a task-encoder hook of a running loader")
    return rank_index(value)


def current_batch_index() -> int:
    """Index of the batch the current hook is building (or its sample will go into), as Energon
    counts it in the rank (``rank_index`` of the batch's index in its worker stream)."""
    value = getattr(_local, "batch_index", None)
    if value is None:
        raise RuntimeError("current_batch_index is only available inside a task-encoder hook of a running loader")
    return rank_index(value)


def set_batch_index(value: int) -> None:
    """Change the batch index the running hook call reads (a generator ``encode_sample`` between two
    of its outputs: each output's batch is the one it goes into)."""
    _local.batch_index = value


def hook_seed(worker_seed: int, kind: Optional[str], index: int) -> int:
    """32-bit seed of one hook call: a pure function of the stream seed, the hook kind and the position.

    ``kind=None``: the seed Energon gives a ``@stateless(restore_seeds=True)`` hook, from the worker
    seed and the sample index alone (the first four bytes of the SHA-1 of ``"seed|index"``, big
    endian), so such a hook draws Energon's random numbers for the same sample."""
    text = f"{worker_seed}|{index}" if kind is None else f"{worker_seed}|{kind}|{index}"
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:4], "big")


class hook_call:  # noqa: N801 (used as a context manager, like the functions above)
    """Seed python/numpy/torch RNGs for one hook call (from ``seed_index``) and expose its indices.

    Seeding every call from its position is what makes augmentations identical whichever Ray
    process runs the call. ``restore_rng`` puts the caller's RNG state back afterwards (used when a
    hook runs in the trainer process). A class rather than a generator: it runs around every hook
    call of every sample.

    Example:
        >>> with hook_call(7, "encode", 3, sample_index=3):
        ...     current_sample_index()
        3
    """

    __slots__ = ("_seed", "_indices", "_saved", "_restore_rng", "_prev")

    def __init__(
        self,
        worker_seed: int,
        kind: Optional[str],
        seed_index: int,
        *,
        sample_index: Optional[int] = None,
        batch_index: Optional[int] = None,
        restore_rng: bool = False,
    ):
        # Energon's seed of a restore_seeds hook counts the sample in the rank (current_sample_index)
        self._seed = hook_seed(worker_seed, kind, rank_index(seed_index) if kind is None else seed_index)
        self._indices = (sample_index, batch_index)
        self._restore_rng = restore_rng

    def __enter__(self) -> None:
        seed = self._seed
        self._saved = (random.getstate(), np.random.get_state(), torch.get_rng_state()) if self._restore_rng else None
        random.seed(seed)
        np.random.seed(seed)
        # The CPU generator only: torch.manual_seed also queues CUDA seeding with a captured stack
        # trace per call (~1 ms), which would dominate a per-sample hook.
        torch.default_generator.manual_seed(seed)
        local = _local.__dict__
        self._prev = (local.get("sample_index"), local.get("batch_index"))
        local["sample_index"], local["batch_index"] = self._indices

    def __exit__(self, *exc_info: object) -> None:
        _local.sample_index, _local.batch_index = self._prev
        saved = self._saved
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])
