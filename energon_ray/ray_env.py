"""Starting or joining Ray: a private local instance unless the user names a cluster."""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Tuple

logger = logging.getLogger("energon_ray")


def verbose() -> bool:
    """Whether the user asked for Ray's own output (``ENERGON_RAY_VERBOSE=1``); quiet by default."""
    return os.environ.get("ENERGON_RAY_VERBOSE", "0").strip().lower() not in ("", "0", "false", "no")


def ensure_ray(address: Optional[str] = None, **init_kwargs: Any) -> None:
    """Make sure Ray is initialized.

    If Ray is already initialized (a ``ray.train`` worker, a notebook that called ``ray.init``), it is
    used as is. Otherwise: an explicit ``address`` or ``RAY_ADDRESS`` attaches to that cluster; without
    one, a private local Ray is started (``address="local"``), so a stray Ray on the same machine is
    never joined by accident.
    """
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        logger.info("energon_ray: attaching to Ray cluster at %s", address)
        ray.init(address=address, **init_kwargs)
        return
    init_kwargs.setdefault("include_dashboard", False)
    init_kwargs.setdefault("configure_logging", True)
    init_kwargs.setdefault("logging_level", logging.INFO if verbose() else logging.WARNING)
    ray.init(address="local", **init_kwargs)


_warmed = False


def warm_up(workers: int = 2) -> None:
    """Get Ray ready for the first batch while the caller does other work (builds its model…).

    Ray workers import torch and energon_ray's stages: several seconds on a small machine that would
    otherwise delay the first batch. Runs once per process, in the background; failures are ignored
    (it is only a head start). The loader's feeder actor starts Ray Data itself.
    """
    global _warmed
    if _warmed:
        return
    _warmed = True
    import ray

    @ray.remote(num_cpus=0)
    def _import() -> bool:
        import torch  # noqa: F401

        import energon_ray.pipeline.stages  # noqa: F401

        return True

    for _ in range(workers):
        _import.remote()


def train_rank_world() -> Optional[Tuple[int, int]]:
    """World rank and size inside a ``ray.train`` worker, else ``None``."""
    try:
        import ray.train

        ctx = ray.train.get_context()
        return int(ctx.get_world_rank()), int(ctx.get_world_size())
    except Exception:  # not inside a Ray Train worker
        return None
