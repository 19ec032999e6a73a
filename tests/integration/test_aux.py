"""Auxiliary data on Ray: a crude dataset's cooker fetches images by name from an aux dataset and an
aux folder (a metadataset's ``aux:``), through a ``FileStoreCachePool`` shared by the segment tasks."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

import energon_ray as er
from energon_ray.format.media_index import MediaFilter, write_folder_media_metadata
from energon_ray.format.prepare import prepare_dataset
from energon_ray.synthetic import write_shards

WC = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
N = 12


def _png(width: int, height: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def write_aux_tree(root) -> "Path":
    """main (crude: txt names an image), imgs (prepared: img_K.png of K+8 x K+4), pics/pic_K.png
    (K+5 x K+3), both with media metadata, and aux.yaml naming them (relative paths); returns aux.yaml."""
    write_shards(root / "main" / "shards", [(f"s{i:03d}", {"txt": f"{i % 4}".encode()}) for i in range(N)], 5)
    prepare_dataset(root / "main", split_ratio=(1, 0, 0), sample_type="CrudeWebdataset", progress=False)
    write_shards(root / "imgs" / "shards", [(f"img_{k}", {"png": _png(k + 8, k + 4, k)}) for k in range(4)], 2)
    prepare_dataset(root / "imgs", split_ratio=(1, 0, 0), sample_type="CrudeWebdataset", progress=False,
                    media_filter=MediaFilter.parse(extension=True))  # fmt: skip
    (root / "pics").mkdir()
    for k in range(4):
        (root / "pics" / f"pic_{k}.png").write_bytes(_png(k + 5, k + 3, 10 + k))
    write_folder_media_metadata(root / "pics", MediaFilter.parse(extension=True))
    mds = root / "aux.yaml"
    mds.write_text(yaml.safe_dump({
        "__module__": "megatron.energon", "__class__": "MetadatasetV2",
        "splits": {"train": {"path": "main", "aux": {"imgs": "imgs", "pics": "filesystem://pics"}}},
    }))  # fmt: skip
    return mds


@pytest.fixture(scope="module")
def aux_mds(tmp_path_factory):
    return write_aux_tree(tmp_path_factory.mktemp("aux"))


@er.stateless
@er.cooker(need_cache=True, need_primary=True)
def cook_with_aux(sample, imgs, pics, cache, primary):
    k = int(sample["txt"])
    image = cache.get(imgs, f"img_{k}.png", sample)
    lazy = cache.get_lazy(pics, f"pic_{k}.png")
    pic = lazy.get(sample)
    own = primary.get(".txt")
    return er.CaptioningSample(
        **er.basic_sample_keys(sample), image=image,
        caption=f"{own}|{tuple(pic.shape)}|{type(lazy).__name__}",
    )  # fmt: skip


class AuxEncoder(er.DefaultTaskEncoder):
    cookers = [er.Cooker(cook_with_aux)]


def run_aux(mds, pool):
    ds = er.get_val_dataset(mds, split_part="train", batch_size=None, worker_config=WC, task_encoder=AuxEncoder())
    return {s.__key__: s for s in er.get_loader(ds, cache_pool=pool)}


def buffered_files(root):
    """Files in the prefetch buffers of every process (a Ray worker's folder may go as it exits)."""
    out = []
    for folder in root.iterdir():
        try:
            out += [f.name for f in folder.iterdir()]
        except FileNotFoundError:
            pass
    return out


def test_cooker_fetches_aux_images_through_the_cache_pool(ray_session, aux_mds, tmp_path):
    """Every sample gets its aux dataset image and aux folder image decoded, with exact shapes and sources."""
    pool = er.FileStoreCachePool(parent_cache_dir=tmp_path / "cache", max_cache_size_gbytes=0.01)
    samples = run_aux(aux_mds, pool)
    assert sorted(samples) == [f"s{i:03d}" for i in range(N)]
    for i in range(N):
        s, k = samples[f"s{i:03d}"], i % 4
        assert tuple(s.image.shape) == (3, k + 4, k + 8)
        assert s.caption == f"{k}|{(3, k + 3, k + 5)}|FileCacheLazy"
        names = [name for info in s.__sources__ for name in info.file_names]
        assert names == [f"s{i:03d}.txt", f"img_{k}.png", f"pic_{k}.png"]
    # the segment tasks filled one node cache: 4 dataset images + 4 folder images, each once; every
    # lazy was read, so no prefetch buffer holds anything
    assert pool.node_cache_count == 8 and pool.current_cache_count == 0
    cached = sorted(p.name for p in pool.node_cache_dir.iterdir())
    assert len(cached) == 8 and all(name.endswith(".entry") for name in cached)
    assert buffered_files(pool.cache_dir.parent) == []


def test_pickle_method_needs_trust(ray_session, aux_mds, tmp_path, monkeypatch):
    """method='pickle' is refused without the opt-in (naming it); trusted, it gives the same samples."""
    monkeypatch.delenv("ENERGON_RAY_TRUST_DATASET_CODE", raising=False)
    with pytest.raises(er.UntrustedCodeError, match=r"method='pickle'.*trust_dataset_code=True"):
        er.FileStoreCachePool(parent_cache_dir=tmp_path / "cache", method="pickle")
    pool = er.FileStoreCachePool(parent_cache_dir=tmp_path / "cache", method="pickle", trust_dataset_code=True)
    samples = run_aux(aux_mds, pool)
    assert sorted(samples) == [f"s{i:03d}" for i in range(N)]
    assert {tuple(s.image.shape) for s in samples.values()} == {(3, k + 4, k + 8) for k in range(4)}
    assert pool.node_cache_count == 8


def test_need_cache_without_a_pool_is_a_clear_error(ray_session, aux_mds):
    """A need_cache cooker on a loader without cache_pool= fails, naming get_loader(cache_pool=...)."""
    encoder = AuxEncoder()
    encoder.__default_failure_tolerance__ = 1
    ds = er.get_val_dataset(aux_mds, split_part="train", batch_size=None, worker_config=WC, task_encoder=encoder)
    with pytest.raises(Exception, match=r"cache_pool=FileStoreCachePool"):
        list(er.get_loader(ds))


def test_a_relative_metadataset_path_reads_its_aux_from_the_callers_directory(ray_session, aux_mds, tmp_path, monkeypatch):
    """aux.yaml given relative to the caller's directory, whose Ray workers run in another one (the
    session Ray's; a cluster's): the same samples as by its absolute path (the aux dataset and folder
    went to the segment tasks as relative paths, looked up in the worker's directory)."""
    def seen(mds):
        pool = er.FileStoreCachePool(parent_cache_dir=tmp_path / f"cache_{len(str(mds))}", max_cache_size_gbytes=0.01)
        return {key: (s.caption, tuple(s.image.shape)) for key, s in run_aux(mds, pool).items()}

    expected = seen(aux_mds)
    monkeypatch.chdir(aux_mds.parent)
    assert seen(aux_mds.name) == expected and len(expected) == N


@er.stateless
@er.cooker(need_primary=True)
def cook_jsonl_line_again(sample, primary):
    again = primary.get(".json", sample)
    return er.TextSample(**er.basic_sample_keys(sample), text=f"{again['t']}|{primary['0.json'][0]['t']}")


class JsonlPrimaryEncoder(er.DefaultTaskEncoder):
    cookers = [er.Cooker(cook_jsonl_line_again)]


def test_need_primary_on_a_jsonl_reads_its_lines_by_index_json(ray_session, tmp_path):
    """A .jsonl dataset's primary= reads '<index>.json' lines (decoded), its SourceInfo added, as Energon's JsonlFileStore."""
    from energon_ray.format.jsonl import prepare_jsonl

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"t": "line{i}"}}\n' for i in range(3)))
    prepare_jsonl(corpus, progress=False)
    ds = er.get_val_dataset(corpus, split_part="train", batch_size=None, worker_config=WC, task_encoder=JsonlPrimaryEncoder())
    out = {s.__key__: s for s in er.get_loader(ds)}
    assert {k: s.text for k, s in out.items()} == {"0": "line0|line0", "1": "line1|line0", "2": "line2|line0"}
    assert out["2"].__sources__[-1] == er.SourceInfo(
        dataset_path=str(corpus), index=2, shard_name="corpus.jsonl", file_names=("2.json",)
    )


