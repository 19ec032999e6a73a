"""Validation order matches megatron-energon batch for batch (same dataset, same WorkerConfig)."""

from __future__ import annotations

import re

import pytest

import energon_ray as er
from tests.helpers import captioning_dataset, keys_of, text_dataset

megatron_energon = pytest.importorskip("megatron.energon")

pytestmark = pytest.mark.parity


def _energon_keys(path, split_part, rank, world, workers, batch_size, **kwargs):
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    wc = WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    loader = get_loader(get_val_dataset(path, split_part=split_part, worker_config=wc, batch_size=batch_size, **kwargs))
    return keys_of(loader)


def _our_keys(path, split_part, rank, world, workers, batch_size, **kwargs):
    wc = er.WorkerConfig(rank=rank, world_size=world, num_workers=workers)
    loader = er.get_loader(er.get_val_dataset(path, split_part=split_part, worker_config=wc, batch_size=batch_size, **kwargs))
    return keys_of(loader)


@pytest.fixture(scope="module")
def caption_ds(tmp_path_factory):
    return captioning_dataset(tmp_path_factory.mktemp("val_parity") / "ds", n=50, per_shard=7)


@pytest.mark.parametrize(
    "workers,batch_size,world",
    [(0, 4, 1), (1, 4, 1), (2, 4, 1), (4, 3, 1), (2, 5, 2), (4, 1, 1)],
)
def test_val_batches_match_energon(caption_ds, workers, batch_size, world):
    """Every rank's val batches (keys, order, sizes, worker interleave) equal megatron-energon's."""
    for rank in range(world):
        ours = _our_keys(caption_ds, "train", rank, world, workers, batch_size)
        theirs = _energon_keys(caption_ds, "train", rank, world, workers, batch_size)
        assert ours == theirs, f"rank {rank}: {ours} != {theirs}"


def test_val_limit_matches_energon(caption_ds):
    """limit=3 gives the same 3 batches as megatron-energon, twice in a row."""
    ours = er.get_loader(
        er.get_val_dataset(caption_ds, split_part="train", worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=2), batch_size=4, limit=3)
    )
    first, second = keys_of(ours), keys_of(ours)
    assert first == second == _energon_keys(caption_ds, "train", 0, 1, 2, 4, limit=3)
    assert len(first) == 3


@pytest.mark.parametrize("limit", [0, -1])
def test_val_limit_0_and_minus_1_are_no_limit_as_in_energon(caption_ds, limit):
    """limit=0 and limit=-1 give every batch, as limit=None, in get_val_dataset and get_val_datasets, as
    Energon's (it limits only when limit > 0); they raised ValueError."""
    unlimited = _our_keys(caption_ds, "train", 0, 1, 2, 4)
    assert len(unlimited) == 14  # 25 samples per worker: 6 batches of 4 and one of 1 each
    assert _our_keys(caption_ds, "train", 0, 1, 2, 4, limit=limit) == unlimited
    assert _energon_keys(caption_ds, "train", 0, 1, 2, 4, limit=limit) == unlimited
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    [(dataset, _leaf)] = er.get_val_datasets(caption_ds, split_part="train", worker_config=wc, batch_size=4, limit=limit)
    assert keys_of(er.get_loader(dataset)) == unlimited


