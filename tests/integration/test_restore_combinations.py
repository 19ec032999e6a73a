"""Save/restore exactness across feature combinations (README "Save and restore").

Hook features (plain, packing, grouping, a generator ``encode_sample``, ``SkipSample``, ``postencode_sample``)
are crossed with compositions (one dataset, a ``BlendDataset`` of two, a metadataset ``blend``, a
``MixBatchDataset``, a metadataset ``blend_epochized``) and 1 or 3 logical workers, pairwise. Each case
runs one ``repeat=False`` pass, saves before every batch, and restores after 0, 1, the middle and all
but the last batch (``tests/roundtrip``): the rest must equal the saved run's (keys, texts with the hooks'
python/numpy/torch draws, the batch hook's draws). ``restore_sample`` must rebuild every batch of the
pass exactly, where the docs say it can.
"""

from __future__ import annotations

import random
import re
from typing import Any, List

import numpy as np
import pytest
import torch

import energon_ray as er
from tests.helpers import prefixed_text_dataset
from tests.roundtrip import assert_round_trip, json_transport


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("combos")
    a = prefixed_text_dataset(base / "a", "a", 13, per_shard=5)
    b = prefixed_text_dataset(base / "b", "b", 9, per_shard=4)
    for name, mode, key in (("blend", "blend", "weight"), ("epochized", "blend_epochized", "repetitions")):
        (base / f"{name}.yaml").write_text(
            f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    {mode}:\n"
            f"      - {{{key}: 2, path: {a}}}\n      - {{{key}: 1, path: {b}}}\n"
        )
    return {"a": a, "b": b, "blend": base / "blend.yaml", "epochized": base / "epochized.yaml"}


def _index(sample) -> int:
    return int(sample.__key__.split("_")[-1].split("#")[0].split("+")[0])


def _draws() -> str:
    return f"{random.random():.6f}|{np.random.rand():.6f}|{torch.rand(1).item():.6f}"


class Plain(er.DefaultTaskEncoder):
    """Samples augmented from python, numpy and torch; each batch draws again."""

    @er.stateless(restore_seeds=True)
    def encode_sample(self, sample):
        sample.text = f"{sample.text}|{_draws()}"
        return sample

    def batch(self, samples):
        out = super().batch(samples)
        out.text = [f"{t}|b{random.random():.6f}" for t in out.text]
        return out


class Skipping(Plain):
    """Skips every sample whose index is 2 mod 5."""

    @er.stateless(restore_seeds=True)
    def encode_sample(self, sample):
        if _index(sample) % 5 == 2:
            raise er.SkipSample()
        return super().encode_sample(sample)


class Grouped(Plain):
    def batch_group_criterion(self, sample):
        return _index(sample) % 2, None


class Generating(Plain):
    """A generator ``encode_sample``: two outputs of even samples, one of odd ones, each drawing."""

    def encode_sample(self, sample):
        for n in range(2 - _index(sample) % 2):
            yield er.TextSample.derive_from(sample, __key__=f"{sample.__key__}#{n}", text=f"{sample.text}|{_draws()}")


class PostEncoded(Plain):
    """``postencode_sample`` (no packing) marks the key and draws."""

    def postencode_sample(self, sample):
        sample.__key__ = f"{sample.__key__}+p"
        sample.text = f"{sample.text}|p{random.random():.6f}"
        return sample


class Packing(PostEncoded):
    """Packs of 2 or 3 samples in buffer order; ``pack_selected_samples`` draws."""

    def select_samples_to_pack(self, samples):
        groups, i = [], 0
        while i < len(samples):
            size = 2 + _index(samples[i]) % 2
            groups.append(samples[i : i + size])
            i += size
        return groups

    def pack_selected_samples(self, samples):
        return er.TextSample.derive_from(
            samples[0], __key__="&".join(s.__key__ for s in samples), text=f"{'&'.join(s.text for s in samples)}|k{_draws()}"
        )


class IndexedPacking(Packing):
    """``postencode_sample`` and ``pack_selected_samples`` also record the indices they read."""

    def postencode_sample(self, sample):
        sample = super().postencode_sample(sample)
        sample.text = f"{sample.text}|q{self.current_sample_index}"
        return sample

    def pack_selected_samples(self, samples):
        pack = super().pack_selected_samples(samples)
        pack.text = f"{pack.text}|i{self.current_sample_index},{self.current_batch_index}"
        return pack


class GeneratingGrouped(Generating, Grouped):
    pass


class GeneratingPacked(Generating, Packing):
    pass


FEATURES = {"plain": Plain, "packing": Packing, "grouped": Grouped, "generator": Generating, "skip": Skipping, "postencode": PostEncoded}
#: a generator encode_sample where segments are not chained (grouping, packing), on one dataset
PAIRED = {"generator-grouped": GeneratingGrouped, "generator-packing": GeneratingPacked, "indexed-packing": IndexedPacking}