def test_aux_on_a_dataset_that_is_not_crude_is_refused_naming_file_and_node(tmp_path):
    """aux: on a typed (not crude) dataset: DatasetConfigError naming the YAML, the node, the aux names and the sample type (Energon refuses it too)."""
    from tests.helpers import captioning_dataset

    captioning_dataset(tmp_path / "cap", n=4, per_shard=2)
    (tmp_path / "files").mkdir()
    mds = tmp_path / "m.yaml"
    mds.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2",
                                   "splits": {"train": {"path": "cap", "aux": {"f": "filesystem://files"}}}}))  # fmt: skip
    with pytest.raises(er.DatasetConfigError) as info:
        er.get_val_dataset(mds, split_part="train", batch_size=2, worker_config=WC, task_encoder=er.DefaultTaskEncoder())
    assert str(info.value) == (
        f"{mds}: splits.train: aux ['f']: only a crude dataset's cookers read aux data, and {tmp_path / 'cap'} holds "
        "CaptioningSample samples (make it a CrudeWebdataset, or drop aux)"
    )


def test_plain_aux_path_to_an_unprepared_folder_is_refused_naming_entry_path_and_the_two_ways(tmp_path):
    """aux 'pics' (no filesystem://) on a folder without .nv-meta: DatasetConfigError when the dataset is
    built, naming the YAML, node, entry and folder, saying to prepare it or write filesystem:// (Energon
    asserts that an aux dataset is prepared); written filesystem://pics the same folder opens."""
    import shutil

    mds = write_aux_tree(tmp_path)
    shutil.rmtree(tmp_path / "pics" / ".nv-meta")
    spec = {"__module__": "megatron.energon", "__class__": "MetadatasetV2",
            "splits": {"train": {"path": "main", "aux": {"imgs": "imgs", "pics": "pics"}}}}  # fmt: skip
    mds.write_text(yaml.safe_dump(spec))
    with pytest.raises(er.DatasetConfigError) as info:
        er.get_val_dataset(mds, split_part="train", batch_size=None, worker_config=WC, task_encoder=AuxEncoder())
    pics = tmp_path / "pics"
    assert str(info.value) == (
        f"{mds}: splits.train: aux.pics: {pics} is a folder but no prepared dataset (no .nv-meta/.info.json); "
        f"a plain aux path names a prepared dataset, as in Energon: prepare it (energon-ray prepare {pics}), "
        "or write it filesystem://<path> to read the folder's files by relative path"
    )
    spec["splits"]["train"]["aux"]["pics"] = "filesystem://pics"
    mds.write_text(yaml.safe_dump(spec))
    er.get_val_dataset(mds, split_part="train", batch_size=None, worker_config=WC, task_encoder=AuxEncoder())


