"""Energon's dataset factories on energon_ray: each builds our dataset of its typed samples, and
``prepare_dataset`` writes metadata that Energon reads."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import braceexpand
import pytest
import yaml

import energon_ray as er
from energon_ray.format.dataset_yaml import write_dataset_yaml
from energon_ray.synthetic import encode_image, sample_image, write_shards

KEYS = [f"k{i}" for i in range(6)]


def _samples():
    return [
        (key, {
            "jpg": encode_image(sample_image(i, (8, 6))),
            "txt": f"caption {i}".encode(),
            "cls": str(i % 3).encode(),
            "json": json.dumps({"seq": ["a", str(i)], "texts": ["t"], "q": f"question {i}"}).encode(),
        })
        for i, key in enumerate(KEYS)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """6 samples (jpg, txt, cls, json) in 2 shards, prepared by ``BaseWebdatasetFactory.prepare_dataset``."""
    root = tmp_path_factory.mktemp("mixed")
    write_shards(root / "parts", _samples(), 3)
    parts = er.BaseWebdatasetFactory.prepare_dataset(
        root, ["parts/shard_{0000..0001}.tar"], split_parts_ratio=[("train", 1.0)], shuffle_seed=None, workers=1
    )
    assert parts == {"jpg", "txt", "cls", "json"}
    return root


def _wc():
    return er.WorkerConfig(rank=0, world_size=1, num_workers=1)


def _read(factory):
    return list(er.get_loader(factory.build()))


TYPED = [
    (er.CaptioningWebdataset, er.CaptioningSample, {"image": "jpg", "caption": "txt"}, "caption", "caption 1"),
    (er.ImageWebdataset, er.ImageSample, {"image": "jpg"}, None, None),
    (er.ImageClassificationWebdataset, er.ImageClassificationSample, {"image": "jpg", "label": "cls"}, "label", 1),
    (er.InterleavedWebdataset, er.InterleavedSample, {"sequence": "json[seq]"}, "sequence", ["a", "1"]),
    (er.MultiChoiceVQAWebdataset, er.MultiChoiceVQASample, {"image": "jpg", "context": "txt", "choices": "json[seq]"}, "choices", ["a", "1"]),
    (er.OCRWebdataset, er.OCRSample, {"image": "jpg", "text": "txt"}, "text", "caption 1"),
    (er.SimilarityInterleavedWebdataset, er.SimilarityInterleavedSample, {"images": "json[seq]", "texts": "json[texts]"}, "texts", ["t"]),
    (er.TextWebdataset, er.TextSample, {"text": "txt"}, "text", "caption 1"),
    (er.VQAWebdataset, er.VQASample, {"image": "jpg", "context": "json[q]"}, "context", "question 1"),
    (er.VQAOCRWebdataset, er.samples.VQAOCRSample, {"image": "jpg", "context": "json[q]", "text": "txt"}, "context", "question 1"),
    (er.VidQAWebdataset, er.VidQASample, {"video": "jpg", "context": "json[q]"}, "context", "question 1"),
]  # fmt: skip


@pytest.mark.parametrize("cls,sample_type,field_map,field,value", TYPED, ids=[t[0].__name__ for t in TYPED])
def test_typed_webdataset_builds_its_samples(mixed, cls, sample_type, field_map, field, value):
    """A typed factory (deprecated, with a warning) yields its sample type, every key in order, mapped fields."""
    with pytest.warns(FutureWarning, match="sample_type"):
        factory = cls(mixed, split_part="train", training=False, worker_config=_wc(), field_map=field_map)
    assert cls.__sample_type__ is sample_type and len(factory) == 6
    out = _read(factory)
    assert [type(s) for s in out] == [sample_type] * 6
    assert [s.__key__ for s in out] == KEYS
    if field is not None:
        assert getattr(out[1], field) == value
    if "image" in field_map:
        assert tuple(out[0].image.shape) == (3, 6, 8)


def test_standard_and_generic_factories(mixed):
    """StandardWebdatasetFactory takes sample_type=; DefaultGenericWebdatasetFactory keeps raw bytes."""
    std = er.StandardWebdatasetFactory(
        mixed, split_part="train", training=False, worker_config=_wc(), sample_type=er.TextSample,
        field_map={"text": "txt"}, subflavors={"src": "std"},
    )  # fmt: skip
    out = _read(std)
    assert [(s.__key__, s.text, s.__subflavors__) for s in out] == [(k, f"caption {i}", {"src": "std"}) for i, k in enumerate(KEYS)]

    class RawText(er.DefaultGenericWebdatasetFactory[er.TextSample]):
        pass

    raw = RawText(mixed, split_part="train", training=False, worker_config=_wc(),
                  sample_loader=lambda s: {"text": s["txt"] + b"!"}, part_filter=["txt"])  # fmt: skip
    assert RawText.__sample_type__ is er.TextSample
    assert [s.text for s in _read(raw)] == [f"caption {i}!".encode() for i in range(6)]
    with pytest.raises(TypeError, match="sample_type must be a subclass"):
        er.StandardWebdatasetFactory(mixed, split_part="train", training=False, sample_type=dict, field_map={})
    with pytest.raises(er.DatasetConfigError, match="exactly one of field_map or sample_loader"):
        er.StandardWebdatasetFactory(mixed, split_part="train", training=False, sample_type=er.TextSample)


@pytest.mark.parametrize("training", ["no", 0, None])
def test_training_must_be_a_bool(mixed, tmp_path, training):
    """``training`` is refused unless a bool, naming the factory (``"no"`` was truthy: a training pass)."""
    with pytest.raises(TypeError) as info:
        er.StandardWebdatasetFactory(mixed, split_part="train", training=training, sample_type=er.TextSample, field_map={"text": "txt"})
    assert str(info.value) == f"StandardWebdatasetFactory({mixed}): training must be True or False, got {training!r}"
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"idx": 0}\n')
    er.CrudeJsonlDatasetFactory.prepare_dataset(path)
    with pytest.raises(TypeError) as info:
        er.CrudeJsonlDatasetFactory(path, training=training)
    assert str(info.value) == f"CrudeJsonlDatasetFactory({path}): training must be True or False, got {training!r}"


def _subset_factory(path, subset):
    """A val factory of ``path``'s text captions with ``subset``."""
    return er.StandardWebdatasetFactory(
        path, split_part="train", training=False, worker_config=_wc(), sample_type=er.TextSample,
        field_map={"text": "txt"}, subset=subset,
    )  # fmt: skip