@pytest.mark.parametrize("limit", [-5, 1.5, "3", True])
def test_val_limit_that_is_no_count_is_refused_naming_limit_and_value(caption_ds, limit):
    """A limit that is neither a positive int nor None/0/-1 raises one ValueError naming limit and the value."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    message = rf"^limit must be a positive int, or None, 0 or -1 for no limit, got {re.escape(repr(limit))}$"
    with pytest.raises(ValueError, match=message):
        er.get_val_dataset(caption_ds, split_part="train", worker_config=wc, batch_size=4, limit=limit)
    with pytest.raises(ValueError, match=message):
        er.get_val_datasets(caption_ds, split_part="train", worker_config=wc, batch_size=4, limit=limit)


def test_val_takes_max_samples_per_sequence_as_energon_does_without_effect(caption_ds):
    """Energon's get_val_dataset takes ``max_samples_per_sequence`` (its factories do) and gives the
    same order with it; ours took it for an unknown keyword (TypeError). Same batches now, in both;
    a bad value is still named."""
    plain = _our_keys(caption_ds, "train", 0, 1, 2, 4)
    assert _our_keys(caption_ds, "train", 0, 1, 2, 4, max_samples_per_sequence=3) == plain
    assert _energon_keys(caption_ds, "train", 0, 1, 2, 4, max_samples_per_sequence=3) == plain
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    assert keys_of(er.get_loader(er.get_dataset(caption_ds, training=False, split_part="train", worker_config=wc,
                                                batch_size=4, max_samples_per_sequence=3))) == plain
    with pytest.raises(ValueError, match=r"^max_samples_per_sequence must be a positive int or None, got 0$"):
        er.get_val_dataset(caption_ds, split_part="train", worker_config=wc, batch_size=4, max_samples_per_sequence=0)


def test_val_unbatched_and_uneven_shards_match_energon(tmp_path):
    """batch_size=None yields single samples in Energon's order over uneven shards."""
    path = text_dataset(tmp_path / "text", [2, 2, 3, 4, 10, 10, 10, 10, 4])
    for workers in (0, 3):
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        ours = [s.__key__ for s in er.get_loader(er.get_val_dataset(path, split_part="train", worker_config=wc, batch_size=None))]
        from megatron.energon import WorkerConfig, get_loader, get_val_dataset

        theirs = [
            s.__key__
            for s in get_loader(
                get_val_dataset(path, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=None)
            )
        ]
        assert ours == theirs
        assert sorted(ours) == [f"{i:06d}" for i in range(55)]


def test_len_matches_energon(caption_ds):
    """len(loader) (batches per rank) equals megatron-energon's."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    for workers, batch_size in ((4, 11), (2, 4), (0, 7)):
        ours = er.get_val_dataset(caption_ds, split_part="train", worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=batch_size)
        theirs = get_val_dataset(caption_ds, split_part="train", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=batch_size)
        assert len(ours) == len(get_loader(theirs))


class _PilBatch:
    """A task encoder as written for Energon: its ``decoder`` is megatron.energon's SampleDecoder."""

    decoder = megatron_energon.SampleDecoder(image_decode="pil")

    def batch(self, samples):
        return {"keys": [s.__key__ for s in samples], "types": [type(s.image).__name__ for s in samples],
                "sizes": [s.image.size for s in samples]}  # fmt: skip


class _EnergonPil(_PilBatch, megatron_energon.DefaultTaskEncoder):
    pass


class _OurPil(_PilBatch, er.DefaultTaskEncoder):
    pass


def test_megatron_energons_sample_decoder_on_a_task_encoder_decodes_as_energon(caption_ds):
    """Energon's own ``SampleDecoder`` object is taken over with its settings (PIL images here, as
    Energon decodes them), in the same order as Energon's loader gives the samples."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    theirs = [(list(b["keys"]), list(b["types"]), [tuple(s) for s in b["sizes"]])
              for b in get_loader(get_val_dataset(caption_ds, split_part="train", worker_config=wc, batch_size=3, task_encoder=_EnergonPil()))]  # fmt: skip
    ours_ds = er.get_val_dataset(caption_ds, split_part="train", batch_size=3, task_encoder=_OurPil(),
                                 worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=2))  # fmt: skip
    assert isinstance(ours_ds.decoder, er.SampleDecoder) and ours_ds.decoder.image_decode == "pil"
    ours = [(list(b["keys"]), list(b["types"]), [tuple(s) for s in b["sizes"]]) for b in er.get_loader(ours_ds)]
    assert ours == theirs and theirs and all(t == "Image" for _, types, _ in theirs for t in types)
