"""The storage layer without Ray: remote paths, retries and their counters, errors, the shard cache,
against a real S3-compatible server (moto in server mode) where a store is needed."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import re
import sqlite3
from pathlib import PurePosixPath

import numpy as np
import pytest
from click.testing import CliRunner

from energon_ray.cli.main import main
from energon_ray.errors import DatasetConfigError, ShardReadError, UntrustedCodeError
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.dataset_yaml import read_dataset_spec
from energon_ray.format.indexer import index_shard
from energon_ray.format.tar_index import read_tar_index
from energon_ray.format.tar_reader import RemoteShardReader, ShardReader, merge_close_runs, sorted_runs
from energon_ray.plan.stream import SegmentSpec
from energon_ray.source.reader import ReadSegment, shard_table
from energon_ray.storage import (
    STATS, AccessDeniedError, CacheConfig, ObjectNotFoundError, RemotePath, RetryPolicy, ShardCache, StorageError,
    StorageUnavailableError, TruncatedObjectError, as_path, redact,
)  # fmt: skip
from energon_ray.storage.s3 import S3Settings
from energon_ray.synthetic import text_samples, write_shards
from tests.helpers import captioning_dataset, text_dataset
from tests.s3_server import SECRET_KEY, S3Server


@pytest.fixture(scope="module")
def server():
    """One moto S3 server for the module, with a bucket ``unit``; AWS variables point at it."""
    srv = S3Server()
    srv.client().create_bucket(Bucket="unit")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {**srv.env(), "ENERGON_RAY_STORAGE_BACKOFF_S": "0.001", "AWS_MAX_ATTEMPTS": "4"}.items():
            mp.setenv(name, value)
        yield srv
    srv.stop()


@pytest.fixture()
def shard(server, tmp_path):
    """One local tar of 12 text samples and its copy at ``s3://unit/<test>/s.tar``; ``(local, remote, offsets)``."""
    local = str(write_shards(tmp_path, text_samples(12), 12)[0])
    offsets = np.asarray(index_shard(tmp_path, os.path.basename(local)).offsets, dtype=np.int64)
    key = f"{os.environ['PYTEST_CURRENT_TEST'].split('::')[-1].split(' ')[0]}/s.tar"
    server.client().put_object(Bucket="unit", Key=key, Body=open(local, "rb").read())
    server.app.clear()
    return local, f"s3://unit/{key}", offsets


def test_remote_path_is_pathlike_and_never_leaves_its_bucket():
    """Joins normalise '.', '..' and '//'; name/suffix/parent/relative_to as pathlib; '..' above the bucket is refused."""
    root = RemotePath("s3://bkt/data/ds", settings="x")
    assert str(root / "../other/./ds//a.tar") == "s3://bkt/data/other/ds/a.tar"
    assert (root / "a.tar").suffix == ".tar" and (root / "a.tar").stem == "a" and root.name == "ds"
    assert str(root.parent.parent) == "s3://bkt" and str((root / "x/y.tar").relative_to(root)) == "x/y.tar"
    assert root.relative_to(root) == PurePosixPath(".") and root.is_relative_to("s3://bkt/data/ds/")  # as pathlib's
    with pytest.raises(ValueError, match="is not under"):
        root.relative_to("s3://bkt/data/d")
    assert (root / "s3://bkt/else").settings == "x" and repr(root) == "RemotePath('s3://bkt/data/ds')"
    assert pickle.loads(pickle.dumps(root)) == root and pickle.loads(pickle.dumps(root)).settings == "x"
    with pytest.raises(ValueError, match="leads above the bucket"):
        root / "../../.."
    with pytest.raises(ValueError, match="is not a storage URL"):
        RemotePath("s3:///nobucket", settings="x")
    assert str(as_path("/local/ds")) == "/local/ds" and not isinstance(as_path("/local/ds"), RemotePath)


def test_sorted_runs_coalesce_a_shuffled_segment():
    """A shuffled segment's samples of a shard become sorted runs of consecutive samples, duplicates once."""
    assert sorted_runs([7, 3, 4, 12, 5, 11, 3]) == [(3, 5), (7, 7), (11, 12)]
    assert sorted_runs([]) == []
    assert merge_close_runs([(3, 5), (7, 7), (11, 12)], np.arange(0, 1400, 100), max_gap=100) == [(3, 7), (11, 12)]


def test_settings_repr_and_errors_never_show_the_secret(server):
    """The resolved S3 settings carry the keys but their repr does not; redact() blanks them anywhere."""
    settings = S3Settings.from_environment()
    assert settings.endpoint_url == server.endpoint and settings.secret_key == SECRET_KEY
    assert SECRET_KEY not in repr(settings) and "credentials='static'" in repr(settings)
    assert settings.retry == RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=10.0)
    assert redact(f"bad signature for {SECRET_KEY}!") == "bad signature for ***!"


