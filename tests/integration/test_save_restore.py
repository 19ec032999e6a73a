"""``get_savable_loader`` on Ray: a restored loader yields exactly what the saved one would have.

Every check goes through ``tests/roundtrip.assert_round_trip`` (save before item k during one
reference run, restore a fresh loader, compare the rest) with the state carried through JSON.
Items are compared by keys and contents, including the augmentations hooks draw from ``random``,
numpy and torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch.utils.data import default_convert

import energon_ray as er
from energon_ray.format.jsonl import prepare_jsonl
from energon_ray.tasks.text_packing import PackedTextBatch, TextPackingTaskEncoder, lognormal_corpus
from tests.helpers import batch_key, kill_batch_makers, killing_the_feeder, prefixed_text_dataset, text_dataset
from tests.roundtrip import END, assert_round_trip, json_transport

WC = er.WorkerConfig(rank=0, world_size=1, num_workers=2)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("restore")
    a = prefixed_text_dataset(base / "a", "a", 45, per_shard=8)
    b = prefixed_text_dataset(base / "b", "b", 30, per_shard=7)
    docs = base / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"text": d}) for d in lognormal_corpus(160, mean_words=30, seed=5)) + "\n")
    prepare_jsonl(docs, progress=False)
    (base / "val.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  val:\n    blend:\n"
        "      - {path: a, split_part: train}\n      - {path: b, split_part: train}\n"
    )
    return {"a": a, "b": b, "docs": docs, "val": base / "val.yaml"}


class Augmented(er.DefaultTaskEncoder):
    """Draws from python, numpy and torch RNGs in sample and batch hooks; fails on some keys."""

    def __init__(self, fail_every: int = 0):
        super().__init__()
        self.fail_every = fail_every

    @er.stateless(restore_seeds=True)
    def encode_sample(self, sample):
        index = int(sample.__key__.split("_")[-1])
        if self.fail_every and index % self.fail_every == 3:
            raise ValueError(f"cannot encode {sample.__key__}")
        sample.text = f"{sample.text}|{random.random():.6f}|{np.random.rand():.6f}|{torch.rand(1).item():.6f}"
        return sample

    def batch(self, samples):
        return {"keys": [s.__key__ for s in samples], "texts": [s.text for s in samples], "r": random.random()}


class Grouped(Augmented):
    def batch_group_criterion(self, sample):
        return int(sample.__key__.split("_")[-1]) % 3, None


def describe(item):
    if isinstance(item, list):  # a mix of batches, as the mix function returns it
        return tuple(item)
    if isinstance(item, dict):
        return (tuple(item["keys"]), tuple(item["texts"]), item["r"])
    if hasattr(item, "documents"):  # packed text (and the batch hook's index, where it records it)
        return (tuple(tuple(d) for d in item.documents), item.input_ids.sum().item(), getattr(item, "batch_index", None))
    return tuple(item.__key__) if isinstance(item.__key__, (list, tuple)) else item.__key__


class LoaderRun:
    """A savable loader as the round-trip helper drives it; passes are separated by ``END``."""

    def __init__(self, build):
        self.loader = er.get_savable_loader(build())
        self.it = None

    def __next__(self):
        if self.it is None:
            self.it = iter(self.loader)
        try:
            return describe(next(self.it))
        except StopIteration:
            self.it = None
            return END

    def save(self):
        return self.loader.save_state_rank()

    def restore(self, state):
        self.loader.restore_state_rank(state)


def round_trip(build, ks, count):
    runs = []

    def make():
        run = LoaderRun(build)
        runs.append(run)
        return run

    try:
        return assert_round_trip(make, ks, count=count, transport=json_transport)
    finally:
        for run in runs:
            run.loader.close()


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_train_restores_mid_epoch_and_across_epochs(roots, num_workers):
    """Shuffle buffer, slices, augmentations; endless training, states taken early, late and past an epoch."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=num_workers)

    def build():
        return er.get_train_dataset(roots["a"], batch_size=4, shuffle_buffer_size=9, max_samples_per_sequence=4,
                                    worker_config=wc, task_encoder=Augmented(), samples_per_segment=8)  # fmt: skip

    items = round_trip(build, [1, 6, 13, 19], count=24)
    keys = [k for item in items[:9] for k in item[0]]
    assert len(keys) == len(set(keys)) == 36  # within each worker's first epoch nothing repeats


def test_restores_across_short_first_segments_and_longer_later_ones(roots):
    """``samples_per_segment=(first, later)``: states saved inside the short first segments, at their
    end and in the longer ones restore exactly (two workers, skipped samples, shuffle buffer)."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)

    def build():
        return er.get_train_dataset(roots["a"], batch_size=3, shuffle_buffer_size=6, max_samples_per_sequence=4, worker_config=wc,
                                    repeat=False, task_encoder=Augmented(fail_every=7), samples_per_segment=(3, 9))  # fmt: skip

    assert build().segment_layout.to_list() == [9, 3, 1]
    items = round_trip(build, [1, 2, 3, 5, 8, 11], count=15)
    keys = [k for b in items if b != END for k in b[0]]
    assert len(keys) == len(set(keys)) == 45 - len([i for i in range(45) if i % 7 == 3])

def test_repeat_false_passes_get_fresh_hook_seeds_and_restore_across_passes(roots):
    def build():
        return er.get_train_dataset(roots["b"], batch_size=4, shuffle_buffer_size=5, worker_config=WC, repeat=False, task_encoder=Augmented())

    items = round_trip(build, [0, 3, 8, 9, 12], count=18)  # 8 batches, END, 8 batches, END
    assert items[8] == END and items[17] == END
    first, second = items[:8], items[9:17]
    assert sorted(k for b in first for k in b[0]) == sorted(k for b in second for k in b[0])
    texts = lambda batches: {k: t for b in batches for k, t in zip(b[0], b[1])}  # noqa: E731
    one, two = texts(first), texts(second)
    assert all(one[k] != two[k] for k in one)  # each pass draws new augmentations


def test_skipped_samples_and_seam_batches_restore(roots):
    """Samples dropped by the error policy leave pools across segments; they are re-read on restore."""

    def build():
        return er.get_train_dataset(roots["a"], batch_size=3, shuffle_buffer_size=6, worker_config=WC, repeat=False,
                                    task_encoder=Augmented(fail_every=7), samples_per_segment=6)  # fmt: skip

    items = round_trip(build, [1, 4, 7, 10, 13], count=14)
    keys = [k for b in items if b != END for k in b[0]]
    assert len(keys) == len(set(keys)) == 45 - len([i for i in range(45) if i % 7 == 3])


def test_grouped_batches_restore(roots):
    def build():
        return er.get_train_dataset(roots["a"], batch_size=4, shuffle_buffer_size=6, worker_config=WC, repeat=False, task_encoder=Grouped(),
                                    samples_per_segment=5)  # fmt: skip

    items = round_trip(build, [1, 3, 6, 9, 11], count=13)
    for b in items:
        if b != END:
            assert len({int(k.split("_")[-1]) % 3 for k in b[0]}) == 1


def test_packing_restores(roots):
    """Pooled packs are made again by re-running their segment's packing buffer."""

    def build():
        return er.get_train_dataset(roots["docs"], batch_size=3, shuffle_buffer_size=10, max_samples_per_sequence=10,
                                    worker_config=WC, packing_buffer_size=12, task_encoder=TextPackingTaskEncoder(max_length=96))  # fmt: skip

    round_trip(build, [1, 4, 9, 14], count=16)


class SplitOrSkipDocs(TextPackingTaskEncoder):
    """A generator ``encode_sample`` before packing: every third document skipped, every other one
    split in two halves, so a segment's outputs never fill whole packing buffers."""

    def encode_sample(self, sample):
        n = int(sample.__key__)
        doc = super().encode_sample(sample)
        if n % 3 == 0:
            return
        if n % 2 == 0 and len(doc.tokens) > 1:
            half = len(doc.tokens) // 2
            yield doc.derive_from(doc, __key__=f"{n}a", tokens=doc.tokens[:half])
            yield doc.derive_from(doc, __key__=f"{n}b", tokens=doc.tokens[half:])
        else:
            yield doc


