"""Starting or joining Ray: a private local instance unless the user names a cluster."""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

logger = logging.getLogger("energon_ray")


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
    init_kwargs.setdefault("logging_level", logging.WARNING)
    ray.init(address="local", **init_kwargs)


def warm_up(workers: int = 2) -> None:
    """Start importing torch and energon_ray in Ray workers now, so the first batch waits less."""
    import ray

    @ray.remote(num_cpus=0)
    def _import() -> bool:
        import torch  # noqa: F401

        import energon_ray.pipeline.stages  # noqa: F401

        return True

    for _ in range(workers):
        _import.remote()
