"""Task-encoder hooks other than packing and cooking give Energon's validation batches."""

from __future__ import annotations

import pytest

import energon_ray as er
from tests.helpers import text_dataset

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return text_dataset(tmp_path_factory.mktemp("hook_parity") / "text", [5, 7, 3, 9, 6])  # 30 samples


def _batches(lib, path, task_encoder, workers, batch_size, **kwargs):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = lib.get_val_dataset(str(path), split_part="train", batch_size=batch_size, task_encoder=task_encoder, worker_config=wc, **kwargs)
    return [dict(b) for b in lib.get_loader(ds)]


def _preencode_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        def preencode_sample(self, sample):
            return {"key": sample.__key__, "index": self.current_sample_index}

        def batch(self, samples):
            return {"keys": [s["key"] for s in samples], "indices": [s["index"] for s in samples]}

    return Encoder()


@pytest.mark.parametrize("workers", [0, 2])
def test_preencode_sample_without_packing_encodes_each_sample_as_energon(path, workers):
    """Energon runs an overridden ``preencode_sample`` as the sample encoder with or without
    packing; ours ran it only with packing, so the samples reached ``batch`` unencoded (every batch
    failed: no batch at all). Now the same batches, keys and ``current_sample_index`` values."""
    import megatron.energon as me

    ours = _batches(er, path, _preencode_encoder(er), workers, 3)
    theirs = _batches(me, path, _preencode_encoder(me), workers, 3)
    assert ours == theirs
    assert len(ours) == 10 and sorted(k for b in ours for k in b["keys"]) == [f"{i:06d}" for i in range(30)]


def _grouping_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            return {"key": sample.__key__, "i": int(sample.text)}

        def batch_group_criterion(self, sample):
            i = sample["i"]
            if i >= 20 and i % 3 == 0:  # a bucket that first appears late
                return ("late", 4)
            return (i % 2, 2 if i % 2 else 3)  # buckets of different batch sizes

        def batch(self, samples):
            return {"keys": [s["key"] for s in samples], "batch_index": self.current_batch_index}

        def encode_batch(self, batch):
            return {**batch, "encode_batch_index": self.current_batch_index}

    return Encoder()


@pytest.mark.parametrize("workers,drop_last", [(0, False), (1, True), (2, False), (2, True)])
def test_grouped_batches_see_energons_current_batch_index(path, workers, drop_last):
    """``batch_group_criterion`` with buckets of sizes 2, 3 and 4 (the last opened late), the short
    buckets flushed (or dropped): the same batches as Energon, and ``current_batch_index`` inside
    ``batch``/``encode_batch`` is Energon's (the loader's batch number: 0, 1, 2, … over the rank's
    interleaved workers). Ours read the first sample's position over the bucket size (0, 0, 2, 2, 4, 6…)."""
    import megatron.energon as me

    ours = _batches(er, path, _grouping_encoder(er), workers, None, batch_drop_last=drop_last)
    theirs = _batches(me, path, _grouping_encoder(me), workers, None, batch_drop_last=drop_last)
    assert ours == theirs
    assert [b["batch_index"] for b in ours] == [b["encode_batch_index"] for b in ours] == list(range(len(ours)))
    assert len(ours) == (10 if drop_last else 13)
    assert (["000021", "000024", "000027"] in [b["keys"] for b in ours]) is not drop_last  # the late, short bucket


def test_grouped_batch_index_runs_on_after_a_restore(path):
    """A restored grouped loader's batches keep counting ``current_batch_index`` where the saved one
    stood (the count is part of each worker stream's checkpoint)."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)

    def loader():
        ds = er.get_val_dataset(str(path), split_part="train", batch_size=None, task_encoder=_grouping_encoder(er), worker_config=wc)
        return er.get_savable_loader(ds)

    full = [dict(b) for b in loader()]
    first = loader()
    it = iter(first)
    head = [dict(next(it)) for _ in range(5)]
    state = first.save_state_rank()
    restored = loader()
    restored.restore_state_rank(state)
    assert head + [dict(b) for b in restored] == full


def _postencoded_generator_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            i = int(sample.text)
            if i % 4 == 1:
                raise lib.SkipSample()
            for sub in range(i % 3):  # 0, 1 or 2 outputs
                yield {"key": f"{sample.__key__}{'ab'[sub]}"}

        def postencode_sample(self, sample):
            return {**sample, "post": True}

        def batch(self, samples):
            return {"keys": [s["key"] for s in samples], "post": all(s["post"] for s in samples), "batch_index": self.current_batch_index}

    return Encoder()


@pytest.mark.parametrize("workers,segment", [(1, 2), (2, 3), (0, None)])
def test_postencode_sample_after_a_generator_encode_sample_gives_energons_batches(path, workers, segment):
    """A generator ``encode_sample`` (0-2 outputs, some samples skipped) and a ``postencode_sample``,
    batches of 2 over segments of a few samples: Energon's batches (keys and order) and
    ``current_batch_index``. With ``postencode_sample`` the segments were not chained: each batched
    its own outputs and pooled the rest (batches out of order, indices the first sample's position)."""
    import megatron.energon as me

    extra = {} if segment is None else {"samples_per_segment": segment}
    ours = _batches(er, path, _postencoded_generator_encoder(er), workers, 2, **extra)
    theirs = _batches(me, path, _postencoded_generator_encoder(me), workers, 2)
    assert ours == theirs
    assert [b["batch_index"] for b in ours] == list(range(len(ours))) and all(b["post"] for b in ours)
    assert sum(len(b["keys"]) for b in ours) == 21