def test_subset_bounds_that_are_not_numbers_are_refused_naming_factory_and_value(mixed, tmp_path):
    """A subset whose bounds are not numbers (``'a%'``: a bare TypeError when planned) or that is no
    ``DatasetSubset`` (a dict: silently ignored) is refused at construction, naming the factory and the
    value; numeric ranges keep working."""
    import types

    from megatron.energon.flavors.webdataset.structs import DatasetSubset

    file = f"StandardWebdatasetFactory({mixed})"
    for subset, message in (
        (DatasetSubset(range=("a%", "50%")), "subset range must be (start, end) ratios from 0 to 1 (not the metadataset YAML's 'N%'), got ('a%', '50%')"),
        (types.SimpleNamespace(range=None, absolute_range=("x", None)), "subset absolute_range must be (start, end or None) sample indices, got ('x', None)"),
        ({"range": ["0%", "50%"]}, "subset must be Energon's DatasetSubset (range, absolute_range), got {'range': ['0%', '50%']}"),
    ):
        with pytest.raises(er.DatasetConfigError) as info:
            _subset_factory(mixed, subset)
        assert str(info.value) == f"{file}: {message}"
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"idx": 0}\n')
    er.CrudeJsonlDatasetFactory.prepare_dataset(path)
    with pytest.raises(er.DatasetConfigError, match=rf"^CrudeJsonlDatasetFactory\({re.escape(str(path))}\): subset range must be"):
        er.CrudeJsonlDatasetFactory(path, training=False, subset=DatasetSubset(range=("a%", 1)))
    assert [s.text for s in _read(_subset_factory(mixed, DatasetSubset(range=(0, 0.5))))] == ["caption 0", "caption 1", "caption 2"]
    assert [s.text for s in _read(_subset_factory(mixed, DatasetSubset(absolute_range=(4, None))))] == ["caption 4", "caption 5"]


