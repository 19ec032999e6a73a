"""Blending and mixing on Ray: seeded weighted unions of per-source streams, metadataset YAML."""

from __future__ import annotations

import collections
import itertools
import re
from dataclasses import dataclass
from typing import List

import pytest
import torch

import energon_ray as er
from tests.helpers import captioning_dataset, classification_dataset, prefixed_text_dataset

WC = er.WorkerConfig(rank=0, world_size=1, num_workers=2)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("blend")
    return {
        "a": prefixed_text_dataset(root / "a", "a", 40),
        "b": prefixed_text_dataset(root / "b", "b", 60, subflavors={"src": "b"}),
        "c": prefixed_text_dataset(root / "c", "c", 30),
        "root": root,
    }


def _train(path, wc=WC, **kwargs):
    kwargs.setdefault("batch_size", 1)
    return er.get_train_dataset(path, worker_config=wc, shuffle_buffer_size=None, max_samples_per_sequence=None, **kwargs)


def _source_sequence(loader, n):
    it = iter(loader)
    out = [next(it).__key__[0][0] for _ in range(n)]
    loader.close()
    return out


def test_blend_shares_follow_weights_and_seed(sources):
    """0.6/0.4 over 2000 batches: share within ±3 points; same seed → same sequence; new seed_offset → another."""
    def blend(wc):
        return er.get_loader(er.BlendDataset((_train(sources["a"], wc), 0.6), (_train(sources["b"], wc), 0.4)))

    a, b = _train(sources["a"], WC), _train(sources["b"], WC)
    pairs = er.BlendDataset((a, 3), (b, 2))
    assert pairs.dataset_weights == ((a, 3), (b, 2)) and pairs.weights == [0.6, 0.4]  # as given / normalised
    first = _source_sequence(blend(WC), 2000)
    share = first.count("a") / len(first)
    assert abs(share - 0.6) <= 0.03, share
    assert _source_sequence(blend(WC), 2000) == first
    other = er.WorkerConfig(rank=0, world_size=1, num_workers=2, seed_offset=3)
    assert _source_sequence(blend(other), 2000) != first


def test_mix_batch_composition_averages_weights(sources):
    """Mixing 6:4 into batches of 32: per-batch composition averages 60/40 within ±2 points over 500 batches;
    keys stay a flat list."""
    mix = er.MixBatchDataset(
        (_train(sources["a"]), 6), (_train(sources["b"]), 4), batch_size=32, batch_mix_fn=er.homogeneous_concat_mix
    )
    loader = er.get_loader(mix)
    it = iter(loader)
    shares = []
    for _ in range(500):
        batch = next(it)
        assert isinstance(batch.__key__, list) and len(batch.__key__) == 32 and isinstance(batch.__key__[0], str)
        shares.append(sum(k.startswith("a") for k in batch.__key__) / 32)
    loader.close()
    assert abs(sum(shares) / len(shares) - 0.6) <= 0.02


def _epochized_yaml(root, reps_a, reps_b):
    path = root / f"epochized_{reps_a}_{reps_b}.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        f"      - {{repetitions: {reps_a}, path: a}}\n      - {{repetitions: {reps_b}, path: b}}\n"
    )
    return path


def test_blend_epochized_exact_counts(sources):
    """repetitions 2 and 0.5 with repeat=False: every sample of a appears exactly twice; b gives exactly
    half of each worker's samples (floor per worker) once; the next pass reshuffles with the same counts."""
    path = _epochized_yaml(sources["root"], 2, 0.5)
    loader = er.get_loader(er.get_train_dataset(path, worker_config=WC, batch_size=4, repeat=False))
    keys = [k for b in loader for k in b.__key__]
    counts = collections.Counter(keys)
    a_keys = {f"a_{i:06d}" for i in range(40)}
    assert {k for k in counts if k.startswith("a")} == a_keys and all(counts[k] == 2 for k in a_keys)
    b_counts = [c for k, c in counts.items() if k.startswith("b")]
    assert len(b_counts) == 30 and set(b_counts) == {1}
    assert len(keys) == 80 + 30
    again = [k for b in loader for k in b.__key__]
    again_counts = collections.Counter(again)
    assert all(again_counts[k] == 2 for k in a_keys) and len(again) == 110 and again != keys
    assert sorted(c for k, c in again_counts.items() if k.startswith("b")) == [1] * 30


