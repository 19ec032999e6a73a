"""``ray_remote_args``: what a loader's Ray tasks may be given, checked before any task is submitted.

Segment tasks take the options Ray Data's read and map tasks take for resources and placement
(``TASK_OPTIONS``); batching and packing tasks only the resources (``GROUP_TASK_OPTIONS``). Any
other key was once dropped silently (``{"num_cpu": 1}`` ran with Ray's default of one CPU):
``check_remote_args`` refuses it, naming the key and the closest accepted one.
"""

from __future__ import annotations

import difflib
import numbers
from typing import Any, Dict, Mapping, Optional, Sequence

#: ``ray_remote_args`` that a plain task takes as Ray Data's read/map tasks do.
TASK_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type", "scheduling_strategy", "label_selector")
#: the ``ray_remote_args`` that batching and packing tasks take (resources only: they run where Ray puts them)
GROUP_TASK_OPTIONS = ("num_cpus", "memory", "resources")
#: options Ray tasks have that the loader sets itself, and why
_OURS = {
    "max_retries": "segment tasks are retried 3 times by the loader's own setting",
    "retry_exceptions": "a failing sample goes to the error handler, not to a task retry",
    "num_returns": "the loader decides what its tasks return",
    "runtime_env": "give it to ray.init (or the job's runtime_env): every task of the job gets it",
}


def check_remote_args(remote_args: Optional[Mapping[str, Any]], name: str = "ray_remote_args") -> Dict[str, Any]:
    """``remote_args`` as a dict, refused where a key is not a task option the loader passes on or a
    resource amount is not a number ≥ 0; errors call it ``name`` (``loader.ray_remote_args`` in the
    training config).

    Raises:
        TypeError: not a mapping.
        ValueError: naming the key or value.

    Example:
        >>> check_remote_args({"num_cpus": 2})
        {'num_cpus': 2}
        >>> check_remote_args({"num_cpu": 2})
        Traceback (most recent call last):
        ...
        ValueError: ray_remote_args: unknown key 'num_cpu' (did you mean 'num_cpus'?); the loader's tasks take num_cpus, num_gpus, memory, resources, accelerator_type, scheduling_strategy, label_selector
    """
    if remote_args is None:
        return {}
    if not isinstance(remote_args, Mapping):
        raise TypeError(f"{name} must be a dict of Ray task options, got {type(remote_args).__name__}")
    out = dict(remote_args)
    for key in out:
        if key in TASK_OPTIONS:
            continue
        why = _OURS.get(key)
        close = difflib.get_close_matches(str(key), TASK_OPTIONS, n=1)
        hint = f" ({why})" if why else f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"{name}: {'unsupported' if why else 'unknown'} key {key!r}{hint}; the loader's tasks take "
            + ", ".join(TASK_OPTIONS)
        )
    for key in ("num_cpus", "num_gpus", "memory"):
        _amount(name, key, out.get(key))
    resources = out.get("resources")
    if resources is not None:
        if not isinstance(resources, Mapping):
            raise ValueError(f"{name}: 'resources' must map resource names to amounts, got {resources!r}")
        for resource, amount in resources.items():
            _amount(name, f"resources[{resource!r}]", amount, optional=False)
    return out


def task_needs(remote_args: Mapping[str, Any], keys=TASK_OPTIONS) -> Dict[str, float]:
    """The resources one task of these options asks Ray for (``CPU`` 1 unless given)."""
    needs: Dict[str, float] = {"CPU": float(remote_args.get("num_cpus", 1) if "num_cpus" in keys else 1)}
    if "num_gpus" in keys and remote_args.get("num_gpus"):
        needs["GPU"] = float(remote_args["num_gpus"])
    if "memory" in keys and remote_args.get("memory"):
        needs["memory"] = float(remote_args["memory"])
    if "resources" in keys:
        needs.update({str(k): float(v) for k, v in (remote_args.get("resources") or {}).items() if v})
    return {k: v for k, v in needs.items() if v}


def _amount(name: str, key: str, value: Any, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
        raise ValueError(f"{name}: {key} must be a number ≥ 0, got {value!r}")


def waits_holding_cpus_only(ray_remote_args: Optional[Dict[str, Any]]) -> bool:
    """Whether a segment task blocked in ``ray.get`` holds nothing another task needs: Ray lends a
    blocked task's CPUs back, not its GPUs, memory or custom resources, nor a place in a placement
    group. Only then may a chained segment's task wait for its carry (``build.LaterCarry``): else a later
    segment could hold what the one before it waits for."""
    options = {k: v for k, v in (ray_remote_args or {}).items() if k in TASK_OPTIONS}
    if any(options.get(key) for key in ("num_gpus", "memory", "resources", "accelerator_type")):
        return False
    return isinstance(options.get("scheduling_strategy", "SPREAD"), str)


def options_for(remote_args: Optional[Dict[str, Any]], keys: Sequence[str]) -> Dict[str, Any]:
    """Those of ``remote_args`` named in ``keys``."""
    return {k: v for k, v in (remote_args or {}).items() if k in keys}


def with_options(task: Any, remote_args: Optional[Dict[str, Any]], keys: Sequence[str]) -> Any:
    """``task`` with those of ``remote_args`` named in ``keys`` (as it is if none)."""
    options = options_for(remote_args, keys)
    return task.options(**options) if options else task