def test_subsets_reversed_or_out_of_range_are_refused_naming_factory_or_dataset(mixed):
    """Reversed or out-of-range bounds are refused when the factory is made, naming it and the value
    (they were a bare ValueError when the loader planned); an absolute end past the dataset's 6
    samples, which only the dataset knows, is refused when it is built, naming the dataset; ranges at
    the edges are read."""
    from megatron.energon.flavors.webdataset.structs import DatasetSubset

    file = f"StandardWebdatasetFactory({mixed})"
    for subset, message in (
        (DatasetSubset(range=(0.8, 0.2)), "subset range must satisfy 0 <= start <= end <= 1, got (0.8, 0.2)"),
        (DatasetSubset(range=(0, 1.5)), "subset range must satisfy 0 <= start <= end <= 1, got (0, 1.5)"),
        (DatasetSubset(range=(-0.1, 0.5)), "subset range must satisfy 0 <= start <= end <= 1, got (-0.1, 0.5)"),
        (DatasetSubset(absolute_range=(4, 2)), "subset absolute_range must satisfy 0 <= start <= end, got (4, 2)"),
        (DatasetSubset(absolute_range=(-1, None)), "subset absolute_range must satisfy 0 <= start <= end, got (-1, None)"),
    ):
        with pytest.raises(er.DatasetConfigError) as info:
            _subset_factory(mixed, subset)
        assert str(info.value) == f"{file}: {message}"
    with pytest.raises(er.DatasetConfigError) as info:
        _read(_subset_factory(mixed, DatasetSubset(absolute_range=(2, 9))))
    assert str(info.value) == f"{mixed} (split part 'train'): subset range [2, 9] is outside the 6 samples of the dataset"
    assert [s.text for s in _read(_subset_factory(mixed, DatasetSubset(range=(0.5, 0.5))))] == []
    assert [s.text for s in _read(_subset_factory(mixed, DatasetSubset(absolute_range=(0, 6))))] == [f"caption {i}" for i in range(6)]


@er.edataclass
class ScoredText(er.Sample):
    text: str
    score: int


class ScoredWebdataset(er.DefaultDecoderWebdatasetFactory[ScoredText]):
    """A user's factory: its sample type comes from the generic argument."""


def test_user_factory_subclass_and_dataset_yaml_class(mixed, tmp_path):
    """A user subclass builds its sample type; as `__class__` in dataset.yaml it needs trust_dataset_code."""
    factory = ScoredWebdataset(mixed, split_part="train", training=False, worker_config=_wc(),
                               field_map={"text": "txt", "score": "cls"})  # fmt: skip
    out = _read(factory)
    assert [(type(s), s.__key__, s.score) for s in out] == [(ScoredText, k, i % 3) for i, k in enumerate(KEYS)]

    root = tmp_path / "user"
    shutil.copytree(mixed, root)
    module = ScoredWebdataset.__module__
    (root / ".nv-meta" / "dataset.yaml").write_text(yaml.safe_dump(
        {"__module__": module, "__class__": "ScoredWebdataset", "field_map": {"text": "txt", "score": "cls"}}
    ))  # fmt: skip
    with pytest.raises(er.UntrustedCodeError, match="trust_dataset_code=True"):
        er.get_val_dataset(root, split_part="train", batch_size=None, worker_config=_wc())
    assert sys.modules[module].ScoredWebdataset is ScoredWebdataset
    ds = er.get_val_dataset(root, split_part="train", batch_size=None, worker_config=_wc(), trust_dataset_code=True)
    assert [(type(s).__name__, s.__key__, s.score) for s in er.get_loader(ds)] == [("ScoredText", k, i % 3) for i, k in enumerate(KEYS)]


def test_crude_webdataset_yields_parts_and_meta(mixed):
    """CrudeWebdataset: decoded parts plus Energon's meta keys, subflavors set; part_filter limits the parts."""
    out = _read(er.CrudeWebdataset(mixed, split_part="train", training=False, worker_config=_wc(), subflavors={"n": 1}))
    assert isinstance(out[0], er.CrudeSample) and len(out) == 6
    assert set(out[0]) == {"jpg", "txt", "cls", "json", "__key__", "__shard__", "__restore_key__", "__subflavors__", "__sources__"}
    assert (out[2]["__key__"], out[2]["txt"], out[2]["json"]["q"], out[2]["__subflavors__"]) == ("k2", "caption 2", "question 2", {"n": 1})
    only = _read(er.CrudeWebdataset(mixed, split_part="train", training=False, worker_config=_wc(), part_filter=["txt"]))
    assert sorted(k for k in only[0] if not k.startswith("__")) == ["txt"]
    with pytest.raises(ValueError, match="no sample_loader"):
        er.CrudeWebdataset(mixed, split_part="train", training=False, sample_loader=lambda s: s)


