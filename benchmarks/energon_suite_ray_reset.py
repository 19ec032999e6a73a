"""A pytest plugin for ``energon_suite.py``: Ray shut down after each test of Energon's suite.

Energon's tests prepare their data in ``setUp`` with Energon's own preparation, which forks worker
processes (``multiprocessing`` "fork", forced). Forked from a process where an earlier test's loader
started Ray (its threads hold locks), those children can die at once and Energon's pool then waits
for them forever (seen: ``test_metadataset``'s ``setUp`` hung in ``AggregatorPool``). Each test
starts from a process without Ray; energon_ray starts its private Ray again when a loader needs it.
"""

from __future__ import annotations

import sys


def pytest_runtest_teardown(item, nextitem) -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
