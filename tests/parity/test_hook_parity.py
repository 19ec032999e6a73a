"""Task-encoder hooks other than packing and cooking give Energon's validation batches."""

from __future__ import annotations

import json
import random

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


def _skipping_generator(lib, keyed: bool = False):
    """A task encoder class whose generator ``encode_sample`` skips every fourth sample and gives the
    others 0, 1 or 2 outputs (``keyed``: each with its sample's restore key)."""

    class Generator(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            i = int(sample.text)
            if i % 4 == 1:
                raise lib.SkipSample()
            for sub in range(i % 3):  # 0, 1 or 2 outputs
                out = {"key": f"{sample.__key__}{'ab'[sub]}"}
                yield {**out, "__restore_key__": sample.__restore_key__} if keyed else out

    return Generator


def _postencoded_generator_encoder(lib):
    class Encoder(_skipping_generator(lib)):
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


def _generator_batch_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        @lib.stateless(restore_seeds=True)
        def batch(self, samples):
            texts = [int(s.text) for s in samples]
            for k in range(1 + texts[0] // 2 % 3):  # 1 to 3 batches of a group
                seen = [self.current_batch_index, self.current_sample_index, random.randint(0, 10**6)]
                yield {"texts": texts, "k": k, "batch": seen, "__restore_key__": ()}

        @lib.stateless(restore_seeds=True)
        def encode_batch(self, batch):
            if batch["texts"][0] in (8, 9) and batch["k"] == 0:
                raise ValueError("this batch is dropped")
            return {**batch, "encode_batch": [self.current_batch_index, self.current_sample_index, random.randint(0, 10**6)]}

    return Encoder()


def _generator_batch_dataset(lib, path, workers, **kwargs):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    te = _generator_batch_encoder(lib)
    return lib.get_val_dataset(str(path), split_part="train", batch_size=2, task_encoder=te, worker_config=wc, **kwargs)


_VIEW = ("texts", "k", "batch", "encode_batch")


def _view(batch) -> list:
    return [batch[name] for name in _VIEW]


@pytest.mark.parametrize("workers", [0, 2])
def test_generator_batch_hooks_count_batches_given_like_energon(path, workers):
    """A generator ``batch`` yielding 1-3 batches per group of 2 and an ``encode_batch`` that drops
    two of them, both ``@stateless(restore_seeds=True)``, segments of 3 samples: each batch's
    ``current_batch_index`` (Energon's: the batches given before, also between a generator's
    outputs), ``current_sample_index`` (``batch``: the group's; ``encode_batch``: the outputs of
    ``batch`` before) and both hooks' draws are Energon's (ours read the group's index everywhere),
    and restore_sample makes each batch again as it was."""
    import megatron.energon as me

    loader = er.get_savable_loader(_generator_batch_dataset(er, path, workers, samples_per_segment=3))
    ours = [dict(b) for b in loader]
    theirs = [dict(b) for b in me.get_loader(_generator_batch_dataset(me, path, workers))]
    assert [_view(b) for b in ours] == [_view(b) for b in theirs]
    given = sorted(b["encode_batch"][0] for b in ours)  # each batch its own index (workers interleaved)
    assert len(ours) == (29 if workers == 0 else 31) and len(set(given)) == len(ours)
    assert workers or given == list(range(29))
    assert any(b["batch"][0] != b["batch"][1] for b in ours)  # not the group's index
    for batch in ours:
        again = loader.restore_sample(batch["__restore_key__"])
        assert _view(again) == _view(batch)
        assert json.loads(json.dumps(again["__restore_key__"])) == json.loads(json.dumps(batch["__restore_key__"]))
    loader.close()


def test_generator_batch_counts_run_on_after_a_restore_and_older_states_and_keys_restore(path):
    """The batch counts of the generator batch hooks above run on in a restored loader (a state
    records them where each worker stream's carry is rebuilt) as in the loader saved; a state saved
    before they were counted (three items in ``chain``) restores the same batches, counted from its
    groups; a restore key without ``("Made", ...)`` (saved before) is made again as it was: every
    hook call reading the group's index."""
    import dataclasses

    def loader():
        return er.get_savable_loader(_generator_batch_dataset(er, path, 2, samples_per_segment=3))

    full = [_view(b) for b in loader()]
    for cut in (5, 12):
        first = loader()
        it = iter(first)
        head = [_view(next(it)) for _ in range(cut)]
        state = first.save_state_rank()
        first.close()
        assert any(len(s.checkpoint.chain or ()) == 5 for s in state.streams[0])
        restored = loader()
        restored.restore_state_rank(state)
        assert head + [_view(b) for b in restored] == full
        restored.close()
        old = dataclasses.replace(state, streams=[[
            dataclasses.replace(s, checkpoint=dataclasses.replace(s.checkpoint, chain=s.checkpoint.chain and s.checkpoint.chain[:3]))
            for s in workers] for workers in state.streams])  # fmt: skip
        again = loader()
        again.restore_state_rank(old)
        assert [v[:2] for v in head + [_view(b) for b in again]] == [v[:2] for v in full]
        again.close()
    keeper = loader()
    batches = [dict(b) for b in keeper]
    for batch in (batches[3], batches[4], batches[-1]):
        key = list(batch["__restore_key__"])
        made = key.index("Made")
        again = keeper.restore_sample(key[:made] + key[made + 3 :])
        group = key[1] * 2 + key[-1][3]  # the group's index over the rank's 2 interleaved workers
        assert again["texts"] == batch["texts"] and again["k"] == batch["k"]
        assert again["batch"][:2] == again["encode_batch"][:2] == [group, group]
    keeper.close()


def _seeded_postencode_encoder(lib):
    class Encoder(_skipping_generator(lib, keyed=True)):
        @lib.stateless(restore_seeds=True)
        def postencode_sample(self, sample):
            return {**sample, "post": [self.current_batch_index, self.current_sample_index, random.randint(0, 10**6)]}

        def batch(self, samples):
            return {"keys": [s["key"] for s in samples], "post": [s["post"] for s in samples], "__restore_key__": ()}

    return Encoder()


@pytest.mark.parametrize("workers", [1, 2])
def test_postencode_sample_after_a_generator_encode_sample_counts_outputs_like_energon(path, workers):
    """A generator ``encode_sample`` (0-2 outputs, some samples skipped) and a ``postencode_sample``
    marked ``@stateless(restore_seeds=True)``, batches of 2 over segments of 3 samples: inside
    ``postencode_sample``, ``current_sample_index`` is the worker stream's outputs before (Energon's
    count; ours was the sample's position), ``current_batch_index`` the batch the output goes into,
    and the hook draws Energon's numbers (it drew energon_ray's own); restore_sample makes each batch
    again as it was."""
    import megatron.energon as me

    def dataset(lib, **more):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        te = _seeded_postencode_encoder(lib)
        return lib.get_val_dataset(str(path), split_part="train", batch_size=2, task_encoder=te, worker_config=wc, **more)

    view = lambda b: [b["keys"], b["post"]]  # noqa: E731
    loader = er.get_savable_loader(dataset(er, samples_per_segment=3))
    ours = [dict(b) for b in loader]
    assert [view(b) for b in ours] == [view(dict(b)) for b in me.get_loader(dataset(me))]
    indices = sorted(p[1] for b in ours for p in b["post"])
    assert len(ours) == 11 and indices == list(range(21))
    for batch in ours:
        assert view(loader.restore_sample(batch["__restore_key__"])) == view(batch)
    loader.close()


def _unbatched_generator_encoder(lib):
    """A generator ``encode_sample`` (samples skipped, 0-2 outputs) and a ``postencode_sample``
    that drops two outputs, both ``@stateless(restore_seeds=True)``, each recording its indices and a
    random draw."""

    class Encoder(_skipping_generator(lib)):
        @lib.stateless(restore_seeds=True)
        def encode_sample(self, sample):
            for out in super().encode_sample(sample):
                seen = [self.current_batch_index, self.current_sample_index, random.randint(0, 10**6)]
                yield {**out, "encode": seen, "__restore_key__": sample.__restore_key__}

        @lib.stateless(restore_seeds=True)
        def postencode_sample(self, sample):
            if sample["key"] in ("000002a", "000020a"):  # the sample's next output reads the same batch index
                raise lib.SkipSample()
            return {**sample, "post": [self.current_batch_index, self.current_sample_index, random.randint(0, 10**6)]}

    return Encoder()


def _unbatched_generator_dataset(lib, path, workers, **kwargs):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    te = _unbatched_generator_encoder(lib)
    return lib.get_val_dataset(str(path), split_part="train", batch_size=None, task_encoder=te, worker_config=wc, **kwargs)


def _output_view(sample) -> list:
    return [sample["key"], sample["encode"], sample["post"]]


@pytest.mark.parametrize("workers", [1, 2])
def test_unbatched_generator_encode_sample_counts_outputs_given_like_energon(path, workers):
    """Unbatched (``batch_size=None``), a generator ``encode_sample`` (0-2 outputs, some samples
    skipped) and a ``postencode_sample`` dropping two outputs, both ``restore_seeds``, segments of 3
    samples: inside ``encode_sample`` ``current_batch_index`` is the worker stream's outputs given
    before (one more between the generator's outputs), in ``postencode_sample``
    ``current_sample_index`` the outputs made before and ``current_batch_index`` those given, and
    both hooks draw Energon's numbers (ours read the sample's position); restore_sample makes each
    output again as it was."""
    import megatron.energon as me

    loader = er.get_savable_loader(_unbatched_generator_dataset(er, path, workers, samples_per_segment=3))
    ours = [dict(s) for s in loader]
    theirs = [dict(s) for s in me.get_loader(_unbatched_generator_dataset(me, path, workers))]
    assert [_output_view(s) for s in ours] == [_output_view(s) for s in theirs]
    assert len(ours) == 19 and sorted(s["post"][0] for s in ours) == list(range(19))  # each given its own index
    assert sorted(s["post"][1] for s in ours) != sorted(s["post"][0] for s in ours)  # made, not given
    for sample in ours:
        again = loader.restore_sample(sample["__restore_key__"])
        assert _output_view(again) == _output_view(sample)
        assert tuple(again["__restore_key__"]) == tuple(sample["__restore_key__"])
    loader.close()


def test_unbatched_generator_counts_run_on_after_a_restore_and_older_states_and_keys_restore(path):
    """The counts above run on in a restored loader (each worker stream's checkpoint records them)
    as in the loader saved; a state saved before such streams were chained (``unbatched_chained``
    False, no ``chain``) restores the same outputs with the hooks reading positions, as it was made,
    and so does an output's key without the counts (7 fields, saved before)."""
    import dataclasses

    def loader():
        return er.get_savable_loader(_unbatched_generator_dataset(er, path, 2, samples_per_segment=3))

    full = [_output_view(s) for s in loader()]
    for cut in (4, 11):
        first = loader()
        it = iter(first)
        head = [_output_view(next(it)) for _ in range(cut)]
        state = first.save_state_rank()
        first.close()
        assert state.unbatched_chained and any(len(s.checkpoint.chain or ()) == 5 for s in state.streams[0])
        restored = loader()
        restored.restore_state_rank(json.loads(state.to_json()))
        assert head + [_output_view(s) for s in restored] == full
        restored.close()
        old = dataclasses.replace(state, unbatched_chained=False, streams=[[
            dataclasses.replace(s, checkpoint=dataclasses.replace(s.checkpoint, chain=None))
            for s in workers] for workers in state.streams])  # fmt: skip
        again = loader()
        again.restore_state_rank(old)
        rest = [dict(s) for s in again]
        assert [v[0] for v in head] + [s["key"] for s in rest] == [v[0] for v in full]
        assert all(s["encode"][0] == s["__restore_key__"][4] * 2 + s["__restore_key__"][3] for s in rest)  # positions
        assert not again.save_state_rank().unbatched_chained
        again.close()
    keeper = loader()
    samples = [dict(s) for s in keeper]
    for sample in (samples[3], samples[-1]):
        key = tuple(sample["__restore_key__"])
        assert len(key) == 9
        made = keeper.restore_sample(key[:7])
        assert made["key"] == sample["key"] and made["encode"][0] == key[4] * 2 + key[3]
    keeper.close()
