"""``@stateless`` and ``Cooker``: markers Energon users put on their hooks.

On Ray every hook call is already reseeded from its stream position (see ``context.hook_call``);
an ``encode_sample`` marked ``@stateless(restore_seeds=True)`` is seeded as Energon seeds it (from
the worker seed and ``current_sample_index``), so it draws Energon's numbers. The decorator also
records its options (``failure_tolerance``) for the error policy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def stateless(
    fn: Optional[F] = None, *, restore_seeds: bool = False, failure_tolerance: Optional[int] = None
) -> Any:
    """Mark a hook as deterministic given its inputs (and, with ``restore_seeds``, its position).

    Args:
        restore_seeds: Energon reseeds the RNGs per call only with this flag; energon_ray always
            does, and with the flag (on ``encode_sample``) uses Energon's seed for the sample.
        failure_tolerance: consecutive failures of this hook before ``FatalSampleError`` (0 = never).

    Example:
        >>> @stateless(failure_tolerance=5)
        ... def encode(sample): return sample
        >>> encode.__failure_tolerance__
        5
    """

    def wrap(f: F) -> F:
        f.__stateless__ = True  # type: ignore[attr-defined]
        f.__restore_seeds__ = restore_seeds  # type: ignore[attr-defined]
        if failure_tolerance is not None:
            if not isinstance(failure_tolerance, int) or failure_tolerance < 0:
                raise ValueError(f"stateless(failure_tolerance=...) must be an int >= 0, got {failure_tolerance!r}")
            f.__failure_tolerance__ = failure_tolerance  # type: ignore[attr-defined]
        return f

    if fn is not None:
        return wrap(fn)
    return wrap


def get_stateless(fn: Callable) -> bool:
    """Whether ``fn`` was marked ``@stateless``."""
    return bool(getattr(fn, "__stateless__", False))


def get_failure_tolerance(fn: Callable, default: int) -> int:
    """The hook's own failure tolerance, else ``default``."""
    value = getattr(fn, "__failure_tolerance__", None)
    return default if value is None else int(value)


def cooker(fn: Optional[Callable] = None, *, need_cache: bool = False, need_primary: bool = False) -> Any:
    """Mark a cook function (and whether it needs ``cache=`` / ``primary=`` keyword arguments).

    ``cache`` is the loader's cache pool (``get_loader(cache_pool=…)``); ``primary`` the sample's own
    dataset as a ``FileStore`` (a name starting with ``.`` is relative to the sample's key).
    """

    def wrap(f: Callable) -> Callable:
        f.__need_cache__ = need_cache  # type: ignore[attr-defined]
        f.__need_primary__ = need_primary  # type: ignore[attr-defined]
        return f

    return wrap(fn) if fn is not None else wrap


@dataclasses.dataclass
class Cooker:
    """Turns a ``CrudeSample`` into a typed sample, for crude datasets whose subflavors match.

    Args:
        cook: ``fn(crude_sample) -> Sample``.
        has_subflavors: all of these key/values must be in the sample's ``__subflavors__``.
    """

    cook: Callable[..., Any]
    has_subflavors: Optional[Dict[str, Any]] = None

    @property
    def need_cache(self) -> bool:
        """Whether ``cook`` takes ``cache=`` (declared with ``@cooker(need_cache=True)``)."""
        return bool(getattr(self.cook, "__need_cache__", False))

    @property
    def need_primary(self) -> bool:
        """Whether ``cook`` takes ``primary=`` (declared with ``@cooker(need_primary=True)``)."""
        return bool(getattr(self.cook, "__need_primary__", False))

    def is_match(self, subflavors: Optional[Dict[str, Any]]) -> bool:
        """Whether this cooker applies to a sample with these subflavors."""
        if not self.has_subflavors:
            return True
        subflavors = subflavors or {}
        return all(k in subflavors and subflavors[k] == v for k, v in self.has_subflavors.items())


def basic_sample_keys(crude_sample: Dict[str, Any], additional_source_info: tuple = ()) -> Dict[str, Any]:
    """The meta fields of a crude sample, to forward into the cooked sample."""
    sources = tuple(crude_sample.get("__sources__") or ()) + tuple(additional_source_info)
    given = "__sources__" in crude_sample or additional_source_info  # (an empty tuple stays one, as Energon's)
    return {
        "__key__": crude_sample["__key__"],
        "__restore_key__": crude_sample.get("__restore_key__", ()),
        "__subflavors__": crude_sample.get("__subflavors__"),
        "__sources__": sources if given else None,
    }