def test_nested_yaml_weights_multiply_and_subflavors_arrive(sources):
    """A nested blend's effective weights are the products (observed within ±3 points); subflavors
    (dataset.yaml < inner < outer) arrive on the samples."""
    root = sources["root"]
    (root / "inner.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 3, path: b, subflavors: {level: inner}}\n      - {weight: 1, path: c}\n"
    )
    (root / "outer.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 1, path: a}\n      - {weight: 1, path: inner.yaml, subflavors: {level: outer, tag: x}}\n"
    )
    loader = er.get_loader(er.get_train_dataset(root / "outer.yaml", worker_config=WC, batch_size=1))
    it = iter(loader)
    seen = collections.Counter()
    flavors = {}
    for _ in range(2000):
        batch = next(it)
        src = batch.__key__[0][0]
        seen[src] += 1
        flavors.setdefault(src, batch.__subflavors__[0])
    loader.close()
    for src, expected in (("a", 0.5), ("b", 0.375), ("c", 0.125)):
        assert abs(seen[src] / 2000 - expected) <= 0.03, (src, seen)
    assert flavors["b"] == {"src": "b", "level": "outer", "tag": "x"}
    assert flavors["c"] == {"level": "outer", "tag": "x"} and flavors["a"] == {}


def test_train_yaml_blends_samples_then_batches(sources):
    """By default (``blend_samples=None``, as ``True``) a batched train metadataset blends samples and
    then batches them, as Energon does: batches mix the datasets; over 150 batches of 8 each source's
    share is its weight's within ±4 points; the same seed gives the same batches, another seed other
    ones; the batches are made in Ray tasks (counted as seam batches), not by the loader.
    ``blend_samples=False`` gives whole per-dataset batches."""
    root = sources["root"]
    (root / "samples.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 3, path: a}\n      - {weight: 1, path: c}\n"
    )

    def keys(wc, n=150, **kwargs):
        ds = er.get_train_dataset(root / "samples.yaml", worker_config=wc, batch_size=8, shuffle_buffer_size=10, **kwargs)
        loader = er.get_loader(ds)
        it = iter(loader)
        out = [tuple(next(it).__key__) for _ in range(n)]
        stats = loader.stats
        loader.close()
        return out, stats

    batches, stats = keys(WC)  # the default
    assert all(len(b) == 8 for b in batches)
    mixed = [b for b in batches if len({k[0] for k in b}) == 2]
    assert len(mixed) >= 0.8 * len(batches), f"only {len(mixed)} of {len(batches)} batches mix both datasets"
    flat = [k for b in batches for k in b]
    assert abs(sum(k.startswith("a") for k in flat) / len(flat) - 0.75) <= 0.04
    assert stats.seam_batches >= len(batches) and stats.batches == len(batches)
    assert keys(WC, blend_samples=True)[0] == batches
    other = er.WorkerConfig(rank=0, world_size=1, num_workers=2, seed_offset=5)
    assert keys(other, 20)[0] != batches[:20]
    whole, _ = keys(WC, 20, blend_samples=False)
    assert all(len({k[0] for k in b}) == 1 for b in whole)  # whole per-dataset batches


class _Pairs(er.DefaultTaskEncoder):
    """Packs of two samples in buffer order, keyed ``a_000001+c_000004``."""

    def select_samples_to_pack(self, samples):
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]

    def pack_selected_samples(self, samples):
        return er.TextSample(__key__="+".join(s.__key__ for s in samples), __restore_key__=(), text="|".join(s.text for s in samples))


def test_an_unbatched_packed_train_yaml_packs_the_blended_samples(sources):
    """Unbatched (``batch_size=None``) and packed, a train metadataset packs the blended samples, as
    Energon blends and then packs: packs mix the datasets (a pair mixes 3:1 sources 3 times in 8),
    over 150 packs each source's share of the samples is its weight's within ±7 points; the same seed
    gives the same packs whatever the segments, another seed other ones."""
    root = sources["root"]
    (root / "packed.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 3, path: a}\n      - {weight: 1, path: c}\n"
    )

    def packs(wc, n=150, **kwargs):
        ds = er.get_train_dataset(root / "packed.yaml", worker_config=wc, batch_size=None, packing_buffer_size=6,
                                  shuffle_buffer_size=10, task_encoder=_Pairs(), **kwargs)  # fmt: skip
        loader = er.get_loader(ds)
        out = [pack.__key__ for pack in itertools.islice(loader, n)]
        loader.close()
        return out

    got = packs(WC)
    assert all(key.count("+") == 1 for key in got)
    mixed = [key for key in got if {part[0] for part in key.split("+")} == {"a", "c"}]
    assert len(mixed) >= 0.2 * len(got), f"only {len(mixed)} of {len(got)} packs mix both datasets: {got[:8]}"
    samples = [part for key in got for part in key.split("+")]
    assert abs(sum(k.startswith("a") for k in samples) / len(samples) - 0.75) <= 0.07
    assert packs(WC, samples_per_segment=(3, 7)) == got
    other = er.WorkerConfig(rank=0, world_size=1, num_workers=2, seed_offset=5)
    assert packs(other, 20) != got[:20]


