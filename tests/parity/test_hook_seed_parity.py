"""A ``@stateless(restore_seeds=True)`` hook sees Energon's indices and draws Energon's random numbers."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

import energon_ray as er
from tests.helpers import captioning_dataset

pytestmark = pytest.mark.parity


def _encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        @lib.stateless(restore_seeds=True)
        def encode_sample(self, sample):
            draws = (random.randint(0, 1000), int(np.random.randint(0, 1000)), int(torch.randint(0, 1000, ())))
            return (sample.__key__, self.current_batch_index, self.current_sample_index, draws)

        def batch(self, samples):
            return list(samples)

    return Encoder()


def _batches(lib, path, rank, workers, n, train):
    wc = lib.WorkerConfig(rank=rank, world_size=2, num_workers=workers)
    if train:
        ds = lib.get_train_dataset(
            path, batch_size=2, task_encoder=_encoder(lib), worker_config=wc, shuffle_buffer_size=20, max_samples_per_sequence=10
        )  # fmt: skip
    else:
        ds = lib.get_val_dataset(path, split_part="train", batch_size=2, task_encoder=_encoder(lib), worker_config=wc)
    out = []
    for batch in lib.get_loader(ds):
        out.append([(key, bi, si, tuple(draws)) for key, bi, si, draws in batch])
        if len(out) == n:
            break
    return out


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return captioning_dataset(tmp_path_factory.mktemp("hook_seed_parity") / "ds", n=48, per_shard=6)


@pytest.mark.parametrize("rank,workers", [(0, 2), (1, 2), (0, 3)])
def test_restore_seeds_hooks_match_energon(path, rank, workers):
    """Rank ``rank`` of 2 with ``workers`` workers, 12 validation batches: every sample's key, its
    ``current_batch_index`` and ``current_sample_index`` (counted over the rank's interleaved workers)
    and its python, numpy and torch random draws equal megatron-energon's. Training batches (whose
    shuffled order is energon_ray's own): the same indices and draws batch for batch."""
    import megatron.energon as me

    ours = _batches(er, path, rank, workers, 12, train=False)
    assert ours == _batches(me, path, rank, workers, 12, train=False)
    assert [b[0][1] for b in ours] == list(range(12))  # the loader's batch index, as Energon counts it
    assert len({s[3] for b in ours for s in b}) == 24  # every sample drew its own numbers
    drop_keys = lambda batches: [[s[1:] for s in b] for b in batches]  # noqa: E731
    ours = _batches(er, path, rank, workers, 12, train=True)
    assert drop_keys(ours) == drop_keys(_batches(me, path, rank, workers, 12, train=True))


def _generator_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        @lib.stateless(restore_seeds=True)
        def encode_sample(self, sample):
            index = int(sample.__key__.split("_")[-1])
            for sub in range(index % 4):  # 0 to 3 outputs
                if sub == 1 and index % 5 == 3:  # samples 3, 18, 23, 38, 43: one output, then a failure
                    raise ValueError(f"{sample.__key__} fails after its first output")
                yield (sample.__key__, sub, self.current_batch_index, self.current_sample_index, random.randint(0, 1000))

        def batch(self, samples):
            return [s + (self.current_batch_index,) for s in samples]

    return Encoder()


@pytest.mark.parametrize("rank,workers", [(0, 1), (1, 2)])
def test_generator_encoder_batches_match_energon(path, rank, workers):
    """A generator ``encode_sample`` with 0-3 outputs per sample, a whole validation pass: the same
    batches (outputs run across samples and, here, across segments of 3 samples), each output's
    ``current_batch_index``/``current_sample_index`` and draws, and the batch hook's index. A sample
    whose generator fails after its first output keeps that output (as Energon's lazy map does)."""
    import megatron.energon as me

    def batches(lib, **more):
        wc = lib.WorkerConfig(rank=rank, world_size=2, num_workers=workers)
        ds = lib.get_val_dataset(path, split_part="train", batch_size=3, task_encoder=_generator_encoder(lib), worker_config=wc, **more)
        return [[tuple(s) for s in batch] for batch in lib.get_loader(ds)]  # (Energon's loader gives lists)

    ours = batches(er, samples_per_segment=3)
    assert ours == batches(me)
    assert len(ours) > 8 and any(s[1] == 2 for b in ours for s in b)
    failed = {f"{i:06d}" for i in (3, 18, 23, 38, 43)}
    kept = [s[:2] for b in ours for s in b if s[0].split("_")[-1] in failed]
    assert kept and all(sub == 0 for _, sub in kept)


def _batch_hook_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            return sample.__key__

        @lib.stateless(restore_seeds=True)
        def batch(self, samples):
            draws = (random.randint(0, 1000), int(np.random.randint(0, 1000)), int(torch.randint(0, 1000, ())))
            return (tuple(samples), self.current_batch_index, self.current_sample_index, draws)

        @lib.stateless(restore_seeds=True)
        def encode_batch(self, batch):
            return (*batch, self.current_sample_index, random.randint(0, 1000), int(torch.randint(0, 1000, ())))

    return Encoder()


@pytest.mark.parametrize("rank,workers,per_segment", [(0, 2, None), (1, 2, 4), (0, 3, 5)])
def test_restore_seeds_batch_hooks_match_energon(path, rank, workers, per_segment):
    """``batch`` and ``encode_batch`` marked ``@stateless(restore_seeds=True)``, a whole validation
    pass (segments of 4 or 5 samples: batches of 3 straddle them): each batch's keys, its
    ``current_batch_index`` and ``current_sample_index`` (Energon counts the hook's calls: the batch
    index; ours raised, so every batch was skipped) and both hooks' draws equal megatron-energon's."""
    import megatron.energon as me

    def batches(lib, **more):
        wc = lib.WorkerConfig(rank=rank, world_size=2, num_workers=workers)
        ds = lib.get_val_dataset(path, split_part="train", batch_size=3, task_encoder=_batch_hook_encoder(lib), worker_config=wc, **more)
        plain = lambda value: [plain(v) for v in value] if isinstance(value, (list, tuple)) else value  # noqa: E731
        return [plain(batch) for batch in lib.get_loader(ds)]  # (Energon's loader gives lists for tuples)

    ours = batches(er, **({"samples_per_segment": per_segment} if per_segment else {}))
    assert ours == batches(me)
    assert len(ours) >= 8 and [b[1] for b in ours] == [b[2] for b in ours] == list(range(len(ours)))
    assert len({tuple(b[3]) for b in ours}) == len(ours)  # every batch drew its own numbers


def _skipping_batch_hook_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        @lib.stateless
        def encode_sample(self, sample):
            if int(sample.__key__.split("_")[-1]) in (2, 3, 7, 8, 9, 14, 20, 21, 33):
                raise lib.SkipSample()
            return sample.__key__

        @lib.stateless(restore_seeds=True)
        def batch(self, samples):
            return (tuple(samples), self.current_batch_index, random.randint(0, 1000), int(np.random.randint(0, 1000)))

        @lib.stateless(restore_seeds=True)
        def encode_batch(self, batch):
            return (*batch, self.current_sample_index, int(torch.randint(0, 1000, ())))

    return Encoder()


@pytest.mark.parametrize("workers,per_segment", [(1, 4), (2, 5)])
def test_restore_seeds_batch_hooks_after_skipped_samples_match_energon(path, workers, per_segment):
    """Samples skipped by ``encode_sample`` (in several segments): batches of 2 made after them get
    Energon's batch index (the number of batches made before, not the first sample's position over
    the batch size: 1 where ours said 2) and draw Energon's numbers in ``batch`` and ``encode_batch``."""
    import megatron.energon as me

    def batches(lib, **more):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        ds = lib.get_val_dataset(path, split_part="train", batch_size=2, task_encoder=_skipping_batch_hook_encoder(lib), worker_config=wc, **more)
        plain = lambda value: [plain(v) for v in value] if isinstance(value, (list, tuple)) else value  # noqa: E731
        return [plain(batch) for batch in lib.get_loader(ds)]

    ours = batches(er, samples_per_segment=per_segment)
    assert ours == batches(me)
    assert len(ours) == 20 and [b[1] for b in ours] == [b[4] for b in ours]
    if workers == 1:
        assert [b[1] for b in ours] == list(range(20))


def _skipping_encoder(lib, skipped):
    class Encoder(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            if int(sample.__key__.split("_")[-1]) in skipped:
                raise lib.SkipSample()
            return sample.__key__

        def batch(self, samples):
            return list(samples)

    return Encoder()


@pytest.mark.parametrize("workers,per_segment,skipped", [
    (1, 3, (2,)), (1, 4, (2, 3, 7, 8, 9, 14, 20, 21, 33)), (2, 5, (1, 2, 3, 4, 5, 6, 30)), (3, None, (0, 17, 40, 41)),
])  # fmt: skip
def test_plain_batches_after_skipped_samples_match_energon(path, workers, per_segment, skipped):
    """A plain ``encode_sample`` that skips samples (``SkipSample``) and batches of 3, a whole
    validation pass: every batch after a skipped sample holds Energon's keys in Energon's order (a
    worker stream's batches run on across its segments; each segment had cut batches from its own
    first sample and left the rest to seam batches at the end: [3,4,5] … [0,1,12] for [0,1,3] …)."""
    import megatron.energon as me

    def batches(lib, **more):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        ds = lib.get_val_dataset(path, split_part="train", batch_size=3, task_encoder=_skipping_encoder(lib, skipped), worker_config=wc, **more)
        return [list(batch) for batch in lib.get_loader(ds)]

    ours = batches(er, **({"samples_per_segment": per_segment} if per_segment else {}))
    assert ours == batches(me)
    assert sum(len(b) for b in ours) == 48 - len(skipped)


def _late_carry_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            index = int(sample.__key__.split("_")[-1])
            if index in (1, 25):
                raise lib.SkipSample()
            if index in (3, 27):  # each worker stream's first segment ends late: the next one waits for its carry
                time.sleep(1.5)
            return sample.__key__

        def batch(self, samples):
            return [list(samples), self.current_batch_index, self.current_sample_index]

    return Encoder()


def test_batches_made_once_a_late_carry_came_match_energon(path):
    """Two worker streams whose first segments end after the next ones were encoded: those batch
    once the carry has come, outside the encode loop, and their ``batch`` hooks still see Energon's
    ``current_batch_index`` and ``current_sample_index`` (counted over the rank's interleaved workers)."""
    import megatron.energon as me

    def batches(lib, **more):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = lib.get_val_dataset(path, split_part="train", batch_size=2, task_encoder=_late_carry_encoder(lib), worker_config=wc, **more)
        return [[list(b[0]), b[1], b[2]] for b in lib.get_loader(ds)]

    ours = batches(er, samples_per_segment=4)
    assert ours == batches(me)
    assert len(ours) == 24 and ours[1][0] == ["sample_000024", "sample_000026"]


@pytest.fixture(scope="module")
def two_leaf_val(tmp_path_factory):
    """A validation metadataset of two datasets (7 and 8 samples)."""
    from tests.helpers import val_metadataset

    return val_metadataset(tmp_path_factory.mktemp("unbatched_meta"), [("b", 7, 7), ("f", 8, 4)])


def _index_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        @lib.stateless(restore_seeds=True)
        def encode_sample(self, sample):
            return [sample.__key__, self.current_batch_index, self.current_sample_index, random.randint(0, 1000), int(torch.randint(0, 1000, ()))]

    return Encoder()


@pytest.mark.parametrize("workers", [0, 2])
def test_unbatched_val_metadataset_indices_count_on_into_the_next_dataset_like_energon(two_leaf_val, workers):
    """An unbatched validation metadataset (``batch_size=None``): the second dataset's samples get
    Energon's ``current_batch_index``/``current_sample_index`` (counted on from the first dataset's,
    over the worker's concatenated stream) and a ``restore_seeds`` encode_sample's draws. They
    restarted at 0 in each dataset (only a batched metadataset counted on)."""
    import megatron.energon as me

    def samples(lib):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        ds = lib.get_val_dataset(two_leaf_val, split_part="val", batch_size=None, task_encoder=_index_encoder(lib), worker_config=wc)
        return [[int(v) if isinstance(v, torch.Tensor) else v for v in s] for s in lib.get_loader(ds)]

    ours = samples(er)
    assert ours == samples(me)
    assert len(ours) == 15 and len({tuple(s[3:]) for s in ours}) == 15
    if workers == 0:
        assert [s[:3] for s in ours[6:8]] == [["b_000006", 6, 6], ["f_000000", 7, 7]]


def _skipping_batch_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            if sample.__key__ in ("b_000002", "b_000006", "f_000001", "f_000005"):
                raise lib.SkipSample()
            return sample

        @lib.stateless(restore_seeds=True)
        def batch(self, samples):
            return [[s.__key__ for s in samples], self.current_batch_index, random.randint(0, 1000), int(torch.randint(0, 1000, ()))]

    return Encoder()


@pytest.mark.parametrize("workers", [0, 2])
def test_batched_val_metadataset_batch_hooks_count_batches_after_skipped_samples_like_energon(two_leaf_val, workers):
    """A batched validation metadataset whose ``encode_sample`` skips samples: the batch hooks'
    ``current_batch_index`` and a ``restore_seeds`` batch hook's draws are Energon's (the batches made
    before, over the worker's stream through both datasets); they were the first sample's position
    there over the batch size, ahead of Energon's after each skip."""
    import megatron.energon as me

    def batches(lib):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        ds = lib.get_val_dataset(two_leaf_val, split_part="val", batch_size=2, task_encoder=_skipping_batch_encoder(lib), worker_config=wc)
        return [[list(b[0]), int(b[1]), int(b[2]), int(b[3])] for b in lib.get_loader(ds)]

    ours = batches(er)
    assert ours == batches(me)
    assert sum(len(b[0]) for b in ours) == 11 and sorted(b[1] for b in ours) == list(range(len(ours)))
