"""What a cook function receives besides the crude sample: the dataset's ``aux`` stores (decoded
with the dataset's decoder), ``primary`` (its own dataset) and ``cache`` (the loader's cache pool).

``AuxConfig`` travels inside the stage config to the Ray segment tasks; the stage enters
``cook_context`` around its hooks, and ``TaskEncoder.cook_crude_sample`` / ``TaskEncoder.cache``
read it with :func:`cook_kwargs` / :func:`active_cache_pool`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional

from energon_ray.cache.base import CachePool, FileStore, PrimaryFileStore
from energon_ray.cache.jsonl_store import JsonlFileStore
from energon_ray.cache.stores import DatasetFileStore, DecodeFileStore
from energon_ray.storage import is_remote


@dataclasses.dataclass
class AuxConfig:
    """The auxiliary data of one dataset (picklable: stores are paths, the pool is its settings).

    Args:
        aux: name → store, from the metadataset's ``aux:``.
        primary_path: the dataset's own folder (for ``need_primary`` cookers; a remote one carries the
            settings it was opened with).
        decoder: the dataset's decoder (``None``: aux files come as bytes).
        cache_pool: from ``get_loader(cache_pool=…)``.
        primary_jsonl: the dataset is a ``.jsonl`` file (``primary`` reads its lines by ``"<index>.json"``).
    """

    aux: Dict[str, FileStore] = dataclasses.field(default_factory=dict)
    primary_path: Any = None
    decoder: Any = None
    cache_pool: Optional[CachePool] = None
    primary_jsonl: bool = False

    def __post_init__(self) -> None:
        # made where the loader is built: the config goes to Ray workers, whose current directory is another
        if isinstance(self.primary_path, (str, Path)) and not is_remote(str(self.primary_path)):
            self.primary_path = Path(self.primary_path).absolute()

    def decoded(self, store: FileStore) -> FileStore:
        return store if self.decoder is None else DecodeFileStore(store, decoder=self.decoder)


class _Active(threading.local):
    config: Optional[AuxConfig] = None
    stores: Optional[Dict[str, FileStore]] = None
    primary: Optional[FileStore] = None


_ACTIVE = _Active()


@contextlib.contextmanager
def cook_context(config: Optional[AuxConfig]) -> Iterator[None]:
    """Make ``config`` the auxiliary data of the hooks called inside (this thread)."""
    saved = (_ACTIVE.config, _ACTIVE.stores, _ACTIVE.primary)
    _ACTIVE.config = config
    _ACTIVE.stores = None if config is None else {k: config.decoded(v) for k, v in config.aux.items()}
    _ACTIVE.primary = None
    try:
        yield
    finally:
        _ACTIVE.config, _ACTIVE.stores, _ACTIVE.primary = saved


def active_cache_pool() -> CachePool:
    """The loader's cache pool, inside a hook.

    Raises:
        RuntimeError: outside a loader's hooks, or a loader without ``cache_pool=``.
    """
    config = _ACTIVE.config
    if config is None or config.cache_pool is None:
        raise RuntimeError(
            "no cache pool: pass get_loader(..., cache_pool=FileStoreCachePool(...)) (or NoCachePool()); "
            "the pool is only available inside the task encoder's hooks"
        )
    return config.cache_pool


def need_cache(fn: Callable) -> bool:
    """Whether ``fn`` was declared with ``@cooker(need_cache=True)``."""
    return bool(getattr(fn, "__need_cache__", False))


def need_primary(fn: Callable) -> bool:
    """Whether ``fn`` was declared with ``@cooker(need_primary=True)``."""
    return bool(getattr(fn, "__need_primary__", False))


def cook_aux(cooker: Any) -> Dict[str, FileStore]:
    """The ``aux`` argument of a ``cook_crude_sample(sample, cooker, aux)`` override, as Energon
    passes it: the dataset's aux stores by name (decoded) and, where ``cooker`` needs it,
    ``primary`` (the dataset itself, not yet relative to a sample's key)."""
    aux: Dict[str, FileStore] = dict(_ACTIVE.stores or {})
    if cooker is not None and need_primary(cooker.cook) and "primary" not in aux:
        aux["primary"] = _primary_store(cooker.cook)
    return aux


def _primary_store(fn: Callable) -> FileStore:
    config = _ACTIVE.config
    if config is None or config.primary_path is None:
        raise RuntimeError(f"cooker {getattr(fn, '__name__', fn)!r} needs primary=, which only a loader provides")
    if _ACTIVE.primary is None:
        store = JsonlFileStore if config.primary_jsonl else DatasetFileStore
        _ACTIVE.primary = config.decoded(store(config.primary_path))
    return _ACTIVE.primary


def cook_kwargs(fn: Callable, sample: Mapping[str, Any], aux: Optional[Mapping[str, FileStore]] = None) -> Dict[str, Any]:
    """The keyword arguments of cook function ``fn`` for ``sample``: every aux store by its name
    (``aux``, default: the loader's), plus ``cache`` and ``primary`` when ``fn`` asks for them.

    Raises:
        RuntimeError: ``need_primary`` outside a loader, or ``need_cache`` without a cache pool.
    """
    kwargs: Dict[str, Any] = dict(_ACTIVE.stores or {}) if aux is None else dict(aux)
    if need_cache(fn):
        kwargs["cache"] = active_cache_pool()
    if need_primary(fn):
        if "primary" not in kwargs:
            kwargs["primary"] = _primary_store(fn)
        kwargs["primary"] = PrimaryFileStore(kwargs["primary"], current_key=sample["__key__"])
    return kwargs