def test_ranged_reads_count_requests_and_retry_transient_faults(server, shard, caplog):
    """503s and a connection cut mid-body are retried (counted, logged with the URL, never the secret) and
    return the same bytes; a read past the end is a TruncatedObjectError, not a retry."""
    local, url, offsets = shard
    path = as_path(url)
    want = open(local, "rb").read()[100:5000]
    before = STATS.snapshot()
    server.app.fail("503", 2)
    server.app.fail("drop", 1)
    with caplog.at_level(logging.INFO, logger="energon_ray.storage"):
        assert path.read_range(100, 4900) == want
    requests, nbytes, retries = (a - b for a, b in zip(STATS.snapshot(), before))
    assert (requests, nbytes, retries) == (4, 4900, 3)
    assert len(caplog.records) == 3 and all(url in r.getMessage() and SECRET_KEY not in r.getMessage() for r in caplog.records)
    with pytest.raises(TruncatedObjectError, match="object has"):
        path.read_range(len(open(local, "rb").read()) - 10, 20)


def test_persistent_faults_missing_and_forbidden_objects_raise_clear_errors(server, shard):
    """Retries give up after AWS_MAX_ATTEMPTS; 404 and 403 are not retried; each error names the URL only."""
    _, url, _ = shard
    server.app.fail("503", 4)
    with pytest.raises(StorageUnavailableError, match=r"failed 4 times, last with HTTP 503 SlowDown") as exc:
        as_path(url).read_range(0, 10)
    assert str(exc.value).startswith(url) and server.app.pending_faults() == 0
    with pytest.raises(ObjectNotFoundError, match=r"s3://unit/nope\.tar: no such object \(HTTP 404 NoSuchKey\)"):
        as_path("s3://unit/nope.tar").read_bytes()
    server.app.fail("403", 1, ranged_only=False)
    with pytest.raises(AccessDeniedError) as denied:
        as_path(url).read_bytes()
    assert str(denied.value).startswith(f"{url}: access denied (HTTP 403 AccessDenied)") and SECRET_KEY not in str(denied.value)
    server.app.fail("403", 1, ranged_only=False)
    with pytest.raises(AccessDeniedError, match=re.escape(f"{url}: access denied (HTTP 403 Forbidden);")):
        as_path(url).stat()  # a HEAD: no error body, so the status's reason, not "HTTP 403 403"


def test_remote_shard_reader_reads_what_the_local_one_reads(server, shard):
    """A run of samples is one ranged GET; parsed samples equal the local reader's."""
    local, url, offsets = shard
    remote = RemoteShardReader(as_path(url), "s.tar", offsets)
    mine = ShardReader(local, "s.tar", offsets)
    got = [remote.parse(i, chunk) for i, chunk in remote.read_run(2, 9)]
    assert got == [mine.parse(i, chunk) for i, chunk in mine.read_run(2, 9)]
    assert [r.range for r in server.ranged_gets("s.tar")] == [f"bytes={offsets[2]}-{offsets[10] - 1}"]
    assert remote.read_key(11) == "000011"


def test_shard_cache_downloads_once_and_evicts_least_recently_used(server, shard, tmp_path):
    """With a cache, a shard is downloaded on its first read and read locally after; the budget evicts the oldest."""
    local, url, offsets = shard
    settings = S3Settings.from_environment()
    cached = dataclasses.replace(settings, cache=CacheConfig(str(tmp_path / "cache"), max_bytes=os.path.getsize(local)))
    reader = RemoteShardReader(as_path(url, cached), "s.tar", offsets)
    first = [reader.parse(i, c) for i, c in reader.read_run(0, 11)]
    again = RemoteShardReader(as_path(url, cached), "s.tar", offsets)
    server.app.clear()
    assert [again.parse(i, c) for i, c in again.read_run(0, 11)] == first and server.ranged_gets() == []
    cache = ShardCache(cached.cache)
    assert cache.local_copy("s3://unit/other.tar", 10, "e", lambda f: f.write(b"x" * 10)) is not None
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".shard"]  # the older shard was evicted


def test_node_caches_live_in_private_folders_of_this_user(tmp_path, monkeypatch):
    """Shard and index.sqlite copies are read back by name: a shared /tmp folder (the default was
    <tmp>/energon_ray_shard_cache for every user) let another user put a file there that we then read.
    The defaults are per user now, and a folder others can write (or a link) is refused by name."""
    import stat
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("ENERGON_RAY_SHARD_CACHE_BYTES", "1000")
    monkeypatch.delenv("ENERGON_RAY_SHARD_CACHE_DIR", raising=False)
    folder = tmp_path / f"energon_ray_shard_cache-{os.getuid()}"
    assert CacheConfig.from_environment().directory == str(folder)
    cache = ShardCache(CacheConfig.from_environment())
    assert open(cache.local_copy("s3://unit/a.tar", 4, "e", lambda f: f.write(b"abcd")), "rb").read() == b"abcd"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for shared in (tmp_path / "shared", tmp_path / "link"):
        if shared.name == "link":
            shared.symlink_to(folder)
        else:
            shared.mkdir(mode=0o777)
            shared.chmod(0o777)
        with pytest.raises(StorageError) as info:
            ShardCache(CacheConfig(str(shared), 1000)).local_copy("s3://unit/a.tar", 4, "e", lambda f: f.write(b"abcd"))
        assert str(info.value).startswith(f"{shared}: cache folder is not a private folder of this user")


