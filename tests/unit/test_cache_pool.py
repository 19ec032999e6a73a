"""FileStoreCachePool: the prefetch buffer (shared entries with reference counts, files deleted once
read, fetches waiting in order for room, direct reads that requeue), the node cache under it (LRU
eviction, two real processes sharing it), and one pool per process after pickling or forking."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import time

import pytest

from energon_ray.cache import FileStoreCachePool, SystemFileStore
from energon_ray.cache.disk import DiskCache


@pytest.fixture
def files(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    for name, size in (("a", 1000), ("b", 1000), ("c", 1000), ("d", 1000), ("e", 500)):
        (folder / f"{name}.bin").write_bytes(name.encode() * size)
    return SystemFileStore(folder)


def buffered(pool):
    return sorted(p.name for p in pool.cache_dir.iterdir())


def wait_until(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def test_get_get_lazy_and_to_cache(files, tmp_path):
    """get/get_lazy return the bytes and append the source; a read lazy's buffered file is gone, the
    node cache keeps both files; to_cache gives data back once, then deletes its file."""
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c")
    try:
        sample = {"__sources__": ()}
        assert pool.get(files, "a.bin", sample) == b"a" * 1000
        assert pool.current_cache_count == 0 and buffered(pool) == []  # get does not use the buffer
        lazy = pool.get_lazy(files, "b.bin")
        assert lazy.entry.send_to_cache_future.result(timeout=10) is True
        assert pool.current_cache_count == 1 and pool.current_cache_size == 1000 and len(buffered(pool)) == 1
        assert lazy.get(sample) == b"b" * 1000 and lazy.get() == b"b" * 1000
        assert [info.file_names for info in sample["__sources__"]] == [("a.bin",), ("b.bin",)]
        assert (pool.current_cache_count, pool.current_cache_size, buffered(pool)) == (0, 0, [])
        assert pool.node_cache_count == 2
        parked = pool.to_cache({"x": [1, 2]}, "obj")
        path = parked.cache_path
        assert path.parent == pool.cache_dir and path.is_file()
        assert parked.get() == {"x": [1, 2]} and parked.get() == {"x": [1, 2]} and not path.is_file()
        # a lazy pickled into another task carries store and name, and reads through the pool there
        copy = pickle.loads(pickle.dumps(pool.get_lazy(files, "c.bin")))
        assert copy.entry is None and copy.get() == b"c" * 1000 and copy == pool.get_lazy(files, "c.bin")
    finally:
        pool.close()


def test_lazies_of_one_file_share_an_entry_until_the_last_reads(files, tmp_path):
    """Three lazies of one file: one fetch, refcount 3; the buffered file is a hard link of the node
    cache's entry; it stays until the third lazy is read; a lazy dropped unread releases its share."""
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c")
    try:
        lazies = [pool.get_lazy(files, "a.bin") for _ in range(3)]
        entry = lazies[0].entry
        assert all(lazy.entry is entry for lazy in lazies) and entry.refcount == 3
        assert entry.send_to_cache_future.result(timeout=10) is True
        assert entry.data_size == 1000
        node_file = pool._node.path_of(pool._key(files, "a.bin"))
        assert os.stat(entry.cache_path).st_ino == os.stat(node_file).st_ino  # no second copy
        assert lazies[0].get() == b"a" * 1000 and entry.refcount == 2 and entry.cache_path.is_file()
        assert lazies[1].get() == b"a" * 1000 and entry.refcount == 1 and pool.current_cache_count == 1
        del lazies[2]
        gc.collect()
        assert entry.refcount == 0 and entry.cache_path is None and buffered(pool) == []
        assert (pool.current_cache_count, pool.current_cache_size) == (0, 0)
        assert node_file.is_file()  # the node cache keeps it for other processes and epochs
        # a new lazy after that starts a new entry
        again = pool.get_lazy(files, "a.bin")
        assert again.entry is not entry and again.entry.refcount == 1 and again.get() == b"a" * 1000
    finally:
        pool.close()


