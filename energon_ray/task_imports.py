"""What a Ray task imports before its first stage: torch and energon_ray's stages, deaf to Ray's
cancel (``signals.deaf_to_cancel``); in a Ray worker with the garbage collector paused while they
load, their objects frozen after. ``ray_env.import_task_modules`` decides when and which; nothing
here imports Ray.
"""

from __future__ import annotations

import importlib

from energon_ray.signals import deaf_to_cancel


def import_without_collections() -> None:
    """``import_stages`` in a Ray worker with the garbage collector paused, then its objects frozen
    (``gc.freeze``): the imports make ~200k objects and no garbage worth collecting, and the full
    collections they trigger cost ~0.3 of a worker's ~3 CPU-s of imports; frozen, the collections
    that the worker's tasks trigger never walk them again. Not in the training process (a cold
    start makes blocks there): its collector is the user's."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        import_stages()
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@deaf_to_cancel
def import_stages() -> None:
    importlib.import_module("torch")
    importlib.import_module("energon_ray.pipeline.batch_stages")  # and the stages it builds on