def test_blend_samples_refuses_grouping(sources):
    """``blend_samples=True`` with a batch group criterion is refused by name (grouping runs in the
    datasets' Ray tasks, before blending), not quietly turned into whole per-dataset batches; left
    at its default it gives whole per-dataset batches; with packing it builds (packs are made of the
    blended samples: test_save_restore)."""
    root = sources["root"]
    (root / "pack.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 1, path: a}\n      - {weight: 1, path: c}\n"
    )

    class Grouped(er.DefaultTaskEncoder):
        def batch_group_criterion(self, sample):
            return 0, None  # one bucket of batch_size

    with pytest.raises(ValueError, match=r"pack\.yaml: blend_samples=True cannot be combined with Grouped\.batch_group_criterion"):
        er.get_train_dataset(root / "pack.yaml", worker_config=WC, batch_size=4, task_encoder=Grouped(), blend_samples=True)
    # by default (and with blend_samples=False) it builds whole per-dataset (grouped) batches; with one
    # dataset there is no blend
    for kwargs in ({}, {"blend_samples": False}):
        loader = er.get_loader(er.get_train_dataset(root / "pack.yaml", worker_config=WC, batch_size=4, task_encoder=Grouped(), **kwargs))
        it = iter(loader)
        assert all(len({k[0] for k in next(it).__key__}) == 1 for _ in range(8))
        loader.close()
    with pytest.raises(TypeError, match="blend_samples must be a bool or None, got 'yes'"):
        er.get_train_dataset(root / "pack.yaml", worker_config=WC, batch_size=4, blend_samples="yes")
    (root / "one.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - {weight: 1, path: a}\n"
    )
    er.get_train_dataset(root / "one.yaml", worker_config=WC, batch_size=4, task_encoder=Grouped(), blend_samples=True)


def test_val_yaml_concatenates_sources_in_order(sources):
    """get_val_dataset on a YAML concatenates the sources per worker stream, no randomness, weights ignored."""
    root = sources["root"]
    (root / "val.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  val:\n    blend:\n"
        "      - {weight: 9, path: c, split_part: train}\n      - {weight: 1, path: a, split_part: train}\n"
    )
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    keys = [k for b in er.get_loader(er.get_val_dataset(root / "val.yaml", worker_config=wc, batch_size=10)) for k in b.__key__]
    assert keys == [f"c_{i:06d}" for i in range(30)] + [f"a_{i:06d}" for i in range(40)]


# -- the seed document's examples, with only the import changed --------------------------------


@dataclass
class ImageBatch:
    __keys__: List[str]
    images: torch.Tensor
    labels: torch.Tensor


@dataclass
class CaptioningBatch:
    __keys__: List[str]
    images: torch.Tensor
    captions: List[str]
    weight: float = 1.0


class ImageTask(er.DefaultTaskEncoder):
    def encode_sample(self, sample):
        sample.image = sample.image[:, :8, :8]
        return sample

    def batch(self, samples):
        return ImageBatch(
            __keys__=[s.__key__ for s in samples],
            images=er.batch_stack([s.image for s in samples]),
            labels=torch.tensor([s.label for s in samples]),
        )


class CaptioningTask(er.DefaultTaskEncoder):
    def __init__(self, sample_weight: float = 1.0):
        super().__init__()
        self.sample_weight = sample_weight

    def encode_sample(self, sample):
        sample.image = sample.image[:, :8, :8]
        return sample

    def batch(self, samples):
        return CaptioningBatch(
            __keys__=[s.__key__ for s in samples],
            images=er.batch_stack([s.image for s in samples]),
            captions=[s.caption for s in samples],
            weight=self.sample_weight,
        )


