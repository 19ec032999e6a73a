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


_warmed = False


def _import_stages(batch):
    import torch  # noqa: F401

    import energon_ray.pipeline.stages  # noqa: F401

    return batch


def warm_up(workers: int = 2) -> None:
    """Get Ray ready for the first batch while the caller does other work (builds its model…).

    Ray workers import torch and energon_ray, and a tiny Ray Data execution starts Ray Data's own
    actors: together several seconds on a small machine that would otherwise delay the first batch.
    Runs once per process, in the background; failures are ignored (it is only a head start).
    """
    global _warmed
    if _warmed:
        return
    _warmed = True
    import threading

    import ray

    @ray.remote(num_cpus=0)
    def _import() -> bool:
        _import_stages(None)
        return True

    for _ in range(workers):
        _import.remote()

    def _ray_data() -> None:
        try:
            import ray.data

            ray.data.range(1).map_batches(_import_stages, batch_size=None).take_all()
        except Exception:  # only a head start; the real execution reports real problems
            pass

    threading.Thread(target=_ray_data, name="energon-ray-warm-up", daemon=True).start()
