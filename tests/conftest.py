"""Shared test set-up: environment for Ray, tiny prepared datasets."""

from __future__ import annotations

import gc
import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Ray Train's controller polls its workers (reports, deaths, the end of a run) every 2 s by default;
# the TorchTrainer tests train a few steps each, and would mostly wait for that poll.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")

import pytest  # noqa: E402

# Parity tests fork Energon's DataLoader workers from this process, which also runs Ray: garbage
# left here (cycles holding Ray ObjectRefs) would be collected in a child (Energon's GcDataset calls
# gc.collect() there), whose ObjectRef finalizers then wait forever on a Ray core-worker lock held
# by a thread that did not survive the fork. Collect it here, before every fork.
os.register_at_fork(before=gc.collect)


@pytest.fixture(scope="session")
def ray_session():
    """Start (once per test session) a private 2-CPU local Ray, as energon_ray starts one for a
    user who has none; shut it down at the end."""
    import ray

    from energon_ray.ray_env import ensure_ray

    if not ray.is_initialized():
        ensure_ray(num_cpus=2, object_store_memory=512 * 1024**2, log_to_driver=False)
    yield
    ray.shutdown()