@pytest.fixture(scope="module")
def image_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    return classification_dataset(root / "img", "img", 30), captioning_dataset(root / "cap", n=30, per_shard=10)


def test_documents_blend_and_concat_examples(image_sources):
    """BlendDataset of different task encoders and batch types, and ConcatDataset, called as the document does."""
    images, captions = image_sources
    loader = er.get_loader(
        er.BlendDataset(
            (er.get_train_dataset(images, batch_size=4, shuffle_buffer_size=100, max_samples_per_sequence=100, task_encoder=ImageTask()), 0.6),
            (er.get_train_dataset(captions, batch_size=4, shuffle_buffer_size=100, max_samples_per_sequence=100, task_encoder=CaptioningTask(0.8)), 0.4),
        )
    )
    it = iter(loader)
    kinds = collections.Counter(type(next(it)).__name__ for _ in range(60))
    loader.close()
    assert set(kinds) == {"ImageBatch", "CaptioningBatch"}
    val = er.get_loader(
        er.ConcatDataset(
            er.get_val_dataset(images, split_part="train", batch_size=8, task_encoder=ImageTask()),
            er.get_val_dataset(captions, split_part="train", batch_size=8, task_encoder=CaptioningTask()),
        )
    )
    batches = list(val)
    assert sum(len(b.__keys__) for b in batches) == 60
    assert {type(b).__name__ for b in batches} == {"ImageBatch", "CaptioningBatch"}


def test_documents_heterogeneous_mix_and_map(image_sources):
    """MixBatchDataset of different batch types with a user batch_mix_fn (concat_pad), then Epochize and Map."""
    images, captions = image_sources

    @dataclass
    class ImageWithOptionalCaptionBatch:
        images: torch.Tensor
        captions: list

    def my_mix_fn(batch):
        return ImageWithOptionalCaptionBatch(
            images=er.concat_pad([entry.images for entry in batch]),
            captions=[entry.captions[0] if isinstance(entry, CaptioningBatch) else None for entry in batch],
        )

    mix = er.MixBatchDataset(
        (er.get_train_dataset(images, batch_size=1, shuffle_buffer_size=100, max_samples_per_sequence=100, task_encoder=ImageTask()), 6),
        (er.get_train_dataset(captions, batch_size=1, shuffle_buffer_size=100, max_samples_per_sequence=100, task_encoder=CaptioningTask()), 4),
        batch_size=8,
        batch_mix_fn=my_mix_fn,
    )
    loader = er.get_loader(er.MapDataset(er.EpochizeDataset(mix, 5), map_fn=lambda b: (len(b.captions), b)))
    first, second = list(loader), list(loader)
    assert len(first) == len(second) == 5 and len(loader) == 5
    count, batch = first[0]
    assert count == 8 and batch.images.shape == (8, 3, 8, 8)
    assert any(c is None for _, b in first for c in b.captions) and any(c is not None for _, b in first for c in b.captions)
    loader.close()


def test_bad_blends_fail_clearly(sources):
    """Negative or all-zero weights, mismatching worker configs and a batch_mix_fn returning None are named."""
    a = _train(sources["a"])
    with pytest.raises(ValueError, match="BlendDataset source 1: weight must be a finite number >= 0, got -1"):
        er.BlendDataset((a, 1.0), (_train(sources["b"]), -1))
    with pytest.raises(ValueError, match=r"weights \[0.0, 0.0\] are all zero"):
        er.BlendDataset((a, 0), (_train(sources["b"]), 0))
    with pytest.raises(ValueError, match=re.escape("BlendDataset: weights [1e+308, 1e+308] sum to inf (too large for a float); scale them down")):
        er.BlendDataset((a, 1e308), (_train(sources["b"]), 1e308))  # was a blend of nothing
    other = _train(sources["b"], er.WorkerConfig(rank=0, world_size=1, num_workers=3))
    with pytest.raises(ValueError, match="all datasets need the same WorkerConfig"):
        er.BlendDataset((a, 1), (other, 1))
    mix = er.MixBatchDataset((_train(sources["a"]), 1), (_train(sources["c"]), 1), batch_size=4, batch_mix_fn=lambda items: None)
    loader = er.get_loader(mix)
    with pytest.raises(TypeError, match="batch_mix_fn '<lambda>' returned None"):
        next(iter(loader))
    loader.close()