def view(item) -> Any:
    if isinstance(item, list):  # a mix of batches
        return tuple(view(b) for b in item)
    if isinstance(item.__key__, str):  # a sample or pack, unbatched
        return ((item.__key__,), (item.text,))
    return (tuple(item.__key__), tuple(item.text))


def _options(feature: str, num_workers: int, batch_size: int) -> dict:
    packing = {"packing_buffer_size": 5} if feature.endswith("packing") else {}
    batch_size = min(batch_size, 2) if packing else batch_size  # packs hold 2 or 3 samples: batches of 2 packs
    return dict(batch_size=batch_size, worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=num_workers),
                task_encoder={**FEATURES, **PAIRED}[feature](), samples_per_segment=4, **packing)  # fmt: skip


def _train(path, feature: str, num_workers: int, batch_size: int = 3, repeat: bool = False):
    options = _options(feature, num_workers, batch_size)
    return er.get_train_dataset(path, shuffle_buffer_size=4, max_samples_per_sequence=3, repeat=repeat, **options)


def build(roots, composition: str, feature: str, num_workers: int):
    if composition == "single":
        return _train(roots["a"], feature, num_workers)
    if composition == "unbatched":  # its samples handed out one by one (a generator's stream chained)
        return _train(roots["a"], feature, num_workers, None)
    if composition == "endless":  # across epochs
        return _train(roots["b"], feature, num_workers, repeat=True)
    if composition == "val":  # a validation metadataset: its datasets concatenated per worker stream
        return er.get_val_dataset(roots["blend"], split_part="train", **_options(feature, num_workers, 3))
    if composition == "val-unbatched":  # the same, its samples (or packs) handed out one by one
        return er.get_val_dataset(roots["blend"], split_part="train", **{**_options(feature, num_workers, 3), "batch_size": None})
    if composition.startswith("meta-unbatched"):  # a train metadataset's packs handed out one by one (-epochs: 5 per iter())
        epochs = {"virtual_epoch_length": 5} if composition.endswith("-epochs") else {}
        options = {**_options(feature, num_workers, 3), "batch_size": None, **epochs}
        return er.get_train_dataset(roots["blend"], shuffle_buffer_size=4, max_samples_per_sequence=3, repeat=False, **options)
    if composition == "blend":
        return er.BlendDataset((_train(roots["a"], feature, num_workers), 2), (_train(roots["b"], feature, num_workers), 1))
    if composition == "mix":
        return er.MixBatchDataset(
            (_train(roots["a"], feature, num_workers, 1), 2), (_train(roots["b"], feature, num_workers, 1), 1), batch_size=3, batch_mix_fn=list
        )
    return _train(roots["blend" if composition == "meta" else "epochized"], feature, num_workers)


class OnePass:
    """One ``repeat=False`` pass of a savable loader, its batches kept and shown as ``view``s."""

    def __init__(self, dataset):
        self.loader = er.get_savable_loader(dataset)
        self.it = None
        self.batches: List[Any] = []

    def __next__(self):
        if self.it is None:
            self.it = iter(self.loader)
        batch = next(self.it)
        self.batches.append(batch)
        return view(batch)

    def save(self):
        return self.loader.save_state_rank()

    def restore(self, state):
        self.loader.restore_state_rank(state)


#: combinations whose batches restore_sample cannot make again, as the docs state (compatibility.md,
#: get_savable_loader and MixBatchDataset): (the StateError's message, why)
REFUSED = {
    "mix": ("MixBatchDataset: its batches are mixed by batch_mix_fn", "a mixed batch is not made again (as in Energon)"),
}


def _case(composition, feature, workers):
    return pytest.param(composition, feature, workers, id=f"{composition}-{feature}-w{workers}")


# pairwise: each feature with each composition; worker counts alternate so each pair of axes meets both
CASES = [
    _case(composition, feature, (1, 3)[(i + j) % 2])
    for i, composition in enumerate(["single", "blend", "meta", "mix", "epochized"])
    for j, feature in enumerate(FEATURES)
] + [_case("single", "generator-grouped", 3), _case("single", "generator-packing", 1)] + [
    _case(composition, feature, workers)
    for composition, feature, workers in [
        ("endless", "skip", 1), ("endless", "packing", 3), ("val", "plain", 1), ("val", "generator", 3), ("val", "packing", 1),
        ("unbatched", "generator", 3), ("unbatched", "generator", 1),
        ("val-unbatched", "packing", 3), ("meta-unbatched", "packing", 3), ("meta-unbatched", "packing", 1),
    ]
]


