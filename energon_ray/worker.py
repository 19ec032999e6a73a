"""``WorkerConfig``: which rank this loader is, and how many logical sample streams it runs."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Callable, Optional

from energon_ray.errors import first_time, log_exception, logger, reraise_exception
from energon_ray.ray_env import train_rank_world


@dataclasses.dataclass(kw_only=True, eq=False)
class WorkerConfig:
    """Rank, world size and logical worker count of one data-parallel consumer.

    ``num_workers`` keeps Energon's meaning: the number of independent sample streams per rank
    (0 means one stream, as with Energon's in-process loading). On Ray the streams are not processes:
    each one is a deterministic sequence whose segments run as Ray tasks anywhere in the cluster.

    Example:
        >>> WorkerConfig(rank=0, world_size=2, num_workers=2).global_worker_id(1)
        1
    """

    rank: int
    world_size: int
    num_workers: int
    data_parallel_group: Any = None
    seed_offset: int = 0
    worker_debug_path: Optional[str] = None
    worker_log_level: int = 0
    global_error_handler: Callable[..., None] = log_exception
    restore_error_handler: Callable[..., None] = reraise_exception

    def __post_init__(self) -> None:
        for name in ("rank", "world_size", "num_workers", "seed_offset"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"WorkerConfig.{name} must be an int, got {value!r}")
        if self.world_size < 1:
            raise ValueError(f"WorkerConfig.world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"WorkerConfig.rank must be in [0, {self.world_size}), got {self.rank}")
        if self.num_workers < 0:
            raise ValueError(f"WorkerConfig.num_workers must be >= 0, got {self.num_workers}")
        for name, unset in (("worker_debug_path", None), ("worker_log_level", 0)):
            if getattr(self, name) != unset and first_time("ignored keyword", ("WorkerConfig", name)):
                logger.warning(
                    "WorkerConfig(): %s= is a megatron.energon option for its workers' debug log, which energon_ray "
                    "does not write; ignored (loader.stats and loader.ray_stats() describe the Ray tasks)", name,
                )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkerConfig):
            return NotImplemented
        return (self.rank, self.world_size, self.num_workers) == (
            other.rank,
            other.world_size,
            other.num_workers,
        )

    def __hash__(self) -> int:
        return hash((self.rank, self.world_size, self.num_workers))

    @property
    def safe_num_workers(self) -> int:
        """Number of logical streams on this rank (``num_workers`` 0 still runs one)."""
        return max(1, self.num_workers)

    def global_worker_id(self, local_worker_id: int = 0) -> int:
        """Global id of a local stream: ``rank * num_workers + local_worker_id`` (``rank`` if 0 workers)."""
        if self.num_workers == 0:
            return self.rank
        return self.rank * self.num_workers + local_worker_id

    def worker_seed(self, local_worker_id: int = 0) -> int:
        """The 32-bit seed of a stream, derived exactly as Energon derives it."""
        gid = self.global_worker_id(local_worker_id)
        digest = hashlib.sha1(f"{gid},{self.seed_offset}".encode()).digest()
        return int.from_bytes(digest, "big") & 0xFFFFFFFF

    def config(self) -> dict[str, Any]:
        """A JSON-able description, as Energon's (``data_parallel_group``: its size, or ``None``)."""
        group = self.data_parallel_group
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "data_parallel_group": group.size() if group is not None else None,
        }

    @staticmethod
    def default_worker_config(num_workers: int = 4, data_parallel_group: Any = None) -> "WorkerConfig":
        """Rank and world size from ``ray.train`` (inside a trainer), torch.distributed, ``$RANK`` and
        ``$WORLD_SIZE``, or 0 of 1."""
        rank, world_size = _detect_rank_world()
        return WorkerConfig(
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            data_parallel_group=data_parallel_group,
        )


def _detect_rank_world() -> tuple[int, int]:
    from_train = train_rank_world()
    if from_train is not None:
        return from_train
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _rank_world_from_env(os.environ["RANK"], os.environ["WORLD_SIZE"])
    return 0, 1


def _rank_world_from_env(rank: str, world_size: str) -> tuple[int, int]:
    """``$RANK`` and ``$WORLD_SIZE`` as the default rank and world size, checked.

    Raises:
        ValueError: naming both variables and their values when they are no such pair.
    """
    try:
        pair = int(rank), int(world_size)
    except ValueError:
        pair = None
    if pair is None or not 0 <= pair[0] < pair[1]:
        raise ValueError(
            f"the environment's RANK={rank!r} and WORLD_SIZE={world_size!r} (the default WorkerConfig's rank and "
            "world size) must be whole numbers with 0 <= RANK < WORLD_SIZE; fix them, or pass a worker_config"
        )
    return pair
