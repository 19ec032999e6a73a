"""The unit tier never starts Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    """Fail loudly if a unit test tries to start Ray."""

    def forbidden(*args, **kwargs):
        raise AssertionError("unit tests must not start Ray; move the test to tests/integration")

    monkeypatch.setattr(ray, "init", forbidden)


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory) -> Path:
    """The AV tests' generated videos and audio files (``test_av_media.write_media_files``), written once
    per test session."""
    from tests.unit.test_av_media import write_media_files

    return write_media_files(tmp_path_factory.mktemp("av_media"))