@pytest.mark.parametrize("num_workers", [1, 3])
def test_packing_buffers_across_segments_restore(roots, num_workers):
    """Packing buffers that run across segments (skipped and split documents before packing): states
    saved anywhere restore exactly, the pooled packs and the buffer open at the checkpoint made again
    from where the worker stream's chain starts; endless, across epochs."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=num_workers)

    def build():
        return er.get_train_dataset(roots["docs"], batch_size=3, shuffle_buffer_size=10, max_samples_per_sequence=10, worker_config=wc,
                                    packing_buffer_size=7, task_encoder=SplitOrSkipDocs(max_length=96), samples_per_segment=7)  # fmt: skip

    items = round_trip(build, [0, 1, 3, 6, 10, 15, 21], count=24)
    docs = [d for item in items[:6] for pack in item[0] for d in pack]
    assert any(d.endswith("a") for d in docs) and not any(int(d.rstrip("ab")) % 3 == 0 for d in docs)


def _old_packing_state_restores_as_saved(build, field: str, k: int) -> list:
    """``build(old)``: a packed savable loader, the old way (``old=True``) or today's. A state of the
    old way saved after ``k`` batches, without ``field`` (as states saved before it was added),
    restores into a fresh loader of today's build as saved: the rest of the old run exactly, and
    states saved from it say ``field`` is false. Returns today's batches (as member documents)."""

    def docs(batch):
        return tuple(tuple(d) for d in batch.documents)

    new, old = build(False), build(True)
    today, it = [docs(b) for b in new], iter(old)
    reference = [docs(next(it)) for _ in range(k)]
    state = old.save_state_rank().to_dict()
    reference += [docs(b) for b in it]
    assert today != reference
    assert sorted(d for b in today for p in b for d in p) == sorted(d for b in reference for p in b for d in p)
    assert state.pop(field) is False  # (and a state saved before the field was added has none)
    fresh = build(False)
    fresh.restore_state_rank(state)
    it = iter(fresh)
    assert [docs(next(it))] == reference[k : k + 1]
    assert getattr(fresh.save_state_rank(), field) is False
    assert [docs(b) for b in it] == reference[k + 1 :]
    for loader in (new, old, fresh):
        loader.close()
    return today