def test_fetches_wait_in_order_for_room_and_a_reader_does_not_wait(files, tmp_path):
    """A budget of 1500 bytes, one fetch thread: a (1000) is buffered; b waits for room and c, d wait
    behind it; reading b reads it directly and queues it again behind d for its other lazy; reading a
    frees the room: c is buffered, then d waits (c + d > budget) until c is read."""
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c", num_workers=1, node_cache_gbytes=0)
    pool.max_cache_size = 1500
    try:
        a, b1, b2, c, d = (pool.get_lazy(files, n) for n in ("a.bin", "b.bin", "b.bin", "c.bin", "d.bin"))
        assert a.entry.send_to_cache_future.result(timeout=10) is True
        time.sleep(0.3)
        assert not b1.entry.send_to_cache_future.done() and not c.entry.send_to_cache_future.done()
        assert (pool.current_cache_count, pool.current_cache_size) == (1, 1000)
        assert b1.get() == b"b" * 1000  # no wait for room: read directly
        assert b1.entry.refcount == 1 and not b2.entry.send_to_cache_future.done()
        assert a.get() == b"a" * 1000
        assert c.entry.send_to_cache_future.result(timeout=10) is True
        time.sleep(0.3)
        assert not d.entry.send_to_cache_future.done() and (pool.current_cache_count, pool.current_cache_size) == (1, 1000)
        assert c.get() == b"c" * 1000
        assert d.entry.send_to_cache_future.result(timeout=10) is True
        assert d.get() == b"d" * 1000
        assert b2.entry.send_to_cache_future.result(timeout=10) is True  # requeued behind d
        assert b2.get() == b"b" * 1000
        assert (pool.current_cache_count, pool.current_cache_size, buffered(pool)) == (0, 0, [])
        assert pool.node_cache_dir is None and pool.node_cache_count == 0
    finally:
        pool.close()


def test_count_budget_and_a_file_that_can_never_fit(files, tmp_path):
    """max_cache_count=1 buffers one file at a time; a file larger than the byte budget is not
    buffered at all (its fetch ends at once) and is read directly."""
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c", num_workers=2, max_cache_count=1)
    try:
        a, b = pool.get_lazy(files, "a.bin"), pool.get_lazy(files, "b.bin")
        wait_until(lambda: a.entry.send_to_cache_future.done() or b.entry.send_to_cache_future.done())
        time.sleep(0.2)
        assert pool.current_cache_count == 1 and len(buffered(pool)) == 1
        first, second = (a, b) if a.entry.send_to_cache_future.done() else (b, a)
        assert not second.entry.send_to_cache_future.done()
        first.get()
        assert second.entry.send_to_cache_future.result(timeout=10) is True
        second.get()
        pool.max_cache_size = 600
        big, small = pool.get_lazy(files, "c.bin"), pool.get_lazy(files, "e.bin")
        assert big.entry.send_to_cache_future.result(timeout=10) is False
        assert small.entry.send_to_cache_future.result(timeout=10) is True
        assert big.get() == b"c" * 1000 and small.get() == b"e" * 500
        assert buffered(pool) == []
    finally:
        pool.close()


def test_a_failed_fetch_reaches_every_lazy_naming_the_file(files, tmp_path):
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c")
    try:
        x, y = pool.get_lazy(files, "missing.bin"), pool.get_lazy(files, "missing.bin")
        for lazy in (x, y):
            with pytest.raises(KeyError, match="missing.bin"):
                lazy.get()
        assert x.entry.refcount == 0 and pool._pending == {}
    finally:
        pool.close()


def test_close_wakes_waiting_fetches(files, tmp_path):
    """close() does not hang on a fetch waiting for room; its lazy still reads (directly)."""
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c", num_workers=1)
    pool.max_cache_size = 1000
    a, b = pool.get_lazy(files, "a.bin"), pool.get_lazy(files, "b.bin")
    a.entry.send_to_cache_future.result(timeout=10)
    time.sleep(0.1)
    t0 = time.monotonic()
    pool.close()
    assert time.monotonic() - t0 < 5
    assert b.get() == b"b" * 1000 and a.get() == b"a" * 1000
    with pytest.raises(RuntimeError, match="after close"):
        pool.get_lazy(files, "c.bin")


def test_byte_budget_of_the_node_cache_evicts_least_recently_used(files, tmp_path):
    """With room for two entries, a third evicts the one used longest ago (a hit counts as a use)."""
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c")
    pool.get(files, "a.bin")
    entry_size = pool.node_cache_size
    pool.node_cache_max_size = 2 * entry_size + 10
    disk: DiskCache = pool._node
    time.sleep(0.05)
    pool.get(files, "b.bin")
    time.sleep(0.05)
    pool.get(files, "a.bin")  # a hit: b is now the least recently used
    time.sleep(0.05)
    pool.get(files, "c.bin")
    cached = {disk.entry_name(pool._key(files, f"{n}.bin")): n for n in "abc"}
    assert sorted(cached[p.name] for p in pool.node_cache_dir.iterdir()) == ["a", "c"]
    assert pool.node_cache_count == 2 and pool.node_cache_size == 2 * entry_size
    # an entry larger than the whole budget is served but not cached
    pool.node_cache_max_size = 100
    assert pool.get(files, "d.bin") == b"d" * 1000 and pool.node_cache_count == 2
    pool.close()


