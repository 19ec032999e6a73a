"""Remote datasets on the shared Ray: the same batches from an S3-compatible server (moto in server mode,
started here on a free port) as from local disk; prepare/info on a bucket; faults; msc:// profiles.

Ray's workers were started before this module set the AWS variables: what reaches the store from
them is only what the read tasks carry (the settings resolved where the dataset was opened).
"""

from __future__ import annotations

import itertools
import pickle
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import energon_ray as er
from energon_ray.cache.stores import DatasetFileStore
from energon_ray.cli.main import main as cli
from energon_ray.errors import DatasetConfigError, ShardReadError
from energon_ray.format.prepare import prepare_dataset
from energon_ray.format.tar_index import read_tar_index
from energon_ray.synthetic import captioning_samples, write_shards
from tests.helpers import captioning_dataset, keys_of, prefixed_text_dataset
from tests.integration.test_aux import N as AUX_N
from tests.integration.test_aux import run_aux, write_aux_tree
from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server

WC = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
BUCKET = "energon"
PREPARE = dict(split_ratio=[8, 1, 1], sample_type="CaptioningSample", field_map={"image": "jpg", "caption": "txt"})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The server, the AWS variables pointing at it, and tiny datasets both on disk and in the bucket."""
    server = S3Server()
    server.client().create_bucket(Bucket=BUCKET)
    root = tmp_path_factory.mktemp("remote")
    local = {
        "cap": captioning_dataset(root / "cap", n=40, per_shard=6, split_ratio=(5, 2, 0)),
        "a": prefixed_text_dataset(root / "a", "a", 30, per_shard=7),
        "b": prefixed_text_dataset(root / "b", "b", 20, per_shard=6, subflavors={"src": "b"}),
    }
    yaml = "__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - {weight: 2, path: a}\n      - {weight: 1, path: b}\n"
    (root / "mix.yaml").write_text(yaml)
    remote = {name: server.upload(path, BUCKET, f"data/{name}") for name, path in local.items()}
    server.client().put_object(Bucket=BUCKET, Key="data/mix.yaml", Body=yaml.encode())
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {**server.env(), "ENERGON_RAY_STORAGE_BACKOFF_S": "0.005"}.items():
            mp.setenv(name, value)
        yield {"server": server, "local": local, "remote": remote, "root": root}
    server.stop()


def _train(path, **kwargs):
    args = dict(worker_config=WC, batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=3)
    return er.get_train_dataset(path, **{**args, **kwargs})


def _clear_when_quiet(server, quiet_s: float = 1.0, limit_s: float = 20.0) -> None:
    """Forget the requests seen so far once none has arrived for ``quiet_s``: a closed loader's Ray
    tasks are cancelled asynchronously, and a read already under way may still reach the server."""
    deadline = time.monotonic() + limit_s
    seen = -1
    while time.monotonic() < deadline:
        count = len(server.app.requests)
        if count == seen:
            break
        seen = count
        time.sleep(quiet_s)
    server.app.clear()


def _take(dataset, n):
    loader = er.get_loader(dataset)
    batches = keys_of(itertools.islice(loader, n))
    loader.close()
    return batches, loader.stats


def _sample_bytes(local: Path, shards) -> int:
    return sum(int(read_tar_index(local / s.name)[-1] - read_tar_index(local / s.name)[0]) for s in shards)


def test_train_batches_from_the_bucket_are_the_local_batches(store):
    """Shuffled training: the same 15 batches (keys) from s3:// as from disk; the workers' reads are
    ranged GETs coalesced into fewer requests than samples; nothing retried."""
    server = store["server"]
    remote_ds = _train(store["remote"]["cap"])
    _clear_when_quiet(server)
    got, stats = _take(remote_ds, 15)
    assert got == _take(_train(store["local"]["cap"]), 15)[0] and len(got) == 15
    assert len(server.ranged_gets("/data/cap/")) > 0
    assert 0 < stats.read_requests < stats.samples_read and stats.read_retries == 0


def test_val_batches_read_each_sample_once_with_one_request_per_run(store):
    """Validation from the bucket: all batches equal; one ranged GET per run of consecutive samples (as many
    as local preads), and exactly the samples' bytes are fetched."""
    server, local = store["server"], store["local"]["cap"]
    remote_ds = er.get_val_dataset(store["remote"]["cap"], worker_config=WC, batch_size=3)
    _clear_when_quiet(server)
    got, stats = _take(remote_ds, 100)
    want, local_stats = _take(er.get_val_dataset(local, worker_config=WC, batch_size=3), 100)
    assert got == want and sum(len(b) for b in got) == 10
    gets = server.ranged_gets("/data/cap/")
    assert len(gets) == local_stats.read_requests
    fetched = sum(int(m.group(2)) - int(m.group(1)) + 1 for m in (re.match(r"bytes=(\d+)-(\d+)", r.range) for r in gets))
    assert fetched == _sample_bytes(local, remote_ds.dataset.shards) == local_stats.read_bytes