def test_plain_aux_path_to_a_prepared_dataset_without_its_index_is_refused_naming_the_folder_and_the_fix(tmp_path):
    """aux 'imgs' on a prepared dataset whose .nv-meta/index.sqlite is gone (its .info.json is there):
    DatasetConfigError when the dataset is built, naming the YAML, node, entry, folder and the missing
    file, and saying how to write it (it was accepted, and the cooker's first read failed in a Ray
    task); Energon asserts too (an aux dataset must have its index.sqlite)."""
    import megatron.energon as me

    mds = write_aux_tree(tmp_path)
    imgs = tmp_path / "imgs"
    (imgs / ".nv-meta" / "index.sqlite").unlink()
    with pytest.raises(er.DatasetConfigError) as info:
        er.get_val_dataset(mds, split_part="train", batch_size=None, worker_config=WC, task_encoder=AuxEncoder())
    assert str(info.value) == (
        f"{mds}: splits.train: aux.imgs: {imgs} is a prepared dataset without its index "
        f"({imgs / '.nv-meta' / 'index.sqlite'} is missing), which a plain aux path reads files by name through, "
        f"as in Energon: write it with energon-ray prepare {imgs}, or write the aux filesystem://<path> to read "
        "the folder's files by relative path"
    )

    class Theirs(me.DefaultTaskEncoder):
        cookers = [me.Cooker(cook_with_aux)]

    with pytest.raises(AssertionError, match="Auxiliary datasets must be prepared Energon datasets"):
        me.get_val_dataset(mds, split_part="train", batch_size=None, worker_config=me.WorkerConfig(rank=0, world_size=1, num_workers=0),
                           task_encoder=Theirs())  # fmt: skip