def test_segment_reads_coalesce_sorted_runs_and_close_gaps(server, tmp_path):
    """A shuffled segment read from the bucket gives the local samples in plan order with one ranged GET per
    sorted run; with ENERGON_RAY_STORAGE_MAX_GAP_BYTES runs that close share one GET."""
    local = text_dataset(tmp_path / "ds", [10, 10])
    url = server.upload(local, "unit", "segment")
    spec = SegmentSpec(0, 0, 1, 0, 0, np.array([13, 2, 3, 17, 4, 12, 9, 15]), False)
    want = ReadSegment(shard_table(PreparedDataset.open(local, "train")), None)(spec)
    runs = [(2, 4), (9, 9), (12, 13), (15, 15), (17, 17)]  # shard 1 starts at 10; 16 is not read
    for gap, gets in ((0, len(runs)), (1024, 3)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ENERGON_RAY_STORAGE_MAX_GAP_BYTES", str(gap))
            reader = pickle.loads(pickle.dumps(ReadSegment(shard_table(PreparedDataset.open(url, "train")), None)))
        server.app.clear()
        got = reader(spec)
        assert [(p, g, r["__key__"], r["txt"]) for p, g, r in got.raw] == [(p, g, r["__key__"], r["txt"]) for p, g, r in want.raw]
        assert len(server.ranged_gets("/segment/")) == gets and got.read_retries == 0
        assert got.read_requests == gets + 2  # and this process's first read of the two .tar.idx


def _dataset_with_code(tmp_path):
    """A local text dataset whose dataset.yaml names a sample_loader.py (upper-cases the text)."""
    local = text_dataset(tmp_path / "ds", [4])
    meta = local / ".nv-meta"
    (meta / "dataset.yaml").write_text(
        "sample_type: {__module__: megatron.energon, __class__: TextSample}\n"
        "sample_loader: sample_loader.py:load\npart_filter: [txt]\n"
    )
    (meta / "sample_loader.py").write_text("def load(raw):\n    return dict(text=raw['txt'].upper())\n")
    return local


def test_remote_spec_with_dataset_code_ships_its_files(server, tmp_path):
    """A remote dataset.yaml naming a sample_loader.py (trusted) loads it from a local copy; the pickled
    spec rebuilds in a worker from the files it carries, without a request to the store."""
    url = server.upload(_dataset_with_code(tmp_path), "unit", "code")
    spec = read_dataset_spec(url, trusted=True)
    assert spec.sample_loader({"txt": "ab"}) == {"text": "AB"} and spec.parts == frozenset({"txt"})
    blob = pickle.dumps(spec)
    server.app.clear()
    again = pickle.loads(blob)
    assert again.sample_loader({"txt": "cd"}) == {"text": "CD"} and server.app.requests == []
    with pytest.raises(UntrustedCodeError):
        read_dataset_spec(url)


def test_a_remote_sample_loader_runs_from_a_private_copy_holding_the_datasets_bytes(server, tmp_path, monkeypatch):
    """The local copy of a remote sample_loader.py went to a shared temp folder and was imported if a
    file already sat at its (predictable) name: another user of the node could put code there. It now
    lives in a folder of this user's own (0700), and a file there holding other bytes is replaced."""
    import stat
    import sys
    import tempfile

    url = server.upload(_dataset_with_code(tmp_path), "unit", "planted")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert read_dataset_spec(url, trusted=True).sample_loader({"txt": "ab"}) == {"text": "AB"}
    (copy,) = (tmp_path / "tmp").rglob("sample_loader.py")
    assert stat.S_IMODE(copy.parent.parent.stat().st_mode) == 0o700 and copy.parent.parent.parent == tmp_path / "tmp"
    copy.write_text("def load(raw):\n    return dict(text='PLANTED')\n")
    for name in [m for m in sys.modules if m.startswith("_energon_ray_dsmod_")]:
        del sys.modules[name]  # as in a fresh worker process
    assert read_dataset_spec(url, trusted=True).sample_loader({"txt": "ab"}) == {"text": "AB"}
    copy.parent.parent.chmod(0o777)
    with pytest.raises(DatasetConfigError, match=rf"cannot keep a local copy to import: {copy.parent.parent}: cache folder is not a private"):
        read_dataset_spec(url, trusted=True)


def test_a_refused_connection_is_retried_then_names_the_url(server, shard, caplog):
    """An endpoint that refuses connections (the store restarting or gone) is a transient failure, as in
    botocore's retry modes: retried AWS_MAX_ATTEMPTS times and counted, then StorageUnavailableError naming
    the object's URL, never the secret (it was a fatal 'failed: EndpointConnectionError' at the first try);
    the retries are said once as a warning, at the third failure in a row (a wrong endpoint waits a while)."""
    import socket

    _, url, _ = shard
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = dataclasses.replace(S3Settings.from_environment(), endpoint_url=f"http://127.0.0.1:{port}")
    before = STATS.snapshot()
    with caplog.at_level(logging.WARNING, logger="energon_ray"):
        with pytest.raises(StorageUnavailableError, match=r"failed 4 times, last with EndpointConnectionError") as exc:
            as_path(url, gone).read_range(0, 10)
    assert str(exc.value).startswith(f"{url}: ") and SECRET_KEY not in str(exc.value)
    assert STATS.snapshot()[2] - before[2] == 3
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith(f"{url}: read of bytes [0, 10) failed (EndpointConnectionError")
    assert "); retry 3 of 3 in " in warned[0] and SECRET_KEY not in warned[0]


def test_an_msc_profile_whose_store_refuses_connections_is_retried_then_names_the_url(server, tmp_path, monkeypatch):
    """multi-storage-client raises a refused connection as a non-retryable RuntimeError around botocore's
    EndpointConnectionError: it failed at once ('info failed: RuntimeError'), where the same store as an
    s3:// URL is retried. Now retried AWS_MAX_ATTEMPTS times and counted, then StorageUnavailableError
    naming the msc:// URL, never the secret."""
    import socket

    pytest.importorskip("multistorageclient")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "msc.yaml"
    config.write_text(
        "profiles:\n  gone:\n    storage_provider:\n      type: s3\n      options:\n        base_path: bkt\n"
        f"        endpoint_url: http://127.0.0.1:{port}\n        region_name: us-east-1\n"
        f"    credentials_provider:\n      type: S3Credentials\n      options:\n        access_key: AK\n        secret_key: {SECRET_KEY}\n"
    )
    monkeypatch.setenv("MSC_CONFIG", str(config))
    before = STATS.snapshot()
    with pytest.raises(StorageUnavailableError, match=r"failed 4 times, last with RuntimeError") as exc:
        as_path("msc://gone/data/s.tar").read_range(0, 10)
    assert str(exc.value).startswith("msc://gone/data/s.tar: ") and "EndpointConnectionError" in str(exc.value)
    assert SECRET_KEY not in str(exc.value) and STATS.snapshot()[2] - before[2] == 3


def _msc_profile(server, tmp_path, monkeypatch, name="moto", extra_options=""):
    """An MSC config with profile ``name`` on the test server's bucket ``unit``; MSC_CONFIG points at it.
    ``extra_options``: more lines of the storage provider's options (8 spaces in)."""
    pytest.importorskip("multistorageclient")
    config = tmp_path / "msc.yaml"
    config.write_text(
        f"profiles:\n  {name}:\n    storage_provider:\n      type: s3\n      options:\n        base_path: unit\n"
        f"        endpoint_url: {server.endpoint}\n        region_name: us-east-1\n{extra_options}"
        f"    credentials_provider:\n      type: S3Credentials\n      options:\n        access_key: AK\n        secret_key: {SECRET_KEY}\n"
    )
    monkeypatch.setenv("MSC_CONFIG", str(config))
    return config


def test_msc_transient_faults_are_retried_by_our_loop_only_and_counted(server, shard, tmp_path, monkeypatch):
    """An msc:// read that meets two 503s is retried by our loop alone: three requests reach the store and
    both retries are counted (multi-storage-client's own loop and botocore's had retried them unseen,
    3 x 3 attempts per attempt of ours, sleeping a second or more each time)."""
    local, url, _ = shard
    _msc_profile(server, tmp_path, monkeypatch)
    key = url[len("s3://unit/"):]
    path = as_path(f"msc://moto/{key}")
    server.app.clear()
    server.app.fail("503", 2)
    before = STATS.snapshot()
    assert path.read_range(100, 400) == open(local, "rb").read()[100:500]
    assert tuple(a - b for a, b in zip(STATS.snapshot(), before)) == (3, 400, 2)
    assert [r.fault for r in server.ranged_gets(key)] == ["503", "503", None]


def test_msc_rust_client_faults_are_retried_by_our_loop_only_and_counted(server, shard, tmp_path, monkeypatch):
    """A profile reading through multi-storage-client's rust_client: its own retry loop (10 attempts by
    default, unseen and uncounted) is turned off as botocore's is; two 503s are retried by our loop, counted."""
    pytest.importorskip("multistorageclient_rust")
    local, url, _ = shard
    _msc_profile(server, tmp_path, monkeypatch, name="rusty", extra_options="        rust_client: {allow_http: true}\n")
    key = url[len("s3://unit/"):]
    path = as_path(f"msc://rusty/{key}")
    server.app.clear()
    server.app.fail("503", 2)
    before = STATS.snapshot()
    assert path.read_range(100, 400) == open(local, "rb").read()[100:500]
    assert tuple(a - b for a, b in zip(STATS.snapshot(), before)) == (3, 400, 2)
    assert [r.fault for r in server.ranged_gets(key)] == ["503", "503", None]


def _runs_past_the_end_are_named(reader, name, offsets, cut):
    """Runs that reach past a shard cut at byte ``cut`` name the first sample lacking and the shard's real end."""
    for first, last, lacking in ((7, 9, 7), (2, 9, 5)):
        with pytest.raises(ShardReadError) as exc:
            list(reader.read_run(first, last))
        assert str(exc.value) == (
            f"{name}: truncated shard: sample #{lacking} (bytes [{offsets[lacking]}, {offsets[lacking + 1]})) lies past "
            f"its end at byte {cut}; the shard changed after the dataset was prepared (its .tar.idx ends at byte {offsets[-1]})"
        )


@pytest.mark.parametrize("scheme", ["s3", "msc"])
def test_a_shard_cut_short_after_prepare_names_the_url_and_the_first_sample_past_its_end(server, shard, tmp_path, monkeypatch, scheme):
    """A shard object replaced by a shorter one: a run of samples that starts past its new end (HTTP 416) or
    runs over it is a ShardReadError naming the shard's URL, the first sample it lacks and its size, on
    s3:// and msc:// alike (s3:// had said 'failed: HTTP 416 InvalidRange', msc:// 'RuntimeError: Failed to
    GET … status_code: 416', neither which sample); a range read past the end is a TruncatedObjectError."""
    local, url, offsets = shard
    key = url[len("s3://unit/"):]
    if scheme == "msc":
        _msc_profile(server, tmp_path, monkeypatch)
    path = as_path(url if scheme == "s3" else f"msc://moto/{key}")
    cut = int(offsets[5]) + 100
    server.client().put_object(Bucket="unit", Key=key, Body=open(local, "rb").read()[:cut])
    reader = RemoteShardReader(path, "s.tar", offsets)
    _runs_past_the_end_are_named(reader, path, offsets, cut)
    with pytest.raises(TruncatedObjectError, match=re.escape(f"{path}: wanted bytes [{cut + 10}, {cut + 20}) but the object has {cut} bytes")):
        path.read_range(cut + 10, 10)


def test_an_msc_config_that_does_not_exist_is_named(tmp_path, monkeypatch):
    """MSC_CONFIG naming a file that does not exist: the error says so (multi-storage-client skips such a
    path silently, and the message had said 'no MSC config file found (set MSC_CONFIG)', which it was)."""
    pytest.importorskip("multistorageclient")
    missing = tmp_path / "nowhere" / "msc.yaml"
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS"):
        monkeypatch.setenv(name, str(tmp_path))  # no config file in msc's default places either
    monkeypatch.setenv("MSC_CONFIG", str(missing))
    with pytest.raises(StorageError) as exc:
        as_path("msc://nowhere_profile/data/s.tar")
    assert str(exc.value) == (
        f"msc://nowhere_profile: profile 'nowhere_profile' is not defined: MSC_CONFIG={missing} does not exist "
        "(no MSC config file found elsewhere)"
    )


@pytest.mark.parametrize("scheme", ["s3", "msc"])
def test_a_bucket_that_does_not_exist_is_not_taken_for_a_missing_file(server, tmp_path, monkeypatch, scheme):
    """Reads that take a missing file for "none" (``read_optional``: a folder's media index; a file
    store's entries) raise for a bucket that does not exist, naming it, on s3:// and msc:// (the
    missing bucket read as "no .nv-meta/index.sqlite; run prepare-media", or as a missing file)."""
    from energon_ray.cache.stores import SystemFileStore
    from energon_ray.storage import BucketNotFoundError, read_optional

    if scheme == "msc":
        config = _msc_profile(server, tmp_path, monkeypatch, name="gone")
        config.write_text(config.read_text().replace("base_path: unit", "base_path: nobucket"))
    root = "s3://nobucket/x" if scheme == "s3" else "msc://gone/x"
    with pytest.raises(BucketNotFoundError, match=re.escape(f"{root}/.nv-meta/index.sqlite: no such bucket (") + ".*NoSuchBucket"):
        read_optional(f"{root}/.nv-meta/index.sqlite")
    with pytest.raises(BucketNotFoundError, match=re.escape(f"{root}/a.txt: no such bucket")):
        SystemFileStore(root)["a.txt"]
    assert read_optional("s3://unit/no/such/file") is None  # a missing file in a bucket that exists: None
    with pytest.raises(KeyError, match="no file 'a.txt'"):
        SystemFileStore("s3://unit/nothing")["a.txt"]


def test_msc_filesystem_profile_is_the_local_path(tmp_path, monkeypatch):
    """msc://__filesystem__/<path> (multi-storage-client's reserved local profile) is that local path, as
    Energon's EPath reads it, with no MSC config: opened, named in a metadataset, given to `info` (it was
    refused: "profile '__filesystem__' is not defined in the MSC config")."""
    from click.testing import CliRunner

    import energon_ray as er
    from energon_ray.cli.main import main as cli
    from energon_ray.storage import is_remote

    monkeypatch.setenv("MSC_CONFIG", str(tmp_path / "msc.yaml"))
    (tmp_path / "msc.yaml").write_text("profiles:\n  other:\n    storage_provider:\n      type: file\n      options:\n        base_path: /\n")
    root = text_dataset(tmp_path / "ds", [3, 2])
    url = f"msc://__filesystem__{root}"
    assert as_path(url) == root and not is_remote(url) and RemotePath("s3://bkt/a", settings="x") / url == root
    with pytest.raises(ValueError, match=re.escape(f"{url!r} is the local path {root}")):
        RemotePath(url)
    prepared = PreparedDataset.open(url, "train")
    assert prepared.root == str(root) and [s.path for s in prepared.shards] == [f"{root}/shards/part00_0000.tar", f"{root}/shards/part01_0000.tar"]
    (tmp_path / "mix.yaml").write_text(f"__class__: MetadatasetV2\nsplits:\n  train:\n    path: {url}\n")
    assert [r.path for r in er.traverse_metadataset(tmp_path / "mix.yaml", split_part="train")] == [root]
    result = CliRunner().invoke(cli, ["info", url])
    assert result.exit_code == 0 and "5 samples" in result.output, result.output


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_dataset_file_store_whose_shard_was_cut_short_names_the_file_and_the_key(server, tmp_path, where):
    """A DatasetFileStore (an aux dataset) whose tar shard was cut short after prepare: reading a file past the
    new end is a DatasetConfigError naming the shard, the file asked for, its bytes and the shard's size, from
    a bucket as from disk (the bucket's had been a TruncatedObjectError naming only the URL and a byte range)."""
    from energon_ray.cache.stores import DatasetFileStore
    from energon_ray.errors import DatasetConfigError

    root = text_dataset(tmp_path / "ds", [4])
    shard = root / "shards" / "part00_0000.tar"
    offsets = read_tar_index(shard)
    cut = int(offsets[2]) + 600  # sample 2's header and part of its text block remain
    shard.write_bytes(shard.read_bytes()[:cut])
    location = str(root) if where == "local" else server.upload(root, "unit", "cut_store/ds")
    store = DatasetFileStore(location)
    assert store["000001.txt"][0] == b"1"
    with pytest.raises(DatasetConfigError) as exc:
        store["000003.txt"]
    start = int(offsets[3]) + 512
    assert str(exc.value) == (
        f"{location}/shards/part00_0000.tar: truncated: '000003.txt' wants bytes [{start}, {start + 1}) but the file has "
        f"{cut} bytes; the shard changed after the dataset was prepared"
    )


@pytest.mark.parametrize("where", ["local", "s3 cached"])
def test_a_run_that_starts_past_a_cut_shards_end_names_the_shards_real_size(server, shard, tmp_path, monkeypatch, where):
    """A shard cut short after prepare, read from disk or from the node's cached copy of an object: a run that
    starts past the new end names the shard's real size, as a ranged GET does (it named the run's first byte
    as the shard's end: 'its end at byte 7168' of a 5220-byte shard)."""
    local, url, offsets = shard
    cut = int(offsets[5]) + 100
    data = open(local, "rb").read()[:cut]
    if where == "local":
        open(local, "wb").write(data)
        reader, name = ShardReader(local, "s.tar", offsets), local
    else:
        monkeypatch.setenv("ENERGON_RAY_SHARD_CACHE_BYTES", "1e9")
        monkeypatch.setenv("ENERGON_RAY_SHARD_CACHE_DIR", str(tmp_path / "cache"))
        server.client().put_object(Bucket="unit", Key=url[len("s3://unit/"):], Body=data)
        path = as_path(url)
        assert path.settings.cache is not None
        reader, name = RemoteShardReader(path, "s.tar", offsets), url
    _runs_past_the_end_are_named(reader, name, offsets, cut)
    if where != "local":
        assert os.listdir(tmp_path / "cache")  # read from the cached copy


def test_an_msc_config_with_variables_reaches_the_store_from_a_process_without_them(server, shard, tmp_path, monkeypatch):
    """An MSC config naming its endpoint and keys as ${VARIABLES}: the settings that travel to the workers hold
    their values, so a process without those variables and without the config file reads the object, and the
    key's value is blanked from messages (the references travelled unexpanded: the worker had no endpoint
    and no keys, and '${...}' was registered as the secret instead of the key), the provider's type not."""
    import subprocess
    import sys

    from energon_ray.storage.msc import MscSettings

    local, url, _ = shard
    secret = "msc-variable-secret-not-to-print"
    config = tmp_path / "msc.yaml"
    config.write_text(
        "profiles:\n  vars:\n    storage_provider:\n      type: s3\n      options:\n        base_path: unit\n"
        "        endpoint_url: ${TEST_MSC_ENDPOINT}\n        region_name: us-east-1\n"
        "    credentials_provider:\n      type: S3Credentials\n      options:\n"
        "        access_key: ${TEST_MSC_KEY}\n        secret_key: ${TEST_MSC_SECRET}\n"
    )
    monkeypatch.setenv("MSC_CONFIG", str(config))
    monkeypatch.setenv("TEST_MSC_ENDPOINT", server.endpoint)
    monkeypatch.setenv("TEST_MSC_KEY", "AKVARIABLE01")
    monkeypatch.setenv("TEST_MSC_SECRET", secret)
    path = as_path(f"msc://vars/{url[len('s3://unit/'):]}")
    assert isinstance(path.settings, MscSettings) and "${" not in path.settings.config_json
    assert redact(f"signature of {secret}") == "signature of ***"
    # what names the provider is no credential (every 'S3Credentials' in any message was blanked)
    assert redact("S3Credentials of profile vars") == "S3Credentials of profile vars"
    (tmp_path / "path.pkl").write_bytes(pickle.dumps(path))
    import energon_ray

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEST_MSC_", "MSC_", "AWS_"))}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(energon_ray.__file__))  # this checkout's package
    code = f"import pickle; p = pickle.load(open({str(tmp_path / 'path.pkl')!r}, 'rb')); print(p.read_range(100, 400).hex())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert bytes.fromhex(out.stdout.strip()) == open(local, "rb").read()[100:500]


def test_folder_markers_in_a_bucket_are_no_files(server, tmp_path):
    """Empty ``folder/`` objects (the S3 console's "Create folder", FUSE mounts) are left out of a prefix's
    files: glob and `energon-ray info` work on a dataset holding them (both failed: "s3://…/ds is not under
    s3://…/ds")."""
    from click.testing import CliRunner

    from energon_ray.cli.main import main as cli

    url = server.upload(text_dataset(tmp_path / "ds", [3, 2]), "unit", "markers/ds")
    for key in ("markers/", "markers/ds/", "markers/ds/shards/"):
        server.client().put_object(Bucket="unit", Key=key, Body=b"")
    root = as_path(url)
    assert [str(p.relative_to(root)) for p in root.glob("**/*.tar")] == ["shards/part00_0000.tar", "shards/part01_0000.tar"]
    assert [str(p.relative_to(root)) for p, _ in root.walk_files() if not p.name.endswith(".idx")][-2:] == [
        "shards/part00_0000.tar", "shards/part01_0000.tar"]  # fmt: skip
    assert not any(p == root or p.name == "shards" for p, _ in root.walk_files())
    result = CliRunner().invoke(cli, ["info", url])
    assert result.exit_code == 0 and "5 samples in 2 shards" in result.output, result.output


def test_a_remote_path_opens_as_text_by_default_as_pathlib_and_energon_do(server, tmp_path):
    """RemotePath.open() and open("r") give text, as pathlib's and Energon's EPath's open do, and "rb" bytes (a
    traversed metadataset's RemotePath gave bytes where a local Path gives str); writing modes are refused."""
    local = tmp_path / "a.txt"
    local.write_text("héllo\nwörld\n", encoding="utf-8")
    url = server.upload(tmp_path, "unit", "open_text")
    remote = as_path(f"{url}/a.txt")
    for mode in ("r", "rt"):
        with remote.open(mode) as f, local.open(mode) as g:
            assert f.readlines() == g.readlines() == ["héllo\n", "wörld\n"]
    with remote.open() as f:
        assert f.read() == "héllo\nwörld\n"
    with remote.open("rb") as f:
        assert f.read() == local.read_bytes()
    with pytest.raises(ValueError, match=re.escape(f"{url}/a.txt: remote files open read-only ('r' or 'rb'), not 'w'")):
        remote.open("w")


def test_an_aws_profile_this_node_lacks_names_the_url(tmp_path, monkeypatch):
    """Settings naming an AWS profile (credentials each node resolves) on a node whose AWS config lacks it: the
    read is an AccessDeniedError naming the URL and the profile, a ShardReadError in a shard's read (botocore's
    ProfileNotFound had escaped the read, naming no URL)."""
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    settings = S3Settings(endpoint_url="http://127.0.0.1:9", region="us-east-1", profile="profile-of-another-node")
    path = as_path("s3://bkt/ds/s.tar", settings)
    with pytest.raises(AccessDeniedError) as exc:
        path.read_range(0, 10)
    assert str(exc.value) == (
        "s3://bkt/ds/s.tar: no credentials on this node: ProfileNotFound: The config profile (profile-of-another-node) could not be found"
    )
    with pytest.raises(ShardReadError, match=re.escape("s3://bkt/ds/s.tar: no credentials on this node: ProfileNotFound")):
        list(RemoteShardReader(path, "s.tar", np.array([0, 512, 1024])).read_run(0, 1))


def test_a_bucket_dataset_takes_a_local_split_config_by_absolute_path(server, tmp_path):
    """An absolute path joined to a remote path replaces it, as in pathlib and Energon's EPath: a dataset in a
    bucket opened with `split_config=/abs/split.yaml` reads that local file (it was looked up inside the bucket,
    at <dataset>/.nv-meta/abs/split.yaml: "split file not found")."""
    root = text_dataset(tmp_path / "ds", [3, 2])
    url = server.upload(root, "unit", "local_split/ds")
    assert RemotePath(url, settings="x") / "/abs/split.yaml" == as_path("/abs/split.yaml")
    mine = tmp_path / "mine" / "split.yaml"
    mine.parent.mkdir()
    mine.write_text("split_parts:\n  train:\n    - shards/part01_0000.tar\n  val:\n    - shards/part00_0000.tar\n")
    for location in (str(root), url):
        opened = PreparedDataset.open(location, "val", split_config=str(mine))
        assert [(s.name, s.count) for s in opened.shards] == [("shards/part00_0000.tar", 3)]
    # a URL as split_config, for a local dataset too (was joined as a local name: "split file not found")
    remote_split = server.upload(mine.parent, "unit", "local_split/mine") + "/split.yaml"
    for location, split in ((str(root), remote_split), (str(root), f"msc://__filesystem__{mine}"), (url, remote_split)):
        opened = PreparedDataset.open(location, "val", split_config=split)
        assert [(s.name, s.count) for s in opened.shards] == [("shards/part00_0000.tar", 3)]


def test_an_msc_client_this_node_cannot_make_names_the_url_and_profile():
    """multi-storage-client refusing to build a profile's client on a node (here a provider type it does
    not know) surfaced as its own error from inside the read, naming no URL."""
    from energon_ray.storage.errors import StorageError
    from energon_ray.storage.msc import MscBackend, MscSettings

    config = {"profiles": {"odd": {"storage_provider": {"type": "no_such_provider", "options": {"base_path": "b"}}}}}
    backend = MscBackend("odd", MscSettings("odd", json.dumps(config)))
    for call in (lambda: backend.get("msc://odd/ds/a.tar", "ds/a.tar", 0, 10), lambda: list(backend.list("msc://odd/ds", "ds/"))):
        with pytest.raises(StorageError, match=re.escape("msc://odd/ds") + r".*cannot make multi-storage-client's client of profile 'odd' on this node: "):
            call()


def test_prepare_media_on_a_bucket_in_processes_updates_index_sqlite_under_tmp_path(server, tmp_path):
    """`energon-ray prepare-media s3://… --num-workers 2 --tmp-path DIR` (Energon's options): shards read in
    two processes, index.sqlite updated under DIR (emptied after) and uploaded, the same media rows as a
    local prepare-media."""
    local = captioning_dataset(tmp_path / "ds", n=6, per_shard=2)
    url = server.upload(local, "unit", "media_ds")
    args = ["--media-metadata-by-extension", "--no-progress"]
    res = CliRunner().invoke(main, ["prepare-media", url, *args, "--num-workers", "2", "--tmp-path", str(tmp_path / "scratch")])
    assert (res.exit_code, res.output) == (0, "Done. Stored media metadata of 6 files.\n")
    assert (tmp_path / "scratch").is_dir() and not list((tmp_path / "scratch").iterdir())
    assert CliRunner().invoke(main, ["prepare-media", str(local), *args, "--num-workers", "1"]).exit_code == 0
    (tmp_path / "remote.sqlite").write_bytes(server.download("unit", "media_ds")[".nv-meta/index.sqlite"])
    query = "SELECT * FROM media_metadata ORDER BY entry_key"
    with sqlite3.connect(tmp_path / "remote.sqlite") as remote, sqlite3.connect(local / ".nv-meta" / "index.sqlite") as db:
        rows = db.execute(query).fetchall()
        assert remote.execute(query).fetchall() == rows and len(rows) == 6
