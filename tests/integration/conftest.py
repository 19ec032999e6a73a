"""Tests here share the session's private local Ray."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _ray(ray_session):
    """Every test of this folder runs on the shared Ray."""
    yield