def test_blend_and_metadataset_from_the_bucket(store):
    """A BlendDataset of two remote sources and a remote metadataset YAML (relative paths resolved in the
    bucket) — and a local YAML naming s3:// URLs — give the local batches, subflavors included."""
    local, remote = store["local"], store["remote"]

    def blend(a, b):
        return er.BlendDataset((_train(a, batch_size=2), 0.6), (_train(b, batch_size=2), 0.4))

    assert _take(blend(remote["a"], remote["b"]), 20)[0] == _take(blend(local["a"], local["b"]), 20)[0]
    want = _take(_train(store["root"] / "mix.yaml", batch_size=2), 20)[0]
    assert _take(_train(f"s3://{BUCKET}/data/mix.yaml", batch_size=2), 20)[0] == want
    urls = store["root"] / "urls.yaml"
    urls.write_text((store["root"] / "mix.yaml").read_text().replace("path: a", f"path: {remote['a']}")
                    .replace("path: b", f"path: {remote['b']}"))  # fmt: skip
    loader = er.get_loader(_train(urls, batch_size=2))
    batch = next(iter(loader))
    loader.close()
    assert keys_of([batch]) == want[:1]
    assert [s.get("src") for s in batch.__subflavors__] == [("b" if k.startswith("b") else None) for k in batch.__key__]