def test_packed_states_saved_before_buffers_ran_across_segments_restore_as_saved(roots):
    """A packed loader's state without ``packs_chained`` (saved when each segment packed its own
    outputs) restores into that packing: the rest of the saved run exactly; states saved from it say so."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)

    def build(segment_packs):
        ds = er.get_val_dataset(roots["docs"], batch_size=3, worker_config=wc, packing_buffer_size=7,
                                task_encoder=SplitOrSkipDocs(max_length=96), samples_per_segment=7)  # fmt: skip
        ds.pack_in_segments(segment_packs)
        return er.get_savable_loader(ds)

    _old_packing_state_restores_as_saved(build, "packs_chained", 3)


class SkipsTwos(er.DefaultTaskEncoder):
    """Skips samples 2, 7, 12, … (each worker stream's later batches straddle its segments)."""

    def encode_sample(self, sample):
        if int(sample.__key__.split("_")[-1]) % 5 == 2:
            raise er.SkipSample()
        return sample


@pytest.mark.parametrize("train", [True, False])
def test_plain_batches_after_skipped_samples_restore_anywhere(roots, train):
    """Plain batches running across segments (samples skipped): states saved anywhere restore
    exactly, the batch open at the checkpoint made again from where its worker stream's chain starts;
    endless training across epochs, and a validation pass to its end."""

    def build():
        if train:
            return er.get_train_dataset(roots["a"], batch_size=3, shuffle_buffer_size=10, max_samples_per_sequence=10,
                                        worker_config=WC, task_encoder=SkipsTwos(), samples_per_segment=5)  # fmt: skip
        return er.get_val_dataset(roots["a"], split_part="train", batch_size=3, worker_config=WC, task_encoder=SkipsTwos(),
                                  samples_per_segment=5)  # fmt: skip

    items = round_trip(build, [0, 1, 4, 7, 11] if train else [0, 2, 5, 9, 12, 16], count=24 if train else 26)
    keys = [k for item in items for k in item if item != END]
    assert not any(int(k.split("_")[-1]) % 5 == 2 for k in keys)
    if not train:  # two passes of 36 samples (45, 9 skipped) in batches of 3, each pass ending with END
        assert items[12] == items[25] == END and items[:12] == items[13:25] and len(keys) == 72


def test_plain_batch_states_saved_before_batches_ran_across_segments_restore_as_saved(roots):
    """A state without ``batches_chained`` (saved when each segment batched its own samples and a
    seam batch the rest, as a loader still does with ``ray_remote_args`` a waiting task would hold)
    restores into that batching: the rest of the saved run exactly; states saved from it say so.
    Today's batches are Energon's (other batches, the same samples)."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    ds = lambda: er.get_val_dataset(roots["a"], split_part="train", batch_size=3, worker_config=wc,  # noqa: E731
                                    task_encoder=SkipsTwos(), samples_per_segment=5)  # fmt: skip
    keys = lambda batch: tuple(batch.__key__)  # noqa: E731
    new, old = er.get_savable_loader(ds()), er.get_savable_loader(ds(), ray_remote_args={"memory": 2**20})
    today, it = [keys(b) for b in new], iter(old)
    reference = [keys(next(it)) for _ in range(4)]
    state = old.save_state_rank().to_dict()
    reference += [keys(b) for b in it]
    assert today != reference and sorted(k for b in today for k in b) == sorted(k for b in reference for k in b)
    assert old.stats.seam_batches > 0 and new.stats.seam_batches == 0
    assert state.pop("batches_chained") is False  # (and a state saved before the field was added has none)
    fresh = er.get_savable_loader(ds())
    fresh.restore_state_rank(state)
    it = iter(fresh)
    assert [keys(next(it))] == reference[4:5]
    assert fresh.save_state_rank().batches_chained is False
    assert [keys(b) for b in it] == reference[5:]
    assert new.save_state_rank().batches_chained is True
    for loader in (new, old, fresh):
        loader.close()


def test_blend_and_mix_restore_with_small_states(roots):
    def blend():
        return er.BlendDataset(
            (er.get_train_dataset(roots["a"], batch_size=3, shuffle_buffer_size=20, worker_config=WC, task_encoder=Augmented()), 0.6),
            (er.get_train_dataset(roots["b"], batch_size=3, shuffle_buffer_size=20, worker_config=WC, task_encoder=Augmented()), 0.4),
        )

    items = round_trip(blend, [2, 9, 17], count=22)
    assert {b[0][0][0] for b in items} == {"a", "b"}
    loader = er.get_savable_loader(blend())
    it = iter(loader)
    for _ in range(11):
        next(it)
    size = len(loader.save_state_rank().to_json())
    loader.close()
    assert size <= 16 * 1024, size

    def mix():
        return er.MixBatchDataset(
            (er.get_train_dataset(roots["a"], batch_size=1, shuffle_buffer_size=10, worker_config=WC), 1),
            (er.get_train_dataset(roots["b"], batch_size=1, shuffle_buffer_size=10, worker_config=WC), 1),
            batch_size=4,
            batch_mix_fn=lambda batches: sorted(k for b in batches for k in b.__key__),
        )

    round_trip(mix, [1, 5, 8], count=10)


def test_a_blend_restored_after_its_last_batch_ends_without_the_no_batch_warning(roots, tmp_path, caplog):
    """A repeat=False blend (a 3-sample member of tiny weight) saved after its pass's last batch: the
    restored pass gives nothing more, as the saved one would, and does not warn that the pass "gave no
    batch although it read 3 samples" (it re-read a pooled segment; the pass gave its batches before
    the save). A pass that truly gives none still warns (test_bad_input)."""
    import logging

    small = prefixed_text_dataset(tmp_path / "u", "u", 3)
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)

    def blend():
        def part(path):
            return er.get_train_dataset(path, batch_size=3, shuffle_buffer_size=5, worker_config=wc, samples_per_segment=6, repeat=False)

        return er.BlendDataset((part(roots["a"]), 1), (part(small), 0.05), (part(roots["b"]), 1))

    loader = er.get_savable_loader(blend())
    batches = len(list(loader))
    assert batches == 26  # 15 + 1 + 10
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = loader.save_state_rank()  # after the last batch, the pass not yet seen to end
    loader.close()
    assert state.pass_index is not None
    caplog.set_level(logging.WARNING, logger="energon_ray")
    fresh = er.get_savable_loader(blend())
    fresh.restore_state_rank(json_transport(state))
    assert list(fresh) == []
    assert fresh.stats.samples_read > 0  # (what made it warn)
    assert len(list(fresh)) == batches  # the next pass
    fresh.close()
    assert "gave no batch" not in caplog.text, caplog.text


def test_train_metadataset_sample_blend_restores_exactly(roots, tmp_path):
    """A train metadataset with ``blend_samples=True`` blends samples before batching: restores inside a Ray-made group of
    batches and across groups give the same batches (keys, texts drawn in the hooks, batch RNG); restore_sample rebuilds
    mixed batches exactly (each sample at its dataset's position and seed, batched with the blend's seed)."""
    (tmp_path / "train.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - {{weight: 2, path: {roots['a']}}}\n      - {{weight: 1, path: {roots['b']}}}\n"
    )

    class IndexedBatches(Augmented):  # the batch hook's index too: a restore gives each batch its own again
        def batch(self, samples):
            return {**super().batch(samples), "r": (random.random(), self.current_batch_index)}

    def blend():
        return er.get_train_dataset(tmp_path / "train.yaml", batch_size=3, shuffle_buffer_size=4, worker_config=WC,
                                    task_encoder=IndexedBatches(fail_every=11), samples_per_segment=6, blend_samples=True)  # fmt: skip

    items = round_trip(blend, [1, 2, 5, 8, 13], count=16)
    assert any(len({key[0] for key in item[0]}) == 2 for item in items)  # batches mix the datasets
    assert [item[2][1] for item in items] == list(range(16))  # (2 worker streams taking turns)

    class KeyedBatches(Keyed):  # samples augmented in encode_sample, batches drawing the hooks' RNG
        def batch(self, samples):
            out = super().batch(samples)
            out.text = [f"{t}|{random.random():.6f}" for t in out.text]
            return out

    loader = er.get_savable_loader(
        er.get_train_dataset(tmp_path / "train.yaml", batch_size=3, shuffle_buffer_size=4, worker_config=WC,
                             task_encoder=KeyedBatches(), samples_per_segment=6, blend_samples=True)
    )  # fmt: skip
    it = iter(loader)
    batches = [next(it) for _ in range(9)]
    assert loader.can_restore_sample()
    mixed = [b for b in batches if len({k[0] for k in b.__key__}) == 2]
    assert mixed, "no batch mixes the datasets"
    for batch in [batches[0], batches[4], batches[8], mixed[-1]]:
        again = loader.restore_sample(batch.__restore_key__)
        assert list(again.__key__) == list(batch.__key__) and list(again.text) == list(batch.text)
    with pytest.raises(er.StateError, match="one worker stream"):
        loader.restore_sample(batch_key(batches[0])[1][:1] + batch_key(batches[1])[1][:1])
    loader.close()


@er.edataclass
class IndexedPackedBatch(PackedTextBatch):
    batch_index: int = -1


def test_train_metadataset_sample_blend_packing_restores_exactly(roots, tmp_path):
    """blend_samples=True with packing_buffer_size: the blended samples are packed in chunks by Ray
    actors (packs mix the datasets), then batched; restores inside a group of batches, inside a
    chunk's packs and at the pass's end give the same batches (documents and token sums)."""
    (tmp_path / "packed.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - {{weight: 2, path: {roots['a']}}}\n      - {{weight: 1, path: {roots['b']}}}\n"
    )

    class Marked(TextPackingTaskEncoder):  # postencode_sample runs once per pack member, after selection
        def postencode_sample(self, sample):
            sample.__key__ = f"{sample.__key__}+p"
            return sample

        def batch(self, samples):  # records the loader's batch number, as Energon's hook sees it
            return IndexedPackedBatch.extend(super().batch(samples), batch_index=self.current_batch_index)

    def packed():
        return er.get_train_dataset(tmp_path / "packed.yaml", batch_size=3, shuffle_buffer_size=4, worker_config=WC, repeat=False,
                                    packing_buffer_size=2, task_encoder=Marked(max_length=16),
                                    samples_per_segment=6, blend_samples=True)  # fmt: skip

    items = round_trip(packed, [1, 2, 3, 5, 8, 11, 13, 14], count=15)  # 14 batches, then the pass's end
    assert items[-1] == END and items.count(END) == 1
    assert [item[2] for item in items[:-1]] == list(range(14))
    packs = [pack for item in items[:-1] for pack in item[0]]
    assert any(len({doc[0] for doc in pack}) == 2 for pack in packs)  # packs mix the datasets
    docs = Counter(doc for pack in packs for doc in pack)
    assert docs == Counter([f"a_{i:06d}+p" for i in range(45)] + [f"b_{i:06d}+p" for i in range(30)])


def test_blend_member_with_no_samples_on_this_rank_restores(roots, tmp_path):
    """Rank 0 of 32 gets none of a 7-sample member of a train blend (its one worker's slices are a
    single offset, its length 0): that member never appears, and restores are exact."""
    small = prefixed_text_dataset(tmp_path / "c", "c", 7)
    (tmp_path / "train.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - {{weight: 1, path: {roots['a']}}}\n      - {{weight: 1, path: {small}}}\n"
        f"      - {{weight: 1, path: {roots['b']}}}\n"
    )
    wc = er.WorkerConfig(rank=0, world_size=32, num_workers=1, seed_offset=42)

    def blend():
        return er.get_train_dataset(tmp_path / "train.yaml", batch_size=1, shuffle_buffer_size=100, worker_config=wc,
                                    max_samples_per_sequence=None, task_encoder=Augmented())  # fmt: skip

    built = blend()
    members = [ds for ds, _ in built.dataset_weights]
    assert [len(ds) for ds in members] == [2, 0, 1]  # 45, 7 and 30 samples over 32 ranks
    assert [len(ds.workers_slice_offsets[0]) for ds in members] == [2, 1, 2]
    items = round_trip(blend, [1, 2, 3, 5], count=8)
    keys = [item[0][0] for item in items]
    assert {k.split("_")[0] for k in keys} == {"a", "b"}


def test_val_metadataset_across_datasets_and_epochized(roots):
    """A validation metadataset batches from one dataset into the next; restores on both sides of the seam."""

    def val():
        return er.get_val_dataset(roots["val"], batch_size=4, worker_config=WC, samples_per_segment=8)

    items = round_trip(val, [1, 5, 9, 10, 12, 19, 20], count=21)  # 45 + 30 samples over 2 streams: 20 batches
    assert items[-1] == END and items.count(END) == 1

    def epochized():
        return er.EpochizeDataset(er.get_train_dataset(roots["b"], batch_size=4, shuffle_buffer_size=5, worker_config=WC), 5)

    items = round_trip(epochized, [2, 5, 6, 8, 11], count=13)
    assert [i for i, item in enumerate(items) if item == END] == [5, 11]


def test_save_before_iterating_and_mismatched_restores(roots):
    loader = er.get_savable_loader(er.get_train_dataset(roots["a"], batch_size=4, worker_config=WC))
    assert loader.save_state_rank() is None
    loader.restore_state_rank(None)
    it = iter(loader)
    next(it)
    state = loader.save_state_rank()
    loader.close()
    other = er.get_savable_loader(er.get_train_dataset(roots["a"], batch_size=5, worker_config=WC))
    with pytest.raises(er.StateError, match="another dataset configuration"):
        other.restore_state_rank(state)
    other.close()
    three = er.get_savable_loader(er.get_train_dataset(roots["a"], batch_size=4, worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=3)))
    with pytest.raises(er.StateError, match="num_workers=2; this loader has world_size=1, num_workers=3"):
        three.restore_state_rank(state)
    with pytest.raises(er.StateError, match="version 7 is not supported"):
        three.restore_state_rank({**state.to_dict(), "version": 7})
    three.close()


def test_a_state_of_another_batch_size_or_weight_is_refused_naming_it(roots):
    """The StateError names the option or weight that differs with the saved and the current value; a
    state saved before summaries (no ``config_summary``) still restores, and a mismatch names fingerprints."""

    def blend(batch_size=3, weight=1):
        return er.get_savable_loader(er.BlendDataset(
            (er.get_train_dataset(roots["a"], batch_size=batch_size, worker_config=WC), 1),
            (er.get_train_dataset(roots["b"], batch_size=3, worker_config=WC), weight),
        ))  # fmt: skip

    saved = blend()
    it = iter(saved)
    for _ in range(3):
        next(it)
    state = saved.save_state_rank().to_dict()
    rest = [describe(next(it)) for _ in range(4)]
    saved.close()
    assert state["config_summary"]["parts[0].options.batch_size"] == 3
    for other, named in [
        (blend(batch_size=4), r"parts\[0\]\.options\.batch_size was 3, is now 4"),
        (blend(weight=3), r"weights was \[0\.5, 0\.5\], is now \[0\.25, 0\.75\]"),
    ]:
        with pytest.raises(er.StateError, match=f"another dataset configuration: {named}; build the loader with the arguments"):
            other.restore_state_rank(state)
        other.close()

    old = {k: v for k, v in state.items() if k != "config_summary"}
    other = blend(batch_size=4)
    with pytest.raises(er.StateError, match=r"options or weights differ: fingerprint \w+ vs \w+\); build the loader"):
        other.restore_state_rank(old)
    other.close()
    same = blend()
    same.restore_state_rank(old)
    it = iter(same)
    assert [describe(next(it)) for _ in range(4)] == rest
    same.close()


def test_a_state_of_a_dataset_whose_shards_were_recounted_or_excluded_is_refused_naming_it(tmp_path):
    """Another dataset folder of the same samples restores exactly; shards re-written with other counts
    (same names and total) or a sample excluded since are refused, naming the counts and the exclude;
    a state saved before layouts were recorded (no entries, older fingerprint) still restores."""
    import yaml

    from energon_ray.loader.savable import describe
    from energon_ray.loader.state import fingerprint

    def loader(path):
        return er.get_savable_loader(er.get_train_dataset(
            path, batch_size=3, worker_config=WC, shuffle_buffer_size=None, max_samples_per_sequence=None,
        ))  # fmt: skip

    saved = loader(text_dataset(tmp_path / "a", [8, 8, 8, 8]))
    it = iter(saved)
    next(it), next(it)
    state = saved.save_state_rank().to_dict()
    rest = [list(next(it).__key__) for _ in range(4)]
    saved.close()

    moved = loader(shutil.copytree(tmp_path / "a", tmp_path / "moved"))
    moved.restore_state_rank(state)
    it = iter(moved)
    assert [list(next(it).__key__) for _ in range(4)] == rest
    moved.close()

    excluded = shutil.copytree(tmp_path / "a", tmp_path / "excluded")
    split = excluded / ".nv-meta" / "split.yaml"
    split.write_text(yaml.safe_dump({**yaml.safe_load(split.read_text()), "exclude": ["shards/part00_0000.tar/000001"]}))
    for path, named in [
        (text_dataset(tmp_path / "recounted", [7, 9, 8, 8]), r"shard_counts was \[8, 8, 8, 8\], is now \[7, 9, 8, 8\]"),
        (excluded, r"excluded was \[\], is now \[1\]"),
    ]:
        other = loader(path)
        with pytest.raises(er.StateError, match=f"another dataset configuration: {named}; build the loader with"):
            other.restore_state_rank(state)
        other.close()

    def without_layout(value):
        if isinstance(value, dict):
            return {k: without_layout(v) for k, v in value.items() if k not in ("shard_counts", "excluded")}
        return [without_layout(v) for v in value] if isinstance(value, list) else value

    same = loader(tmp_path / "a")
    old = {
        **state,
        "fingerprint": fingerprint(without_layout(describe(same.dataset))),
        "config_summary": {k: v for k, v in state["config_summary"].items() if k not in ("shard_counts", "excluded")},
    }
    same.restore_state_rank(old)
    it = iter(same)
    assert [list(next(it).__key__) for _ in range(4)] == rest
    same.close()


class Upper(Augmented):
    """Another task encoder class: the same samples, texts upper-cased in the batch."""

    def batch(self, samples):
        out = super().batch(samples)
        return {**out, "texts": [t.upper() for t in out["texts"]]}


def test_a_state_restores_under_another_task_encoder_with_a_warning(roots, caplog):
    """As Energon's: a state names the samples consumed, so it restores under another task encoder
    class (a fixed or changed encoder when training resumes); the rest are the saved loader's next
    samples, encoded by the new encoder, and a warning names both classes. A state saved before the
    fingerprint left the encoder out (its fingerprint has the class) still restores."""

    def build(encoder):
        return er.get_savable_loader(er.get_train_dataset(roots["a"], batch_size=4, shuffle_buffer_size=5,
                                                          worker_config=WC, task_encoder=encoder))  # fmt: skip

    saved = build(Augmented())
    it = iter(saved)
    for _ in range(3):
        next(it)
    state = saved.save_state_rank().to_dict()
    assert state["task_encoders"] == ["Augmented"]
    rest = [(b["keys"], b["texts"]) for b in (next(it) for _ in range(6))]
    saved.close()

    other = build(Upper())
    with caplog.at_level("WARNING", logger="energon_ray"):
        other.restore_state_rank(state)
    assert "leaf 0: Augmented -> Upper" in caplog.text
    it = iter(other)
    assert [(b["keys"], b["texts"]) for b in (next(it) for _ in range(6))] == [(k, [t.upper() for t in ts]) for k, ts in rest]
    other.close()

    from energon_ray.loader.savable import describe
    from energon_ray.loader.state import fingerprint

    legacy = build(Augmented())
    old = {**state, "task_encoders": None}
    old.pop("task_encoders")  # states saved before had no such field, and the encoder in the fingerprint
    old["fingerprint"] = fingerprint(describe(legacy.dataset, encoders=True, layout=False))  # saved before layouts too
    assert old["fingerprint"] != state["fingerprint"]
    legacy.restore_state_rank(old)
    it = iter(legacy)
    assert [(b["keys"], b["texts"]) for b in (next(it) for _ in range(6))] == rest
    legacy.close()


def test_a_state_restores_with_the_segment_layout_it_was_saved_with(tmp_path, monkeypatch):
    """A pass restored mid-way starts each worker stream at its checkpoint's segment index: a loader
    that cuts segments otherwise (here: shorter first segments, as another energon_ray version might)
    plans the restored pass with the state's own layout, so the batches are the saved loader's next
    ones (with this version's layout they differed), and states saved from it record that layout."""
    import energon_ray.plan.layout as layout_module

    root = prefixed_text_dataset(tmp_path / "c", "c", 400, per_shard=20)

    def build():
        return er.get_savable_loader(er.get_train_dataset(root, batch_size=4, shuffle_buffer_size=5, worker_config=WC))

    saved = build()
    it = iter(saved)
    for _ in range(45):  # 90 samples of each worker stream: past its first (64-sample) segment
        next(it)
    state = saved.save_state_rank().to_dict()
    rest = [next(it).__key__ for _ in range(8)]
    saved.close()
    assert state["segment_lengths"] == [[128, 64, 1]]

    monkeypatch.setattr(layout_module, "FIRST_SEGMENT_SAMPLES", 32)
    other = build()
    assert [leaf.segment_layout.to_list() for leaf in other.dataset.leaves()] == [[128, 32, 1]]
    other.restore_state_rank(state)
    it = iter(other)
    assert [next(it).__key__ for _ in range(8)] == rest
    assert other.save_state_rank().to_dict()["segment_lengths"] == [[128, 64, 1]]
    other.close()


def test_global_save_and_restore_without_distributed(roots):
    build = lambda: er.get_savable_loader(er.get_train_dataset(roots["b"], batch_size=2, worker_config=WC))  # noqa: E731
    loader = build()
    it = iter(loader)
    for _ in range(3):
        next(it)
    states = loader.save_state_global(global_dst_rank=0)
    expected = [next(it).__key__ for _ in range(4)]
    loader.close()
    fresh = build()
    fresh.restore_state_global(states)
    assert [b.__key__ for b in (next(iter(fresh)) for _ in range(1))] == expected[:1]
    fresh.close()


def test_global_save_of_several_ranks_without_distributed_is_refused(roots):
    """save_state_global on rank 0 of 2 without a torch.distributed process group returned [its own
    state] (a checkpoint restore_state_global later refuses: the states of all 2 ranks); it raises
    StateError at the save, naming the world size and save_state_rank."""
    wc = er.WorkerConfig(rank=0, world_size=2, num_workers=1)
    loader = er.get_savable_loader(er.get_train_dataset(roots["b"], batch_size=2, worker_config=wc))
    next(iter(loader))
    message = r"save_state_global gathers the states of all 2 ranks with torch.distributed, and no process group is initialized; call save_state_rank\(\) on every rank"
    with pytest.raises(er.StateError, match=message):
        loader.save_state_global(global_dst_rank=0)
    loader.close()


def test_global_restore_from_a_source_rank_without_distributed_names_the_missing_process_group(roots):
    """restore_state_global(None, src_rank=0) on rank 1 of 2 without a process group said the list
    was missing "or src_rank to broadcast it from" (it was given); it names the process group now."""
    wc = er.WorkerConfig(rank=1, world_size=2, num_workers=1)
    loader = er.get_savable_loader(er.get_train_dataset(roots["b"], batch_size=2, worker_config=wc))
    message = (
        r"restore_state_global\(src_rank=0\) broadcasts the states with torch.distributed, and no process group is "
        r"initialized \(world size 2\); pass the list of states on every rank, src_rank=None"
    )
    with pytest.raises(er.StateError, match=message):
        loader.restore_state_global(None, src_rank=0)
    loader.close()


def test_restore_state_global_refuses_one_state_naming_what_it_got(roots):
    """One state (the object, its dict or its JSON text) is not the list of one state per rank, nor the list one state."""
    loader = er.get_savable_loader(er.get_train_dataset(roots["b"], batch_size=2, worker_config=WC))
    next(iter(loader))
    state = loader.save_state_rank()
    for one, name in ((state, "LoaderState"), (state.to_dict(), "dict"), (state.to_json(), "str")):
        with pytest.raises(er.StateError, match=rf"wants one state per rank \(a list.*got a {name}; .*restore_state_rank"):
            loader.restore_state_global(one)
    loader.restore_state_global([state.to_json()])
    for many in ([state], [state.to_dict()], json.dumps([state.to_dict()])):
        with pytest.raises(er.StateError, match=r"not one rank's loader state: a list of 1 \(save_state_global's states\?\); pass such a list to restore_state_global"):
            loader.restore_state_rank(many)
    loader.close()


def test_a_rank_saved_before_its_first_batch_starts_afresh_beside_a_restored_one(roots, tmp_path):
    """save_state_global's [state, None] (rank 1 had not iterated): rank 0 goes on, rank 1 starts afresh
    (as Energon's), from the list and from a checkpoint folder holding rank 0's file only (a folder
    save_loader_state creates); a rank file that holds no state is named."""

    def build(rank):
        wc = er.WorkerConfig(rank=rank, world_size=2, num_workers=2)
        return er.get_savable_loader(er.get_train_dataset(roots["b"], batch_size=2, worker_config=wc))

    first = build(0)
    it = iter(first)
    next(it), next(it)
    saved = first.save_state_rank()
    folder = tmp_path / "checkpoints" / "step_2"
    assert er.save_loader_state(first, str(folder)) == str(folder / "energon_ray_loader_rank0.json")
    rest = [list(next(it).__key__) for _ in range(3)]
    first.close()
    second = build(1)
    assert second.save_state_rank() is None and er.save_loader_state(second, str(folder)) is None
    fresh = [list(b.__key__) for _, b in zip(range(3), second)]
    second.close()
    for rank, expected in ((0, rest), (1, fresh)):
        for restore in (lambda loader: loader.restore_state_global([saved.to_json(), None]),
                        lambda loader: er.restore_loader_state(loader, str(folder))):  # fmt: skip
            loader = build(rank)
            restore(loader)
            assert [list(b.__key__) for _, b in zip(range(3), loader)] == expected
            loader.close()
    loader = build(1)
    with pytest.raises(er.StateError, match=r"the state of each of the 2 ranks, in rank order .*for rank 1 it got the states of ranks \[0, 0\]"):
        loader.restore_state_global([saved, saved])
    (folder / "energon_ray_loader_rank1.json").write_text("step 5\n")  # a file that holds no state: named
    with pytest.raises(er.StateError) as caught:
        er.restore_loader_state(loader, str(folder))
    assert str(caught.value).startswith(f"{folder / 'energon_ray_loader_rank1.json'}: not a loader state: the text is not JSON")
    loader.close()


@pytest.mark.parametrize("repeat", [False, True])
def test_an_iterator_opened_before_a_restore_refuses_to_go_on(roots, repeat):
    """After a restore only a new iter() continues from the state: an iterator opened before it (started
    or not) raises instead of yielding the rest of its old pass (repeat=False) or taking the restored
    batches from the new iter() (an endless loader)."""
    loader = er.get_savable_loader(er.get_train_dataset(roots["b"], batch_size=2, worker_config=WC, repeat=repeat))
    it = iter(loader)
    next(it)
    state = loader.save_state_rank()
    expected = [next(it).__key__ for _ in range(3)]
    unstarted = iter(loader)
    loader.restore_state_rank(state)
    message = "this iterator was opened before the loader was restored (restore_state_rank/restore_state_global); call iter(loader) again"
    for old in (it, unstarted):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            next(old)
    again = iter(loader)
    assert [next(again).__key__ for _ in range(3)] == expected
    loader.close()


_ELASTIC = textwrap.dedent(
    """
    import json, sys
    import ray
    import energon_ray as er
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    loader = er.get_savable_loader(er.get_train_dataset(sys.argv[1], batch_size=4, shuffle_buffer_size=9, worker_config=wc))
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = loader.save_state_rank().to_json()
    print(json.dumps({"state": state, "next": [next(it).__key__ for _ in range(6)]}))
    loader.close()
    ray.shutdown()
    """
)


def test_state_restores_in_another_process_on_a_ray_of_another_size(roots, tmp_path):
    """Saved in another process on a 1-CPU Ray, restored here (a process that never iterated that
    loader) on the session's 2-CPU Ray: the same batches."""
    script = tmp_path / "elastic.py"
    script.write_text(_ELASTIC)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    saved = subprocess.run([sys.executable, str(script), str(roots["a"])], capture_output=True, text=True, env=env, timeout=240)
    assert saved.returncode == 0, saved.stderr[-2000:]
    first = json.loads(saved.stdout.strip().splitlines()[-1])
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    loader = er.get_savable_loader(er.get_train_dataset(roots["a"], batch_size=4, shuffle_buffer_size=9, worker_config=wc))
    loader.restore_state_rank(first["state"])
    it = iter(loader)
    assert [next(it).__key__ for _ in range(6)] == first["next"]
    loader.close()


class Pids(er.DefaultTaskEncoder):
    def batch(self, samples):
        return {"keys": [s.__key__ for s in samples], "pid": os.getpid()}


def test_killed_ray_workers_lose_and_repeat_nothing_and_a_later_state_restores(roots):
    """SIGKILL the Ray worker processes that made the batches so far, mid-epoch: Ray re-runs their
    tasks; the keys equal an undisturbed run's, and a state saved afterwards restores exactly."""

    def build():
        return er.get_train_dataset(roots["a"], batch_size=3, shuffle_buffer_size=6, worker_config=WC, repeat=False,
                                    task_encoder=Pids(), samples_per_segment=3)  # fmt: skip

    reference = [tuple(b["keys"]) for b in er.get_loader(build())]
    loader = er.get_savable_loader(build())
    it = iter(loader)
    got, killed = kill_batch_makers(it, 3)
    assert killed
    got += [next(it) for _ in range(4)]
    state = loader.save_state_rank()
    got += list(it)
    assert [tuple(b["keys"]) for b in got] == reference
    assert len({b["pid"] for b in got[3:]} - killed) >= 1  # later batches came from new workers
    fresh = er.get_savable_loader(build())
    fresh.restore_state_rank(json_transport(state))
    assert [tuple(b["keys"]) for b in fresh] == reference[7:]
    fresh.close()


class _SkipSomeA(er.DefaultTaskEncoder):
    """encode_sample fails on dataset a's samples ending in 3 or 7; batches record the hooks' RNG and index."""

    def encode_sample(self, sample):
        if sample.__key__.startswith("a") and sample.__key__.endswith(("3", "7")):
            raise ValueError("bad")
        return sample

    def batch(self, samples):
        return {"keys": [s.__key__ for s in samples], "texts": [s.text for s in samples], "r": (random.random(), self.current_batch_index)}


@pytest.mark.parametrize("kind", ["packed_blend", "sample_blend"])
def test_a_dead_feeder_gives_the_batches_and_counts_of_an_undisturbed_run(roots, tmp_path, caplog, kind):
    """Killing the feeder actor after the first batch (Ray lost the execution) of a train metadataset
    blending samples, packed or not: the same batches (packs, keys, hooks' RNG) and loader.stats. (A
    packed dataset's own segments are chained: ``executor="ray_data"`` runs it as plain tasks.)"""
    (tmp_path / "train.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - {{weight: 2, path: {roots['a']}}}\n      - {{weight: 1, path: {roots['b']}}}\n"
    )

    def build():
        if kind == "packed_blend":
            dataset = er.get_train_dataset(tmp_path / "train.yaml", batch_size=3, shuffle_buffer_size=10, worker_config=WC, repeat=False,
                                           packing_buffer_size=12, task_encoder=TextPackingTaskEncoder(max_length=24),
                                           samples_per_segment=24, blend_samples=True)  # fmt: skip
        else:
            dataset = er.get_train_dataset(tmp_path / "train.yaml", batch_size=3, shuffle_buffer_size=4, worker_config=WC, repeat=False,
                                           task_encoder=_SkipSomeA(), samples_per_segment=6, blend_samples=True)  # fmt: skip
        return er.get_loader(dataset, executor="ray_data")

    counted = ("samples_read", "samples_encoded", "batches", "skipped", "segments_per_node")
    got, expected, counts, want = killing_the_feeder(build, describe, counted, caplog)
    assert got == expected and len(expected) > 5
    assert counts == want


class Keyed(er.DefaultTaskEncoder):
    """Default batches (they carry ``__restore_key__``) of augmented samples."""

    @er.stateless(restore_seeds=True)
    def encode_sample(self, sample):
        sample.text = f"{sample.text}|{random.random():.6f}|{torch.rand(1).item():.6f}"
        return sample


class KeyedFailsWhileFlagged(Keyed):
    """``Keyed``, but ``encode_sample`` raises on one sample while a flag file exists."""

    def __init__(self, flag: str, key: str):
        super().__init__()
        self.flag, self.key = flag, key

    @er.stateless(restore_seeds=True)
    def encode_sample(self, sample):
        if sample.__key__ == self.key and os.path.exists(self.flag):
            raise ValueError(f"now failing on {self.key}")
        return super().encode_sample(sample)


def test_a_hook_failing_while_restore_sample_makes_a_batch_again_goes_to_the_restore_error_handler(roots, tmp_path):
    """As in Energon: the failure goes to ``WorkerConfig.restore_error_handler`` with the exception,
    the sample and its sources; the default handler raises that very exception (not an error that
    only says a sample was not made again). A handler that returns leaves a StateError naming the
    failure."""
    flag = tmp_path / "flag"
    calls = []
    wcs = (WC, er.WorkerConfig(rank=0, world_size=1, num_workers=2, restore_error_handler=lambda *args: calls.append(args)))
    for wc in wcs:
        loader = er.get_savable_loader(er.get_val_dataset(roots["b"], split_part="train", batch_size=4, worker_config=wc,
                                                          task_encoder=KeyedFailsWhileFlagged(str(flag), "b_000005")))  # fmt: skip
        batch = next(b for b in loader if "b_000005" in b.__key__)
        flag.touch()
        try:
            if wc is WC:
                with pytest.raises(ValueError, match="^now failing on b_000005$"):
                    loader.restore_sample(batch.__restore_key__)
            else:
                with pytest.raises(er.StateError, match=r"could not be made again.*sample 'b_000005': ValueError: now failing on b_000005"):
                    loader.restore_sample(batch.__restore_key__)
                (exc, sample, sources), = calls
                assert isinstance(exc, ValueError) and sample.__key__ == "b_000005"
                assert [s.shard_name for s in sources] == [sample.__sources__[0].shard_name]
        finally:
            flag.unlink()
        assert list(loader.restore_sample(batch.__restore_key__).__key__) == list(batch.__key__)
        loader.close()


def test_restore_sample_keeps_the_indices_of_a_validation_metadataset(roots):
    """A validation metadataset batched across its datasets: every batch (short ones and ones that run
    from one dataset into the next too) is made again with the sample and batch indices it had (they
    count on from the dataset before it), whatever position its samples have in their own dataset (a
    batch of both datasets raised 'rebuilds a batch of one dataset's worker stream')."""

    class Indexed(Keyed):
        @er.stateless(restore_seeds=True)
        def encode_sample(self, sample):
            sample = Keyed.encode_sample(self, sample)
            sample.text = f"{sample.text}|e{self.current_batch_index}|s{self.current_sample_index}"
            return sample

        def batch(self, samples):
            out = super().batch(samples)
            out.text = [f"{t}|b{self.current_batch_index}" for t in out.text]
            return out

    loader = er.get_savable_loader(er.get_val_dataset(roots["val"], batch_size=4, worker_config=WC, task_encoder=Indexed(),
                                                      samples_per_segment=8))  # fmt: skip
    batches = list(loader)
    assert [int(b.text[0].rsplit("|b", 1)[1]) for b in batches] == list(range(len(batches)))
    single = [b for b in batches if len({k[0] for k in b.__key__}) == 1]
    assert any(b.__key__[0].startswith("b") for b in single) and any(len(b.__key__) < 4 for b in single)
    assert len(single) < len(batches)  # some batches hold samples of both datasets
    for batch in batches:
        again = loader.restore_sample(batch.__restore_key__)
        assert list(again.__key__) == list(batch.__key__) and list(again.text) == list(batch.text)
    loader.close()


def _packed_train_loader(roots, encoder):
    """A savable train loader over the documents, packed (buffers of 8) and batched by 3."""
    return er.get_savable_loader(
        er.get_train_dataset(roots["docs"], batch_size=3, shuffle_buffer_size=10, worker_config=WC, repeat=False,
                             packing_buffer_size=8, task_encoder=encoder, samples_per_segment=16)
    )  # fmt: skip


def test_restore_sample_rebuilds_packed_batches(roots):
    """Packed batches (members post-encoded, packs drawing the hooks' RNG, packs pooled across segments)
    are made again from their restore keys: the same documents, tokens and keys."""

    class RandomPacks(TextPackingTaskEncoder):
        def postencode_sample(self, sample):
            sample.__key__ = f"{sample.__key__}+p"
            return sample

        def pack_selected_samples(self, samples):
            pack = super().pack_selected_samples(samples)
            pack.input_ids[-1] = int(random.random() * 1000)
            return pack

    loader = _packed_train_loader(roots, RandomPacks(max_length=96))
    batches = list(loader)
    assert loader.can_restore_sample() and len(batches) > 6
    docs = [d for b in batches for pack in b.documents for d in pack]
    assert len(docs) == len(set(docs)) == 160 and all(d.endswith("+p") and not d.endswith("+p+p") for d in docs)
    for batch in [batches[0], batches[3], batches[len(batches) // 2], batches[-1]]:
        again = loader.restore_sample(batch.__restore_key__)
        assert again.documents == batch.documents and torch.equal(again.input_ids, batch.input_ids)
        assert again.__restore_key__ == batch.__restore_key__
    with pytest.raises(er.StateError, match="names samples, not packs"):
        loader.restore_sample(batch_key(batches[0])[1][0][4:])  # (after the pack's ("PackMade", ...))
    loader.close()


def test_pack_restore_key_names_only_members_that_postencode_kept(roots):
    """A member that ``postencode_sample`` skipped is not in its pack's restore key (Energon's key lists
    the post-encoded members); the key listed every selected sample, skipped ones too. The batches
    are still made again exactly."""

    class SkipEveryThird(TextPackingTaskEncoder):
        def postencode_sample(self, sample):
            if int(sample.__key__.rsplit("_", 1)[-1]) % 3 == 0:
                raise er.SkipSample()
            return sample

    loader = _packed_train_loader(roots, SkipEveryThird(max_length=96))
    batches = list(loader)
    docs = [d for b in batches for pack in b.documents for d in pack]
    assert len(docs) == len(set(docs)) and 100 < len(docs) < 160 and all(int(d.rsplit("_", 1)[-1]) % 3 for d in docs)
    positions = {}  # document -> (worker stream, position), from the member keys of packs that have one document
    for batch in batches:
        for pack_key, members in zip(batch_key(batch)[1], batch.documents):
            # (after the counts the pack's hooks read: one postencode_sample call per member kept)
            assert pack_key[0] == "Packed" and pack_key[3][0] == "PackMade" and len(pack_key) - 4 == len(members), (pack_key, members)
            assert len(pack_key[3]) - 3 == len(members)
            if len(members) == 1:
                positions[members[0]] = pack_key[4][3:5]
    assert len(set(positions.values())) == len(positions) > 0
    for batch in [batches[0], batches[len(batches) // 2], batches[-1]]:
        again = loader.restore_sample(batch.__restore_key__)
        assert again.documents == batch.documents and torch.equal(again.input_ids, batch.input_ids)
        assert again.__restore_key__ == batch.__restore_key__
    loader.close()


def _seen_batch(te, samples):
    """A dict batch recording what its hook saw: the batch index and a random draw."""
    return {"keys": [s.__key__ for s in samples], "seen": (te.current_batch_index, random.random()), "__restore_key__": None}


class SeenPlainSkips(er.DefaultTaskEncoder):
    def encode_sample(self, sample):
        if int(sample.__key__.split("_")[-1]) % 5 == 2:
            raise er.SkipSample()
        return sample

    def batch(self, samples):
        return _seen_batch(self, samples)


class SeenGroups(er.DefaultTaskEncoder):
    def batch_group_criterion(self, sample):
        return int(sample.__key__.split("_")[-1]) % 2, None

    def batch(self, samples):
        return _seen_batch(self, samples)


class SeenPacks(TextPackingTaskEncoder):
    @er.stateless(restore_seeds=True)
    def batch(self, samples):
        return _seen_batch(self, samples)


class SeenBlend(er.DefaultTaskEncoder):
    @er.stateless(restore_seeds=True)
    def batch(self, samples):
        return _seen_batch(self, samples)


def _first_sample_key(key):  # (not a pack's ("PackMade", ...))
    return key if key[0] == "Webdataset" else _first_sample_key(next(k for k in key if isinstance(k, (list, tuple)) and k[0] != "PackMade"))


@pytest.mark.parametrize("case", ["plain-skips", "grouped", "packed", "blend"])
def test_restore_sample_gives_a_batch_the_index_it_had(roots, tmp_path, case):
    """A batch's restore key holds its index in its worker stream (``("Batch", index, *keys)``, as
    Energon's ``("BatchDataset", index, *keys)``): restore_sample makes it again with that
    ``current_batch_index`` (and a ``restore_seeds`` batch hook's seed from it), after skipped
    samples, of groups, of packs and of a sample blend, where it is not the first sample's position
    over the batch size. Made again, they had that index (and another draw), or none (a blend)."""
    common = dict(worker_config=WC, repeat=False, shuffle_buffer_size=None, max_samples_per_sequence=None)
    if case == "blend":
        (tmp_path / "train.yaml").write_text(
            "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
            f"      - {{weight: 2, path: {roots['a']}}}\n      - {{weight: 1, path: {roots['b']}}}\n"
        )
        ds = er.get_train_dataset(tmp_path / "train.yaml", batch_size=3, task_encoder=SeenBlend(), samples_per_segment=6,
                                  blend_samples=True, **common)  # fmt: skip
    elif case == "packed":
        ds = er.get_train_dataset(roots["docs"], batch_size=3, packing_buffer_size=8, task_encoder=SeenPacks(max_length=96),
                                  samples_per_segment=16, **common)  # fmt: skip
    else:
        te = SeenPlainSkips() if case == "plain-skips" else SeenGroups()
        ds = er.get_train_dataset(roots["a"], batch_size=3, task_encoder=te, samples_per_segment=4, **common)
    loader = er.get_savable_loader(ds)
    batches = list(loader)[:24]
    assert len(batches) >= 8 and loader.can_restore_sample()
    for batch in batches:  # the hooks count batches over the rank's interleaved worker streams, as Energon's
        key = batch["__restore_key__"]
        assert key[0] == "Batch" and key[1] * 2 + _first_sample_key(key)[3] == batch["seen"][0], (key[:2], batch["seen"])
    if case != "blend":  # each worker stream's later batches: not their first sample's (or pack's) position over 3
        first_positions = [k[1] if k[0] == "Packed" else k[4] for k in (b["__restore_key__"][2] for b in batches)]
        assert any(position // 3 != b["__restore_key__"][1] for position, b in zip(first_positions, batches))
    for batch in batches:
        again = loader.restore_sample(batch["__restore_key__"])  # (the loader gave tuples as lists)
        assert json.loads(json.dumps([again["keys"], again["seen"], again["__restore_key__"]])) == [batch["keys"], batch["seen"], batch["__restore_key__"]]
    loader.close()


def test_restore_sample_takes_keys_from_before_batch_keys_held_their_index(roots):
    """A batch key saved before batch keys held their index (the samples' keys alone, or
    ``("Batched", i, j, *keys)``) is still made again, at its first sample's position over the size."""
    loader = er.get_savable_loader(er.get_train_dataset(roots["b"], batch_size=4, worker_config=WC, repeat=False,
                                                        task_encoder=Keyed(), samples_per_segment=4))  # fmt: skip
    batches = list(loader)
    for batch in batches[:3]:
        index, keys = batch_key(batch)
        again = loader.restore_sample(list(keys))
        assert list(again.__key__) == list(batch.__key__) and list(again.text) == list(batch.text)
        assert again.__restore_key__ == batch.__restore_key__ and index == keys[0][4] // 4
    with pytest.raises(er.StateError, match=re.escape("is not a batch's ('Batch', batch index, *the samples' keys)")):
        loader.restore_sample(("Batch", -1) + batch_key(batches[0])[1])
    loader.close()


class GroupedIndexed(er.DefaultTaskEncoder):
    def batch_group_criterion(self, sample):
        return int(sample.__key__.split("_")[-1]) % 2, None

    def batch(self, samples):
        return {"keys": [s.__key__ for s in samples], "index": self.current_batch_index}


@pytest.mark.parametrize("workers", [1, 2])
def test_grouped_validation_metadataset_restores_its_batch_count(roots, tmp_path, workers):
    """A grouped validation metadataset counts its groups on through its datasets: restored mid-pass,
    the batch hooks' current_batch_index goes on from where it was (the later dataset's checkpoint,
    saved after groups made ahead, set a higher count: 5 instead of 1 after one batch)."""
    (tmp_path / "val.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - path: {roots['b']}\n      - path: {roots['a']}\n"
    )
    config = er.WorkerConfig(rank=0, world_size=1, num_workers=workers)

    def loader():
        return er.get_savable_loader(er.get_val_dataset(tmp_path / "val.yaml", split_part="train", batch_size=4,
                                                        worker_config=config, task_encoder=GroupedIndexed()))  # fmt: skip

    def view(batches):
        return [(list(b["keys"]), int(b["index"])) for b in batches]

    whole = view(loader())
    assert len(whole) >= 18 and sorted(i for _, i in whole) == list(range(len(whole)))
    for k in (1, 6, 9):
        saved = loader()
        it = iter(saved)
        for _ in range(k):
            next(it)
        state = saved.save_state_rank()
        saved.close()
        again = loader()
        again.restore_state_rank(state)
        assert view(again) == whole[k:], k
        again.close()


class SkipsIndexed(SeenPlainSkips):  # (its skips; batches of keys and the index)
    def batch(self, samples):
        return {"keys": [s.__key__ for s in samples], "index": self.current_batch_index}


@pytest.mark.parametrize("workers", [1, 2])
def test_validation_metadataset_batch_count_after_skips_restores_and_older_states_keep_theirs(roots, tmp_path, workers):
    """A batched validation metadataset that skips samples counts its batches as Energon's (see
    test_hook_seed_parity): restored mid-pass, the count goes on exactly. A state saved before (no
    ``pool_batches_counted``; its batches counted by position) restores as it was saved."""
    (tmp_path / "val.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - path: {roots['b']}\n      - path: {roots['a']}\n"
    )
    config = er.WorkerConfig(rank=0, world_size=1, num_workers=workers)

    def loader(counted=True):
        ds = er.get_val_dataset(tmp_path / "val.yaml", split_part="train", batch_size=4, worker_config=config, task_encoder=SkipsIndexed())
        for leaf in ds.leaves():
            leaf.pool_batches_counted = counted  # False: as a loader before the count
        return er.get_savable_loader(ds)

    def view(batches):
        return [(list(b["keys"]), int(b["index"])) for b in batches]

    whole, by_position = view(loader()), view(loader(counted=False))
    assert [k for k, _ in whole] == [k for k, _ in by_position] and sorted(i for _, i in whole) == list(range(len(whole)))
    assert [i for _, i in whole] != [i for _, i in by_position]
    for k in (1, 7):
        for counted, expected in ((True, whole), (False, by_position)):
            saved = loader(counted)
            it = iter(saved)
            for _ in range(k):
                next(it)
            state = saved.save_state_rank().to_dict()
            saved.close()
            assert state["pool_batches_counted"] is counted
            if not counted:
                del state["pool_batches_counted"]  # (a state saved before the field existed has none)
            again = loader()
            again.restore_state_rank(state)
            assert view(again) == expected[k:], (k, counted)
            again.close()


def test_restore_sample_rebuilds_batches_exactly(roots):
    """Batches of both passes (their own hook seeds), of a short last batch and of a grouped loader."""
    loader = er.get_savable_loader(er.get_train_dataset(roots["b"], batch_size=4, shuffle_buffer_size=5, worker_config=WC,
                                                        repeat=False, task_encoder=Keyed(), samples_per_segment=4))  # fmt: skip
    first, second = list(loader), list(loader)
    assert loader.can_restore_sample()
    for batch in (first[0], first[5], first[-1], second[2], second[-1]):
        again = loader.restore_sample(batch.__restore_key__)
        assert list(again.__key__) == list(batch.__key__) and list(again.text) == list(batch.text)
    with pytest.raises(er.StateError, match="no plan position"):
        loader.restore_sample(("Webdataset", 3))
    # a key of a larger dataset's loader (its index past this one's samples), of another blend's
    # dataset, or not a plan position: a StateError naming it, never an error from inside a Ray task
    own = batch_key(first[0])[1][0]
    for key, message in (
        ((own[0], 10**6, *own[2:]), r"names sample 1000000 of .*, which has \d+ samples: a key of another dataset"),
        ((own[0], own[1], 2, *own[3:]), r"names dataset 2; this loader has 1"),
        ((own[0], own[1], own[2], own[3], -1, *own[5:]), r"names worker stream .*, position -1: not a plan position"),
    ):
        with pytest.raises(er.StateError, match=message):
            loader.restore_sample([key])
    loader.close()

    class KeyedGroups(Keyed):
        def batch_group_criterion(self, sample):
            return int(sample.__key__.split("_")[-1]) % 2, None

    grouped = er.get_savable_loader(er.get_val_dataset(roots["a"], split_part="train", batch_size=3, worker_config=WC, task_encoder=KeyedGroups()))
    batches = list(grouped)
    for batch in batches[::4]:
        again = grouped.restore_sample(batch.__restore_key__)
        assert list(again.__key__) == list(batch.__key__) and list(again.text) == list(batch.text)
    grouped.close()
    packed = er.get_savable_loader(er.get_val_dataset(roots["docs"], split_part="train", batch_size=2, worker_config=WC, packing_buffer_size=8,
                                                      task_encoder=TextPackingTaskEncoder(max_length=96)))  # fmt: skip
    assert packed.can_restore_sample()  # packed validation batches too (see test_restore_sample_rebuilds_packed_batches)
    val_batches = list(packed)
    for batch in (val_batches[0], val_batches[-1]):
        again = packed.restore_sample(batch.__restore_key__)
        assert again.documents == batch.documents and torch.equal(again.input_ids, batch.input_ids)
    packed.close()


@dataclasses.dataclass
class HandKeyedBatch(er.Batch):
    text: list
    draws: tuple = ()


class HandKeyed(Keyed):
    """Skips samples 3, 4, 11; its batches carry a restore key the hooks set by hand: ``()`` in a
    ``Batch``, ``None`` in a dict (Energon's batching puts the samples' keys there)."""

    def __init__(self, as_dict: bool):
        super().__init__()
        self.as_dict = as_dict

    @er.stateless(restore_seeds=True)
    def encode_sample(self, sample):
        if int(sample.__key__.split("_")[-1]) in (3, 4, 11):
            raise er.SkipSample()
        return super().encode_sample(sample)

    @er.stateless(restore_seeds=True)
    def batch(self, samples):
        draws = (self.current_batch_index, random.random(), torch.rand(1).item())
        keys, text = [s.__key__ for s in samples], [s.text for s in samples]
        if self.as_dict:
            return {"__key__": keys, "__restore_key__": None, "text": text, "draws": draws}
        return HandKeyedBatch(__key__=keys, __restore_key__=(), text=text, draws=draws)


def test_restore_sample_rebuilds_batches_whose_batch_hook_set_no_restore_key(roots):
    """A ``batch`` hook that builds its batch with ``__restore_key__=()`` (or a dict's ``None``) gets the
    samples' keys there, as Energon's batching gives them, and ``restore_sample`` rebuilds each batch
    exactly (keys, texts, the hook's index and draws; after skipped samples, training and validation):
    its key was left empty, and restore_sample raised 'names no sample'."""
    for as_dict, train in ((False, False), (True, True)):
        common = dict(batch_size=4, worker_config=WC, task_encoder=HandKeyed(as_dict), samples_per_segment=5)
        if train:
            ds = er.get_train_dataset(roots["b"], shuffle_buffer_size=5, repeat=False, **common)
        else:
            ds = er.get_val_dataset(roots["b"], split_part="train", **common)
        loader = er.get_savable_loader(ds)
        batches = list(loader)
        view = (lambda b: (b["__key__"], b["text"], b["draws"], b["__restore_key__"])) if as_dict else (
            lambda b: (b.__key__, b.text, b.draws, b.__restore_key__))  # fmt: skip
        assert len(batches) == 7 and all(view(b)[3] for b in batches)
        for batch in batches:  # restore_sample gives the batch as made; iteration hands it out as torch's DataLoader
            assert view(default_convert(loader.restore_sample(view(batch)[3]))) == view(batch)
        loader.close()


@dataclasses.dataclass
class HalfBatch(er.Batch):
    text: list
    draws: tuple = ()


class Halves(Keyed):
    """Skips samples 3, 4, 11 (seam batches); its ``batch`` is a generator: each group's halves, as
    two batches drawing from python and torch RNGs."""

    def encode_sample(self, sample):
        if int(sample.__key__.split("_")[-1]) in (3, 4, 11):
            raise er.SkipSample()
        return super().encode_sample(sample)

    def batch(self, samples):
        cut = (len(samples) + 1) // 2
        for part in (samples[:cut], samples[cut:]):
            if part:
                draws = (self.current_batch_index, random.random(), torch.rand(1).item())
                yield HalfBatch(__key__=[s.__key__ for s in part], __restore_key__=(), text=[s.text for s in part], draws=draws)


class HalvesTwice(Halves):
    """``Halves``, and ``encode_batch`` a generator too: two outputs per batch, each drawing again."""

    def encode_batch(self, batch):
        for n in range(2):
            yield dataclasses.replace(batch, text=[f"{t}#{n}" for t in batch.text], draws=batch.draws + (random.random(),))


class SeededHalves(Halves):
    """``Halves`` with Energon's batch seeds (``restore_seeds``: its worker streams are chained)."""

    @er.stateless(restore_seeds=True)
    def batch(self, samples):
        yield from super().batch(samples)


@pytest.mark.parametrize(
    "te, outputs, seam",
    [(Halves(), 2, False), (Halves(), 2, True), (HalvesTwice(), 4, True), (SeededHalves(), 2, False)],
    ids=["batch", "batch-seams", "both-seams", "counted"],
)
def test_restore_sample_rebuilds_each_output_of_a_generator_batch_hook(roots, te, outputs, seam):
    """A generator ``batch`` (and ``encode_batch``) makes several batches of one group of samples: each
    gets its own key ``("Batched", batch output, encode_batch output, *the samples' keys)`` and
    restore_sample rebuilds that very output (keys, texts, index, draws), seam batches (where a
    waiting task would hold memory, segments batch their own samples) and chained streams too: all
    of a group's outputs had the samples' key and restore_sample raised 'the batch hooks made 2
    batches from the 4 samples, not one'."""
    ds = er.get_train_dataset(roots["b"], batch_size=4, shuffle_buffer_size=5, worker_config=WC, repeat=False,
                              task_encoder=te, samples_per_segment=5)  # fmt: skip
    loader = er.get_savable_loader(ds, ray_remote_args={"memory": 2**20} if seam else None)
    batches = list(loader)
    view = lambda b: (b.__key__, b.text, b.draws, b.__restore_key__)  # noqa: E731
    assert sum(len(b.__key__) for b in batches) == 27 * outputs // 2 and loader.can_restore_sample()
    assert len({b.__restore_key__ for b in batches}) == len(batches)
    assert {batch_key(b)[1][:3] for b in batches} == {("Batched", i, j) for i in (0, 1) for j in range(outputs // 2)}
    assert (loader.stats.seam_batches > 0) == seam
    last = [b for b in batches if batch_key(b)[1][1:3] == (1, outputs // 2 - 1)]  # each group's last output
    for batch in (batches[0], last[0], last[len(last) // 2], last[-1]):
        assert view(loader.restore_sample(batch.__restore_key__)) == view(batch)
    index, key = batch_key(last[0])
    with pytest.raises(er.StateError, match=re.escape("none of them their output (7, 0)")):
        loader.restore_sample(("Batch", index, "Batched", 7, 0) + key[3:])
    with pytest.raises(er.StateError, match="is not a generator batch's"):
        loader.restore_sample(("Batch", index, "Batched", 1) + key[3:])
    loader.close()


def test_restore_sample_rebuilds_each_output_of_a_generator_batch_hook_over_packs(roots):
    """A generator ``batch`` over packs (its first pack, then the rest, drawing from random): each
    output's key names it before the packs' keys and restore_sample rebuilds that output."""

    class SplitPacks(TextPackingTaskEncoder):
        def batch(self, samples):
            yield super().batch(samples[:1])
            rest = super().batch(samples[1:])
            rest.input_ids[0, 0] = int(random.random() * 1000)
            yield rest

    loader = _packed_train_loader(roots, SplitPacks(max_length=96))
    batches = list(loader)
    seconds = [b for b in batches if batch_key(b)[1][:3] == ("Batched", 1, 0)]
    assert len(seconds) * 2 == len(batches) and all(k[0] == "Packed" for k in batch_key(seconds[0])[1][3:])
    for batch in (seconds[0], seconds[-1]):
        again = loader.restore_sample(batch.__restore_key__)
        assert again.documents == batch.documents and torch.equal(again.input_ids, batch.input_ids)
        assert again.__restore_key__ == batch.__restore_key__
    loader.close()


def test_restore_sample_applies_stateless_maps_and_refuses_wrappers_it_cannot_apply(roots):
    """A MapDataset declared stateless: the batch made again went through map_fn (it was returned
    unmapped); a map not so declared, a MixBatchDataset, GroupBatchDataset or IterMapDataset:
    can_restore_sample() is False and restore_sample raises naming the wrapper (MixBatch said True)."""
    import dataclasses

    def marked(batch):
        return dataclasses.replace(batch, text=[t + "!" for t in batch.text])

    def train(path, batch_size):
        return er.get_train_dataset(path, batch_size=batch_size, shuffle_buffer_size=None, max_samples_per_sequence=None, worker_config=WC)

    mapped = er.get_savable_loader(er.MapDataset(er.MapDataset(train(roots["a"], 3), marked, stateless_map_fn=True), marked, stateless_map_fn=True))
    assert mapped.can_restore_sample()
    it = iter(mapped)
    for batch in [next(it) for _ in range(3)]:
        again = mapped.restore_sample(batch.__restore_key__)
        assert list(again.__key__) == list(batch.__key__) and list(again.text) == list(batch.text)
        assert all(t.endswith("!!") for t in again.text)
    mapped.close()
    mix = er.MixBatchDataset((train(roots["a"], 1), 1), (train(roots["b"], 1), 1), batch_size=4, batch_mix_fn=er.homogeneous_concat_mix)
    refused = (
        (er.MapDataset(train(roots["a"], 3), marked), "MapDataset: map_fn 'marked' is not declared stateless"),
        (mix, "MixBatchDataset: its batches are mixed by batch_mix_fn"),
        (er.GroupBatchDataset(train(roots["a"], None), 2, lambda s: (0, None), er.generic_batch), "GroupBatchDataset: its batches are grouped"),
        (er.IterMapDataset(train(roots["a"], 3), lambda items: iter(items)), "IterMapDataset: its items are made by iter_map_fn"),
    )
    for dataset, message in refused:
        loader = er.get_savable_loader(dataset)
        batch = next(iter(loader))
        assert not loader.can_restore_sample()
        with pytest.raises(er.StateError, match=re.escape(message)):
            loader.restore_sample(batch.__restore_key__)
        loader.close()


def test_packed_states_saved_before_packs_were_pooled_restore_as_saved(roots):
    """A packed loader's state without ``packs_pooled`` (saved when each segment batched its own packs
    and pooled only the rest) restores into that batching, so it gives exactly the rest of the saved
    run, and states saved from it say so; today's loaders batch a stream's packs from the pool."""

    def dataset(segment_batches=False):
        ds = er.get_val_dataset(roots["docs"], batch_size=3, worker_config=WC, packing_buffer_size=8,
                                task_encoder=TextPackingTaskEncoder(max_length=96), samples_per_segment=16)  # fmt: skip
        ds.batch_packs_in_segments(segment_batches)
        return ds

    def build(segment_batches):
        return er.get_savable_loader(dataset(segment_batches))

    pooled = _old_packing_state_restores_as_saved(build, "packs_pooled", 4)
    round_trip(dataset, [2, 5, 9], count=len(pooled) + 1)  # pooled packs restore exactly too


def test_sample_keys_of_a_mix_skip_each_batchs_counts():
    """The samples of a key holding several batches' keys (a mix of batches), whose batch hooks
    counted on (``("Made", outputs of batch, batches given)`` before their samples' keys): the
    samples, not a StateError on ``"Made"``."""
    from energon_ray.loader.restore_keys import sample_keys

    first, second = ("Webdataset", 4, 0, 1, 2, 77), ("Webdataset", 9, 0, 0, 5, 78, 0, 6)
    key = ("Batch", 0, "Made", 1, 2, first, "Batch", 3, "Batched", 1, 0, "Made", 5, 4, second)
    assert sample_keys(key) == [first, second]