def _child_reads(pool_blob: bytes, folder: str, names, queue) -> None:
    pool = pickle.loads(pool_blob)
    store = SystemFileStore(folder)
    queue.put(([pool.get_lazy(store, n).get() for n in names], str(pool.cache_dir), pool.max_cache_size))
    pool.close()


def test_two_processes_share_one_node_cache(files, tmp_path):
    """Another process reads an entry this one cached (its source file is gone); two processes filling
    the same names at once read whole, correct files; each unpickled the pool as its own (same
    settings, its own buffer folder)."""
    parent = tmp_path / "c"
    pool = FileStoreCachePool(parent_cache_dir=parent)
    pool.max_cache_size = 123_456
    assert pickle.loads(pickle.dumps(pool)) is pool  # one pool per process
    pool.get(files, "a.bin")
    (files.base_dir / "a.bin").unlink()  # from now on only the node cache has it
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    names = ["a.bin", "b.bin", "c.bin", "d.bin"]
    blob = pickle.dumps(pool)
    procs = [ctx.Process(target=_child_reads, args=(blob, str(files.base_dir), names, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    expected = [n[0].encode() * 1000 for n in names]
    assert [r[0] for r in results] == [expected, expected]
    assert [r[2] for r in results] == [123_456, 123_456]
    assert len({r[1] for r in results} | {str(pool.cache_dir)}) == 3
    assert pool.node_cache_count == 4
    assert not list((parent / "energon_ray_cache.tmp").iterdir())  # no half-written files left
    # the children's buffer folders are removed (at their exit, or by the next pool of this host)
    FileStoreCachePool(parent_cache_dir=parent).close()
    assert [d.name for d in (parent / "energon_ray_prefetch").iterdir() if str(d) in {r[1] for r in results}] == []
    pool.close()


def _forked_child(pool, folder: str, queue) -> None:
    store = SystemFileStore(folder)
    lazy = pool.get_lazy(store, "b.bin")
    queue.put((lazy.get(), str(pool.cache_dir), pool.current_cache_count))


def test_a_forked_child_starts_its_own_buffer(files, tmp_path):
    """A pool used in a forked child (as a DataLoader worker would) fetches with threads of its own
    in a buffer folder of its own; the parent's unread lazy still reads."""
    pool = FileStoreCachePool(parent_cache_dir=tmp_path / "c")
    try:
        held = pool.get_lazy(files, "a.bin")
        held.entry.send_to_cache_future.result(timeout=10)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=_forked_child, args=(pool, str(files.base_dir), queue))
        proc.start()
        data, child_dir, child_count = queue.get(timeout=30)
        proc.join(timeout=30)
        assert proc.exitcode == 0 and data == b"b" * 1000 and child_count == 0
        assert child_dir != str(pool.cache_dir)
        assert held.get() == b"a" * 1000 and buffered(pool) == []
    finally:
        pool.close()


def test_jsonl_file_store_reads_lines_by_index_json(tmp_path):
    """JsonlFileStore: '<index>.json' gives the line's bytes (newline kept, as Energon's) and Energon's SourceInfo;
    other names are KeyErrors naming the file and the form; it pickles as its path."""
    from energon_ray.cache.jsonl_store import JsonlFileStore
    from energon_ray.format.jsonl import prepare_jsonl
    from energon_ray.samples import SourceInfo

    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b'{"a": 1}\n\n{"a": 2}\n')
    prepare_jsonl(corpus, progress=False)
    store = pickle.loads(pickle.dumps(JsonlFileStore(corpus)))
    assert store["0.json"] == (b'{"a": 1}\n\n', SourceInfo(str(corpus), 0, "c.jsonl", ("0.json",)))
    assert store["1.json"][0] == b'{"a": 2}\n'
    for bad, why in (("1", "names are '<line index>.json'"), ("2.json", "the file holds 2 samples"), ("x.json", "names are")):
        with pytest.raises(KeyError, match=f"{corpus}: no file {bad!r} \\({why}"):
            store[bad]