def test_prepare_and_info_on_a_bucket_match_local_files(store, tmp_path):
    """`energon-ray prepare s3://…` writes .nv-meta and .tar.idx into the bucket, byte for byte what a local
    prepare writes (index.uuid is random), building index.sqlite under --tmp-path; `energon-ray info`
    reports the same."""
    server = store["server"]
    write_shards(tmp_path / "raw" / "shards", captioning_samples(20), 6)
    url = server.upload(tmp_path / "raw", BUCKET, "raw")
    args = ["--non-interactive", "--split-ratio", "8,1,1", "--sample-type", "CaptioningSample",
            "--field-map", '{"image": "jpg", "caption": "txt"}', "--no-progress"]  # fmt: skip
    result = CliRunner().invoke(cli, ["prepare", url, *args, "--num-workers", "1", "--tmp-path", str(tmp_path / "scratch")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "scratch").is_dir() and not list((tmp_path / "scratch").iterdir())  # built there, then removed
    prepare_dataset(tmp_path / "raw", progress=False, **PREPARE)
    files = {p.relative_to(tmp_path / "raw").as_posix(): p.read_bytes() for p in (tmp_path / "raw").rglob("*") if p.is_file()}
    stored = server.download(BUCKET, "raw")
    assert sorted(stored) == sorted(files) and len(files) == 4 * 2 + 5
    assert [name for name in files if stored[name] != files[name]] == [".nv-meta/index.uuid"]
    remote_info = CliRunner().invoke(cli, ["info", url])
    local_info = CliRunner().invoke(cli, ["info", str(tmp_path / "raw")])
    assert remote_info.exit_code == 0, remote_info.output
    assert remote_info.output.replace(url, "<ds>") == local_info.output.replace(str(tmp_path / "raw"), "<ds>")


def test_transient_faults_are_retried_counted_and_lose_nothing(store):
    """503 SlowDown answers and connections cut mid-body on the shard reads: the same batches, every fault
    retried once (loader.stats.read_retries), none left."""
    server = store["server"]
    remote_ds = er.get_val_dataset(store["remote"]["cap"], worker_config=WC, batch_size=3)
    _clear_when_quiet(server)
    server.app.fail("503", 4)
    server.app.fail("drop", 2)
    got, stats = _take(remote_ds, 100)
    assert got == _take(er.get_val_dataset(store["local"]["cap"], worker_config=WC, batch_size=3), 100)[0]
    assert stats.read_retries == 6 and server.app.pending_faults() == 0
    assert sum(r.fault is not None for r in server.app.requests) == 6


def test_missing_objects_name_the_url_never_the_secret(store):
    """A shard deleted before opening fails in the driver; one deleted after opening stops the loader with a
    ShardReadError; both name the object's URL and no credential. Reprs and saved states hold no secret."""
    server, local = store["server"], store["local"]["cap"]
    url = server.upload(local, BUCKET, "broken")
    dataset = er.get_val_dataset(url, worker_config=WC, batch_size=3)
    loader = er.get_savable_loader(er.get_val_dataset(url, worker_config=WC, batch_size=3))
    next(iter(loader))
    text = repr(dataset) + repr(loader) + repr(loader.stats) + loader.save_state_rank().to_json() + repr(dataset.dataset)
    assert SECRET_KEY not in text and ACCESS_KEY not in text and url in repr(dataset)
    loader.close()
    shard = dataset.dataset.shards[-1]
    server.client().delete_object(Bucket=BUCKET, Key=f"broken/{shard.name}")
    with pytest.raises(ShardReadError, match=re.escape(f"{url}/{shard.name}: no such object (HTTP 404 NoSuchKey)")) as late:
        _take(dataset, 100)
    with pytest.raises(DatasetConfigError, match=re.escape(f"{url}/{shard.name}: shard listed in")) as early:
        er.get_val_dataset(url, worker_config=WC, batch_size=3)
    assert all(SECRET_KEY not in str(e.value) and ACCESS_KEY not in str(e.value) for e in (late, early))


def test_msc_profile_reads_through_multi_storage_client_config(store, tmp_path, monkeypatch):
    """msc://profile/… resolves through MSC_CONFIG (a profile on the same server): the local val batches."""
    config = tmp_path / "msc.yaml"
    config.write_text(
        "profiles:\n  moto:\n    storage_provider:\n      type: s3\n      options:\n"
        f"        base_path: {BUCKET}\n        endpoint_url: {store['server'].endpoint}\n        region_name: {REGION}\n"
        "    credentials_provider:\n      type: S3Credentials\n      options:\n"
        f"        access_key: {ACCESS_KEY}\n        secret_key: {SECRET_KEY}\n"
    )
    monkeypatch.setenv("MSC_CONFIG", str(config))
    dataset = er.get_val_dataset("msc://moto/data/cap", worker_config=WC, batch_size=3)
    assert SECRET_KEY not in repr(dataset) + repr(dataset.dataset)
    want = _take(er.get_val_dataset(store["local"]["cap"], worker_config=WC, batch_size=3), 100)[0]
    got, stats = _take(dataset, 100)
    assert got == want and stats.read_requests > 0


def test_shard_cache_serves_later_epochs_from_local_disk(store, tmp_path, monkeypatch):
    """With ENERGON_RAY_SHARD_CACHE_BYTES, each shard is fetched once per node; a second loader makes no ranged GET."""
    server = store["server"]
    url = server.upload(store["local"]["cap"], BUCKET, "cached")
    monkeypatch.setenv("ENERGON_RAY_SHARD_CACHE_BYTES", "10e6")
    monkeypatch.setenv("ENERGON_RAY_SHARD_CACHE_DIR", str(tmp_path / "cache"))
    first, _ = _take(er.get_val_dataset(url, worker_config=WC, batch_size=3), 100)
    dataset = er.get_val_dataset(url, worker_config=WC, batch_size=3)
    _clear_when_quiet(server)
    again, _ = _take(dataset, 100)
    assert again == first and server.ranged_gets("/cached/") == []
    assert len(list((tmp_path / "cache").glob("*.shard"))) == len(dataset.dataset.shards)
    assert np.all([p.stat().st_size > 0 for p in (tmp_path / "cache").glob("*.shard")])


@pytest.fixture(scope="module")
def aux_tree(store, tmp_path_factory):
    """test_aux's tree (crude main, prepared imgs, folder pics, aux.yaml) on disk and in the bucket."""
    root = tmp_path_factory.mktemp("auxtree")
    yaml_file = write_aux_tree(root)
    return {"root": root, "yaml": yaml_file, "url": store["server"].upload(root, BUCKET, "auxtree")}


def test_remote_file_stores_read_by_name_and_refuse_escapes(store, aux_tree):
    """A prepared dataset and a folder in the bucket as file stores: the local bytes by name (pickled
    stores too), media metadata from their index.sqlite, KeyError for missing names and escapes."""
    root, url = aux_tree["root"], aux_tree["url"]
    images, pics = DatasetFileStore(f"{url}/imgs"), er.SystemFileStore(f"{url}/pics")
    for k in range(4):
        assert images[f"img_{k}.png"][0] == DatasetFileStore(root / "imgs")[f"img_{k}.png"][0]
        assert pickle.loads(pickle.dumps(pics))[f"pic_{k}.png"][0] == (root / "pics" / f"pic_{k}.png").read_bytes()
    data, info = pickle.loads(pickle.dumps(images))["img_2.png"]
    assert (info.dataset_path, info.shard_name, info.file_names) == (f"{url}/imgs", "shards/shard_0001.tar", ("img_2.png",))
    assert (images.get_media_metadata("img_3.png").width, images.get_media_metadata("img_3.png").height) == (11, 7)
    assert (pics.get_media_metadata("pic_1.png").width, pics.get_media_metadata("pic_1.png").height) == (6, 4)
    with pytest.raises(KeyError, match=r"no file 'img_9.png'"):
        images["img_9.png"]
    with pytest.raises(KeyError, match=r"sample 'img_1' has no part 'jpg'"):
        images["img_1.jpg"]
    with pytest.raises(KeyError, match=r"no file 'pic_9.png'"):
        pics["pic_9.png"]
    for escape in ("../imgs/.nv-meta/.info.json", "/pics/pic_1.png", "s3://energon/auxtree/pics/pic_1.png", "."):
        with pytest.raises(KeyError, match=r"leads outside the folder"):
            pics[escape]


def test_aux_dataset_and_folder_in_the_bucket(store, aux_tree, tmp_path):
    """A metadataset in the bucket whose aux: names a prepared dataset and a folder beside it (relative
    paths): the cooker gets what the local tree gives (images, captions, source file names); an aux
    image of the dataset is read with one ranged GET of exactly its tar member, a folder image whole."""
    server, root, url = store["server"], aux_tree["root"], aux_tree["url"]
    want = run_aux(aux_tree["yaml"], er.FileStoreCachePool(parent_cache_dir=tmp_path / "local"))
    _clear_when_quiet(server)
    got = run_aux(f"{url}/aux.yaml", er.FileStoreCachePool(parent_cache_dir=tmp_path / "remote"))
    assert sorted(got) == sorted(want) == [f"s{i:03d}" for i in range(AUX_N)]
    for key, sample in got.items():
        assert torch.equal(sample.image, want[key].image) and sample.caption == want[key].caption
        assert [n for s in sample.__sources__ for n in s.file_names] == [n for s in want[key].__sources__ for n in s.file_names]
        assert [s.dataset_path for s in sample.__sources__][1:] == [f"{url}/imgs", f"{url}/pics"]
    members = {DatasetFileStore(root / "imgs")._locate(f"img_{k}.png")[2:4] for k in range(4)}
    ranges = set()
    for get in server.ranged_gets("/auxtree/imgs/shards/"):
        first, last = map(int, re.match(r"bytes=(\d+)-(\d+)", get.range).groups())
        ranges.add((first, last - first + 1))
    assert ranges == members
    with server.app.lock:
        whole = {r.path.rsplit("/", 1)[-1] for r in server.app.requests if r.method == "GET" and "/auxtree/pics/pic_" in r.path}
    assert whole == {f"pic_{k}.png" for k in range(4)}


def test_a_store_that_goes_away_mid_pass_ends_with_a_clear_error(store, monkeypatch):
    """A second server, stopped after the dataset was opened: the workers' reads are retried (a refused
    connection is transient) and the loader stops within seconds with a ShardReadError naming the shard's
    URL and the store as unavailable, never hangs."""
    other = S3Server()
    other.client().create_bucket(Bucket=BUCKET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", other.endpoint)
    url = other.upload(store["local"]["cap"], BUCKET, "gone")
    dataset = er.get_val_dataset(url, worker_config=WC, batch_size=3)
    other.stop()
    started = time.monotonic()
    with pytest.raises(ShardReadError, match=rf"{re.escape(url)}/shards/[^:]+\.tar(\.idx)?: .*failed 10 times, last with "
                                             r"EndpointConnectionError.*the store is unavailable"):  # fmt: skip
        _take(dataset, 100)
    assert time.monotonic() - started < 60


def test_a_shard_index_deleted_after_opening_names_the_rebuild_command(store):
    """A .tar.idx that goes missing after the dataset was opened stops the workers' read with a ShardReadError
    naming the index and the command that rebuilds it for this dataset's URL (it said '<dataset root>')."""
    server, local = store["server"], store["local"]["cap"]
    url = server.upload(local, BUCKET, "noidx")
    dataset = er.get_val_dataset(url, worker_config=WC, batch_size=3)
    shard = dataset.dataset.shards[0]
    server.client().delete_object(Bucket=BUCKET, Key=f"noidx/{shard.name}.idx")
    with pytest.raises(ShardReadError, match=re.escape(f"{url}/{shard.name}.idx: missing index of {url}/{shard.name}; "
                                                       f"run `energon-ray prepare --tar-index-only {url}`")):  # fmt: skip
        _take(dataset, 100)


def test_lint_and_preview_refuse_a_url_as_local_only(store):
    """`energon-ray lint`/`preview` read local datasets only: a URL is a usage error saying so (and which
    commands take URLs), not "Path 's3://…' does not exist", which sent one looking for a wrong bucket or key."""
    for command in ("lint", "preview"):
        result = CliRunner().invoke(cli, [command, store["remote"]["cap"]])
        assert result.exit_code == 2 and "does not exist" not in result.output
        assert f"{store['remote']['cap']}: `energon-ray {command}` reads local datasets only" in " ".join(result.output.split())


def test_a_shard_cut_short_after_opening_stops_the_loader_naming_the_sample_it_lacks(store):
    """A shard replaced by a shorter object after the dataset was opened stops the loader with a ShardReadError
    naming its URL and the first sample past its new end (it named only the bytes of the whole run), no hang."""
    server, local = store["server"], store["local"]["cap"]
    url = server.upload(local, BUCKET, "cut")
    dataset = er.get_val_dataset(url, worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=1), batch_size=2)
    shard = dataset.dataset.shards[-1]
    offsets = read_tar_index(local / shard.name)
    cut = int(offsets[1]) + 10
    server.client().put_object(Bucket=BUCKET, Key=f"cut/{shard.name}", Body=(local / shard.name).read_bytes()[:cut])
    with pytest.raises(ShardReadError) as exc:
        _take(dataset, 100)
    assert str(exc.value) == (
        f"{url}/{shard.name}: truncated shard: sample #1 (bytes [{offsets[1]}, {offsets[2]})) lies past its end at byte "
        f"{cut}; the shard changed after the dataset was prepared (its .tar.idx ends at byte {offsets[-1]})"
    )