@pytest.mark.parametrize("composition, feature, workers", CASES)
def test_restore_is_exact_after_0_1_mid_and_all_but_the_last_batch(roots, composition, feature, workers):
    """The batches after a restore at k in {0, 1, mid, last-1} are the saved run's; restore_sample rebuilds each batch."""
    runs: List[OnePass] = []

    def make():
        runs.append(OnePass(build(roots, composition, feature, workers)))
        return runs[-1]

    try:
        items = assert_round_trip(make, [0, 1, "mid", -1], transport=json_transport, count=12 if composition == "endless" else None)
        assert len(items) >= 3
        if composition == "val":  # some batch runs from one dataset into the next
            assert any(len({key[0] for key in item[0]}) == 2 for item in items)
        if composition in ("val-unbatched", "meta-unbatched"):  # some pack does
            assert any("a_" in item[0][0] and "b_" in item[0][0] for item in items)
        reference = runs[0]
        refused = REFUSED.get(composition) or REFUSED.get(f"{composition}-{feature}")
        if refused is not None:
            assert not reference.loader.can_restore_sample()
            first = reference.batches[0]
            with pytest.raises(er.StateError, match=re.escape(refused[0])):
                reference.loader.restore_sample((first[0] if isinstance(first, list) else first).__restore_key__)
            return
        assert reference.loader.can_restore_sample()
        for i, batch in enumerate(reference.batches):
            again = reference.loader.restore_sample(batch.__restore_key__)
            assert view(again) == view(batch), f"restore_sample of batch {i}"
    finally:
        for run in runs:
            run.loader.close()


@pytest.mark.parametrize("composition", ["val", "val-unbatched", "meta-unbatched", "meta-unbatched-epochs"])
def test_a_packed_metadatasets_state_saved_when_each_dataset_packed_alone_restores(roots, composition):
    """A packed validation metadataset's (an unbatched packed train metadataset's) state saved before
    its packing buffers ran across its datasets (each dataset packed its own samples; that loader is
    built here with ``pack_per_dataset(True)``, as its fingerprint shows) restores into a loader built
    now: the rest of the saved loader's pass (or virtual epoch), as it packed (such states were
    refused: ``StateError`` "type was 'ConcatDataset', is now 'SampleConcatDataset'", for the train
    metadataset 'PooledBlendDataset' and 'SampleBlendDataset'), batched or not."""

    def loader(alone: bool):
        dataset = build(roots, composition, "packing", 1)
        dataset.packing_form().pack_per_dataset(alone)
        return er.get_savable_loader(dataset)

    old, new = loader(True), loader(False)
    before, now = [view(b) for b in old], [view(b) for b in new]
    assert [b[0] for b in before] != [b[0] for b in now]  # other packs
    if composition.startswith("meta"):  # each dataset packed alone: no pack mixed them
        assert not any("a_" in b[0][0] and "b_" in b[0][0] for b in before)
    saving = loader(True)
    it = iter(saving)
    next(it), next(it)
    state = json_transport(saving.save_state_rank())
    restored = er.get_savable_loader(build(roots, composition, "packing", 1))
    restored.restore_state_rank(state)
    assert [view(b) for b in restored] == before[2:]
    for each in (old, new, saving, restored):
        each.close()


@pytest.mark.parametrize("composition", ["val", "val-unbatched", "meta"])
def test_restore_sample_makes_packs_that_mix_datasets_again_with_their_hooks_indices(roots, composition):
    """Packs of a validation metadataset (its packing buffers run from one dataset into the next) and
    of a train metadataset's sample blend mix datasets; ``restore_sample`` makes each batch (or
    unbatched pack) again from its members' keys: the same members, draws and indices in
    ``postencode_sample`` and ``pack_selected_samples``, the second dataset's counted on from the
    first's in a validation metadataset (its members' index offsets)."""
    run = OnePass(build(roots, composition, "indexed-packing", 2))
    try:
        while True:
            try:
                next(run)
            except StopIteration:
                break
        packs = [pack for batch in run.batches for pack in zip(*(([v] if isinstance(v, str) else v) for v in (batch.__key__, batch.text)))]
        assert any("a_" in key and "b_" in key for key, _ in packs)  # a pack of both datasets
        members = [(key, int(re.search(r"\|q(\d+)", text).group(1))) for keys, texts in packs
                   for key, text in zip(keys.split("&"), texts.split("&"))]  # fmt: skip
        assert len(members) == 22
        if composition.startswith("val"):  # the second dataset's members count on past the first's (13, 2 workers)
            assert min(index for key, index in members if key.startswith("b_")) >= 12
        assert run.loader.can_restore_sample()
        for i, batch in enumerate(run.batches):
            assert view(run.loader.restore_sample(batch.__restore_key__)) == view(batch), f"restore_sample of batch {i}"
    finally:
        run.loader.close()