def test_a_main_dataset_without_its_index_sqlite_is_read_as_energon_reads_it(ray_session, tmp_path):
    """A prepared dataset whose .nv-meta/index.sqlite is gone is still a main dataset, as in Energon
    (its samples are read through their .tar.idx): the same samples."""
    import megatron.energon as me

    from tests.helpers import prefixed_text_dataset

    root = prefixed_text_dataset(tmp_path / "t", "t", 6, per_shard=4)
    (root / ".nv-meta" / "index.sqlite").unlink()
    got, expected = (
        [s.__key__ for s in lib.get_loader(lib.get_val_dataset(root, split_part="train", batch_size=None, task_encoder=lib.DefaultTaskEncoder(),
                                                               worker_config=lib.WorkerConfig(rank=0, world_size=1, num_workers=0)))]
        for lib in (er, me)
    )  # fmt: skip
    assert got == expected == [f"t_{i:06d}" for i in range(6)]


def _cook_own_text(lib):
    @lib.stateless
    @lib.cooker(need_primary=True)
    def cook(sample, primary):
        return lib.TextSample(**lib.basic_sample_keys(sample), text=str(primary.get(".txt")))

    return cook


def test_a_crude_dataset_without_index_sqlite_whose_cooker_needs_primary_is_refused_naming_it(tmp_path):
    """A crude dataset whose .nv-meta/index.sqlite is gone, cooked by a ``need_primary`` cooker (its
    own files read by name through that index): DatasetConfigError when the dataset is built, naming
    the dataset's folder, the missing file and how to write it (every sample was skipped instead, each
    cooking failing in a Ray task); Energon refuses it when the dataset is built too (SystemError)."""
    import megatron.energon as me

    write_aux_tree(tmp_path)
    main = tmp_path / "main"
    (main / ".nv-meta" / "index.sqlite").unlink()

    def build(lib):
        encoder = type("Cooking", (lib.DefaultTaskEncoder,), {"cookers": [lib.Cooker(_cook_own_text(lib))]})()
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=0)
        return lib.get_val_dataset(main, split_part="train", batch_size=None, task_encoder=encoder, worker_config=wc)

    with pytest.raises(er.DatasetConfigError) as info:
        build(er)
    assert str(info.value) == (
        f"{main}: a cooker that needs primary= reads the dataset's own files by name through "
        f"{main / '.nv-meta' / 'index.sqlite'}, which is missing, as Energon refuses it: write it with "
        f"energon-ray prepare {main}"
    )
    with pytest.raises(SystemError, match="Error getting primary auxiliary dataset"):
        build(me)


def _cook_by_filesystem_and_by_dataset(lib):
    @lib.stateless
    @lib.cooker
    def cook(sample, raw, ds):
        note = raw.get(f"notes/{sample['txt']}.txt", sample)
        image = ds.get(f"img_{sample['txt']}.png", sample)
        return lib.TextSample(**lib.basic_sample_keys(sample), text=f"{note}|{tuple(image.shape)}")

    return cook


def test_filesystem_aux_on_a_prepared_folder_reads_its_files_by_path_as_energon(ray_session, tmp_path):
    """aux 'filesystem://imgs' on a prepared dataset folder is that folder's files by relative path
    (Energon's SystemFileStore), while aux 'imgs' reads its samples' files by '<key>.<part>'."""
    import megatron.energon as me

    write_aux_tree(tmp_path)
    (tmp_path / "imgs" / "notes").mkdir()
    for k in range(4):
        (tmp_path / "imgs" / "notes" / f"{k}.txt").write_text(f"note {k}")
    mds = tmp_path / "fs.yaml"
    mds.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2",
                                   "splits": {"train": {"path": "main", "aux": {"raw": "filesystem://imgs", "ds": "imgs"}}}}))  # fmt: skip

    class Ours(er.DefaultTaskEncoder):
        cookers = [er.Cooker(_cook_by_filesystem_and_by_dataset(er))]

    class Theirs(me.DefaultTaskEncoder):
        cookers = [me.Cooker(_cook_by_filesystem_and_by_dataset(me))]

    ours = er.get_loader(er.get_val_dataset(mds, split_part="train", batch_size=None, worker_config=WC, task_encoder=Ours()))
    got = {s.__key__: s.text for s in ours}
    their_wc = me.WorkerConfig(rank=0, world_size=1, num_workers=0)
    theirs = me.get_loader(me.get_val_dataset(mds, split_part="train", batch_size=None, worker_config=their_wc, task_encoder=Theirs()))
    expected = {s.__key__: s.text for s in theirs}
    assert got == expected == {f"s{i:03d}": f"note {i % 4}|{(3, i % 4 + 4, i % 4 + 8)}" for i in range(N)}