def test_repeating_blend_epochized_restores_at_an_epoch_boundary(sources):
    """An endless blend_epochized loader saved at the end of its first epoch (3 batches) restores
    into a new loader that gives exactly the original's batches 4..9 (the next epochs)."""
    path = sources["root"] / "tiny_epochized.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: a, subset: {range: [0, 1]}}\n      - {repetitions: 2, path: b, subset: {range: [0, 2]}}\n"
    )
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    loader = er.get_savable_loader(_train(path, wc=wc))
    it = iter(loader)
    first = [next(it).__key__[0] for _ in range(5)]
    state = loader.save_state_rank()
    rest = [next(it).__key__[0] for _ in range(10)]
    loader.close()
    assert sorted(first) == ["a_000000", "b_000000", "b_000000", "b_000001", "b_000001"]
    again = er.get_savable_loader(_train(path, wc=wc))
    again.restore_state_rank(state)
    it = iter(again)
    assert [next(it).__key__[0] for _ in range(10)] == rest
    again.close()


def test_a_limit_over_a_repeating_blend_epochized_still_ends_the_iteration(sources):
    """A LimitDataset over a training blend_epochized (which goes on past its epoch) ends the loader's
    iter() after its items, as Energon's LimitDataset does (it ran on without end)."""
    path = sources["root"] / "tiny_epochized_limited.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: a, subset: {range: [0, 1]}}\n      - {repetitions: 2, path: b, subset: {range: [0, 2]}}\n"
    )
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    loader = er.get_loader(er.LimitDataset(_train(path, wc=wc), length=4, worker_config=wc))
    assert len(list(itertools.islice(loader, 50))) == 4


def test_a_rank_whose_only_samples_have_weight_zero_is_refused(sources, tmp_path):
    """A training blend whose only sources with samples on rank 1 have weight 0 (the weighted one
    holds a single sample, on rank 0): rank 1 would draw nothing and end its pass silently while
    rank 0 goes on; its iter() raises DatasetConfigError naming the rank and the zero weight
    (Energon refuses any weight 0), in a metadataset's blend and in a BlendDataset alike."""
    path = sources["root"] / "zero_weight_on_a_rank.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 1, path: a, subset: {range: [0, 1]}}\n      - {weight: 0, path: b}\n"
    )
    wc = er.WorkerConfig(rank=1, world_size=2, num_workers=1)
    single = _train(prefixed_text_dataset(tmp_path / "one", "o", 1), wc=wc)
    direct = er.BlendDataset((single, 1.0), (_train(sources["b"], wc=wc), 0.0))
    for dataset in (_train(path, wc=wc), direct):
        loader = er.get_loader(dataset)
        with pytest.raises(er.DatasetConfigError, match=r"rank 1 of world size 2 \(1 workers\) holds samples only of sources with weight 0"):
            next(iter(loader))
        loader.close()
    rank0 = er.get_loader(_train(path, wc=er.WorkerConfig(rank=0, world_size=2, num_workers=1)))
    it = iter(rank0)
    assert [next(it).__key__[0] for _ in range(3)] == ["a_000000"] * 3
    rank0.close()


def test_a_repeating_blend_epochized_on_a_rank_without_samples_is_refused(sources):
    """A training blend_epochized (repeat=True) whose sources hold one sample each, both on rank 0:
    rank 1's iter() ended at once with no batch while rank 0 repeats without end (Energon raises
    "Cannot blend all empty datasets"); it raises DatasetConfigError naming the rank."""
    path = sources["root"] / "epochized_one_sample_each.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: a, subset: {range: [0, 1]}}\n      - {repetitions: 2, path: b, subset: {range: [0, 1]}}\n"
    )
    loader = er.get_loader(_train(path, wc=er.WorkerConfig(rank=1, world_size=2, num_workers=1)))
    with pytest.raises(er.DatasetConfigError, match=r"rank 1 of world size 2 \(1 workers\) holds no sample of .*nothing to repeat on this rank"):
        next(iter(loader))
    loader.close()
    rank0 = er.get_loader(_train(path, wc=er.WorkerConfig(rank=0, world_size=2, num_workers=1)))
    it = iter(rank0)
    assert sorted(next(it).__key__[0] for _ in range(6)) == ["a_000000"] * 2 + ["b_000000"] * 4
    rank0.close()
