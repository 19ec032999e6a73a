"""FileStoreCachePool: get / get_lazy / to_cache, LRU eviction under the byte budget, and two real
processes sharing one cache folder."""

from __future__ import annotations

import multiprocessing
import pickle
import time

import pytest

from energon_ray.cache import FileStoreCachePool, SystemFileStore
from energon_ray.cache.disk import DiskCache


@pytest.fixture
def files(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    for name, size in (("a", 1000), ("b", 1000), ("c", 1000), ("d", 1000)):
        (folder / f"{name}.bin").write_bytes(name.encode() * size)
    return SystemFileStore(folder)


def test_get_get_lazy_and_to_cache(files, tmp_path):
    """get/get_lazy return the bytes and append the source; to_cache gives data back once, then deletes its file."""
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c")
    try:
        sample = {"__sources__": ()}
        assert pool.get(files, "a.bin", sample) == b"a" * 1000
        lazy = pool.get_lazy(files, "b.bin")
        lazy.entry.send_to_cache_future.result(timeout=10)
        assert lazy.get(sample) == b"b" * 1000 and lazy.get() == b"b" * 1000
        assert [info.file_names for info in sample["__sources__"]] == [("a.bin",), ("b.bin",)]
        assert pool.current_cache_count == 2
        parked = pool.to_cache({"x": [1, 2]}, "obj")
        path = parked.cache_path
        assert path.parent == pool.cache_dir and path.is_file()
        assert parked.get() == {"x": [1, 2]} and parked.get() == {"x": [1, 2]} and not path.is_file()
        # a lazy pickled into another task carries store and name, and reads through the cache there
        copy = pickle.loads(pickle.dumps(pool.get_lazy(files, "c.bin")))
        assert copy.entry is None and copy.get() == b"c" * 1000 and copy == pool.get_lazy(files, "c.bin")
    finally:
        pool.close()


def test_byte_budget_evicts_least_recently_used(files, tmp_path):
    """With room for two entries, a third evicts the one used longest ago (a hit counts as a use)."""
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c")
    pool.get(files, "a.bin")
    entry_size = pool.current_cache_size
    pool.max_cache_size = 2 * entry_size + 10
    disk: DiskCache = pool._disk
    time.sleep(0.05)
    pool.get(files, "b.bin")
    time.sleep(0.05)
    pool.get(files, "a.bin")  # a hit: b is now the least recently used
    time.sleep(0.05)
    pool.get(files, "c.bin")
    cached = {disk.entry_name(pool._key(files, f"{n}.bin")): n for n in "abc"}
    assert sorted(cached[p.name] for p in pool.cache_dir.iterdir()) == ["a", "c"]
    assert pool.current_cache_count == 2 and pool.current_cache_size == 2 * entry_size
    # an entry larger than the whole budget is served but not cached
    pool.max_cache_size = 100
    assert pool.get(files, "d.bin") == b"d" * 1000 and pool.current_cache_count == 2
    pool.close()


def _child_reads(parent: str, folder: str, names, queue) -> None:
    pool = FileStoreCachePool(parent_cache_dir=parent)
    store = SystemFileStore(folder)
    queue.put([pool.get_lazy(store, n).get() for n in names])
    pool.close()


def test_two_processes_share_one_cache(files, tmp_path):
    """Another process reads an entry this one cached (its source file is gone); two processes filling
    the same names at once read whole, correct files."""
    parent = tmp_path / "c"
    pool = FileStoreCachePool(parent_cache_dir=parent)
    pool.get(files, "a.bin")
    (files.base_dir / "a.bin").unlink()  # from now on only the cache has it
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    names = ["a.bin", "b.bin", "c.bin", "d.bin"]
    procs = [ctx.Process(target=_child_reads, args=(str(parent), str(files.base_dir), names, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    expected = [n[0].encode() * 1000 for n in names]
    assert results == [expected, expected]
    assert pool.current_cache_count == 4
    assert not list((parent / "energon_ray_cache.tmp").iterdir())  # no half-written files left
    pool.close()