def test_prepare_dataset_is_read_by_energon(mixed, tmp_path):
    """Energon's get_val_dataset/get_train_dataset read what prepare_dataset wrote: same samples, same order."""
    import megatron.energon as me

    root = tmp_path / "parity"
    shutil.copytree(mixed, root)
    write_dataset_yaml(root, "CaptioningSample", field_map={"image": "jpg", "caption": "txt"})
    wc = me.WorkerConfig(rank=0, world_size=1, num_workers=0)
    theirs = [(s.__key__, s.caption) for s in me.get_loader(me.get_val_dataset(root, split_part="train", batch_size=1, worker_config=wc))]
    ours = [(s.__key__, s.caption) for s in _read(er.StandardWebdatasetFactory(
        root, split_part="train", training=False, worker_config=_wc(), sample_type=er.CaptioningSample,
        field_map={"image": "jpg", "caption": "txt"}))]  # fmt: skip
    assert [(k[0], c[0]) for k, c in theirs] == ours == [(k, f"caption {i}") for i, k in enumerate(KEYS)]
    train = me.get_train_dataset(root, batch_size=1, worker_config=wc, shuffle_buffer_size=None, max_samples_per_sequence=None)
    assert len(train) == 6
    epoch = [b.__key__[0] for _, b in zip(range(6), me.get_loader(train))]
    assert sorted(epoch) == KEYS


def test_prepare_dataset_split_matches_energon(tmp_path):
    """split_parts_ratio with shuffle_seed and split_parts_patterns split the shards as Energon's prepare_dataset."""
    from megatron.energon.flavors import BaseWebdatasetFactory as TheirFactory

    def split_of(root):
        parts = yaml.safe_load((root / ".nv-meta" / "split.yaml").read_text())["split_parts"]
        return {p: [n for pattern in names for n in braceexpand.braceexpand(pattern)] for p, names in parts.items()}

    for kwargs in (dict(split_parts_ratio=[("train", 0.6), ("val", 0.2), ("test", 0.2)], shuffle_seed=42),
                   dict(split_parts_patterns=[("train", r"parts/shard_000[0-2]"), ("val", r"parts/shard_000[34]")])):  # fmt: skip
        ours, theirs = tmp_path / "ours", tmp_path / "theirs"
        for root in (ours, theirs):
            shutil.rmtree(root, ignore_errors=True)
            write_shards(root / "parts", _samples()[:5], 1)
        shards = ["parts/shard_{0000..0004}.tar"]
        er.BaseWebdatasetFactory.prepare_dataset(ours, shards, workers=1, **kwargs)
        TheirFactory.prepare_dataset(theirs, shards, workers=1, **kwargs)
        assert split_of(ours) == split_of(theirs)
        assert json.loads((ours / ".nv-meta" / ".info.json").read_text())["shard_counts"] == {
            f"parts/shard_{i:04d}.tar": 1 for i in range(5)
        }


def test_crude_jsonl_factories(tmp_path):
    """prepare_dataset indexes a .jsonl that Energon's factory accepts; ours yield bytes (crude) or dicts (default)."""
    from megatron.energon.flavors import CrudeJsonlDatasetFactory as TheirJsonl

    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"idx": i}) + "\n" for i in range(7)))
    assert er.CrudeJsonlDatasetFactory.prepare_dataset(path) == 7
    import megatron.energon as me
    from megatron.energon.epathlib import EPath

    assert len(TheirJsonl(EPath(path), training=False, worker_config=me.WorkerConfig(rank=0, world_size=1, num_workers=0))) == 7
    crude = er.CrudeJsonlDatasetFactory(path, training=False, worker_config=_wc())
    out = _read(crude)
    assert len(crude) == 7 and [s["__key__"] for s in out] == [str(i) for i in range(7)]
    assert out[3]["json"] == b'{"idx": 3}\n'
    default = er.DefaultCrudeJsonlDatasetFactory(path, training=False, worker_config=_wc(), subflavors={"s": 2})
    out = _read(default)
    assert [s["json"] for s in out] == [{"idx": i} for i in range(7)]
    assert set(out[0]) == {"json", "__key__", "__shard__", "__restore_key__", "__subflavors__", "__sources__"} and out[0]["__subflavors__"] == {"s": 2}
    assert len(er.CrudeJsonlDatasetFactory(path, training=False, part_filter=lambda p: p != "json")) == 0


