"""Tests here share the session's private local Ray."""

from __future__ import annotations

import gc
import importlib

import pytest


@pytest.fixture(autouse=True)
def _ray(ray_session):
    """Every test of this folder runs on the shared Ray."""
    yield


@pytest.fixture(autouse=True)
def _frozen_heap():
    """Energon's DataLoader workers fork this process, and the session's conftest collects garbage
    before every fork: a full collection of everything this process holds (~0.15-0.25 s; these
    tests fork ~150 times). What lives when a test starts (torch, Ray, Energon, the module's
    fixtures) is frozen for the test: those collections skip it, here and in the forked workers.
    (Energon unfreezes when a loader iterated in this process ends; later forks of that test
    collect in full again.) Unfrozen after the test, so nothing stays uncollectable."""
    importlib.import_module("megatron.energon")  # imported first, so that its objects are frozen too

    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
