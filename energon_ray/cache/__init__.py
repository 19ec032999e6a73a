"""Auxiliary data for cookers and encoders: file stores, lazy references and cache pools
(``energon_ray.cache`` is ``megatron.energon.cache``).

A metadataset's ``aux:`` names stores (a prepared dataset by ``key.part``, or a ``filesystem://``
folder); a cook function receives them as keyword arguments, and with ``@cooker(need_cache=True)``
also ``cache=``, the pool passed to ``get_loader(cache_pool=…)``.
"""

from energon_ray.cache.base import (
    CachePool,
    FileStore,
    FileStoreDecoder,
    FileStoreWrapper,
    Lazy,
    MockLazy,
    PrimaryFileStore,
    add_source_info,
)
from energon_ray.cache.file_pool import FileCacheLazy, FileStoreCachePool
from energon_ray.cache.parked import CacheFileLazy
from energon_ray.cache.no_cache import DirectLazy, NoCachePool
from energon_ray.cache.stores import DatasetFileStore, DecodeFileStore, SystemFileStore

__all__ = [
    "CacheFileLazy",
    "CachePool",
    "DatasetFileStore",
    "DecodeFileStore",
    "DirectLazy",
    "FileCacheLazy",
    "FileStore",
    "FileStoreCachePool",
    "FileStoreDecoder",
    "FileStoreWrapper",
    "Lazy",
    "MockLazy",
    "NoCachePool",
    "PrimaryFileStore",
    "SystemFileStore",
    "add_source_info",
]