def test_crude_jsonl_samples_hold_energons_bytes_line_ends_included(tmp_path):
    """A crude .jsonl sample's json holds its line's bytes as Energon's reader gives them: the line
    end (\\n, \\r\\n), blank lines after it, none after a last line without one."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.jsonl.ijsonl_reader import IJsonlReader

    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"idx": 0}\n{"idx": 1}\r\n\n{"idx": 2}\n{"idx": 3}')
    assert er.CrudeJsonlDatasetFactory.prepare_dataset(path) == 4
    theirs = IJsonlReader(EPath(path))
    expected = [b'{"idx": 0}\n', b'{"idx": 1}\r\n\n', b'{"idx": 2}\n', b'{"idx": 3}']
    assert [theirs[i]["json"] for i in range(4)] == expected
    out = _read(er.CrudeJsonlDatasetFactory(path, training=False, worker_config=_wc()))
    assert [s["json"] for s in out] == expected
    default = _read(er.DefaultCrudeJsonlDatasetFactory(path, training=False, worker_config=_wc()))
    assert [s["json"] for s in default] == [{"idx": i} for i in range(4)]


def test_as_file_store_reads_files_by_name_as_energons(mixed, tmp_path):
    """as_file_store(): a webdataset factory's files by '<key>.<part>', a JSONL factory's lines by '<index>.json'."""
    store = er.CrudeWebdataset(mixed, split_part="train", training=False, worker_config=_wc()).as_file_store()
    data, info = store["k2.txt"]
    assert (data, info.index, info.file_names, info.dataset_path) == (b"caption 2", "k2.txt", ("k2.txt",), str(mixed.absolute()))
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"idx": 0}\n{"idx": 1}\n')
    er.CrudeJsonlDatasetFactory.prepare_dataset(path)
    lines = er.DefaultCrudeJsonlDatasetFactory(path, training=False, worker_config=_wc()).as_file_store()
    assert lines["1.json"] == (b'{"idx": 1}\n', er.SourceInfo(str(path), 1, "corpus.jsonl", ("1.json",)))


def test_a_jsonl_samples_source_names_its_line_as_energon_does(tmp_path):
    """A .jsonl sample's SourceInfo: the file, the line index, the file's name and '<index>.json' (Energon's;
    the loader hands a dict sample's tuple of sources out as a list, as Energon's torch DataLoader does)."""
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"idx": i}) + "\n" for i in range(3)))
    er.CrudeJsonlDatasetFactory.prepare_dataset(path)
    out = _read(er.DefaultCrudeJsonlDatasetFactory(path, training=False, worker_config=_wc()))
    assert [s["__sources__"] for s in out] == [
        [er.SourceInfo(dataset_path=str(path), index=i, shard_name="corpus.jsonl", file_names=(f"{i}.json",))] for i in range(3)
    ]


def test_a_factory_of_a_relative_path_loads_its_sample_loader_file_in_the_workers(tmp_path, monkeypatch):
    """A factory given a folder relative to the caller's directory and sample_loader='file.py:function':
    the segment tasks, whose Ray workers run in another directory (the session Ray's; a cluster's), load
    the same file (they looked for '<path>/.nv-meta' in theirs: 'does not exist')."""
    write_shards(tmp_path / "ds" / "parts", [(f"k{i:03d}", {"txt": f"caption {i}".encode()}) for i in range(48)], 8)
    er.BaseWebdatasetFactory.prepare_dataset(tmp_path / "ds", ["parts/shard_{0000..0005}.tar"], split_parts_ratio=[("train", 1.0)],
                                             shuffle_seed=None, workers=1)  # fmt: skip
    (tmp_path / "ds" / ".nv-meta" / "loader_rel.py").write_text("def load(raw):\n    return {'text': 'loaded ' + raw['txt'].decode()}\n")
    monkeypatch.chdir(tmp_path)

    class LoadedText(er.DefaultGenericWebdatasetFactory[er.TextSample]):
        pass

    factory = LoadedText("ds", split_part="train", training=False, worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=2),
                         sample_loader="loader_rel.py:load", part_filter=["txt"], trust_dataset_code=True)  # fmt: skip
    assert sorted(s.text for s in _read(factory)) == sorted(f"loaded caption {i}" for i in range(48))
