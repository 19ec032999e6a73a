"""What the wrappers that run in the loader process share (``blend.buffered``): their checks of
Energon's arguments, and their user functions run under the error policy, failures counted in the
loader's stats.
"""

from __future__ import annotations

from typing import Any, Callable, List

from energon_ray.blend.base import PassContext
from energon_ray.blend.epoch_map import Wrapper
from energon_ray.errors import check_keywords, log_exception
from energon_ray.pipeline.policy import HookRunner


def check_worker_config(wrapper: Wrapper, worker_config: Any) -> None:
    """A wrapper's own ``worker_config`` argument must be its dataset's (or ``None``)."""
    if worker_config is not None and worker_config != wrapper.worker_config:
        raise ValueError(f"{type(wrapper).__name__}: worker_config differs from the dataset's WorkerConfig")


def ignored(where: str, **options: Any) -> None:
    """Warn once about Energon-only options given a non-default value (they tune Energon's internals)."""
    given = {name: value for name, value in options.items() if value not in (None, False)}
    check_keywords(where, given, tuple(given))


def check_size(where: str, name: str, value: Any) -> None:
    """``value`` (a size option called ``name`` of ``where``) must be a positive int."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: {name} must be a positive int, got {value!r}")


def count_failure(ctx: PassContext, kind: str, stage: str) -> None:
    """One more ``kind`` (``"skipped"`` or ``"ignored"``) item of ``stage`` in the loader's stats."""
    if ctx.stats is not None:
        counter = getattr(ctx.stats, kind)
        counter[stage] = counter.get(stage, 0) + 1


def hook_runner(wrapper: Wrapper, stage: str, fn: Callable[[Any], Any], tolerance: int) -> HookRunner:
    """A runner of the wrapper's function ``fn`` under its ``WorkerConfig``'s error handler."""
    return HookRunner(stage, fn, tolerance, getattr(wrapper.worker_config, "global_error_handler", log_exception))


def hook_outputs(ctx: PassContext, runner: HookRunner, run: Any, item: Any, what: str, many: bool = True) -> List[Any]:
    """The hook's outputs for ``item`` ([] when it failed or raised ``SkipSample``, counted)."""
    out = runner.call_many(run, item, what) if many else runner.call(run, item, what)
    if out is HookRunner.FAILED:
        count_failure(ctx, "skipped", runner.stage)
        return []
    if out is HookRunner.IGNORED:
        count_failure(ctx, "ignored", runner.stage)
        return []
    return out if many else [out]
