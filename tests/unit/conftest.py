"""The unit tier never starts Ray."""

from __future__ import annotations

import pytest
import ray


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    """Fail loudly if a unit test tries to start Ray."""

    def forbidden(*args, **kwargs):
        raise AssertionError("unit tests must not start Ray; move the test to tests/integration")

    monkeypatch.setattr(ray, "init", forbidden)
