"""Energon's dataset wrappers against megatron-energon on the same prepared data and seed."""

from __future__ import annotations

import pytest

import energon_ray as er
from tests.helpers import prefixed_text_dataset

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return prefixed_text_dataset(tmp_path_factory.mktemp("wrappers_parity") / "t", "t", 23, per_shard=5)


def _keys(item):
    return item if isinstance(item, list) else item.__key__


def _both(path, workers, wrap):
    """``wrap(module, dataset, worker_config)`` applied to each library's unbatched validation dataset:
    (Energon's items, ours, our dataset)."""
    import megatron.energon as me

    out = []
    for lib in (me, er):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        ds = wrap(lib, lib.get_val_dataset(path, split_part="train", batch_size=None, worker_config=wc), wc)
        loader = lib.get_loader(ds)
        out.append([_keys(item) for item in loader])
        if lib is er:
            loader.close()
            out.append(ds)
    return out


def test_filter_and_batch_match_energon(path):
    """FilterDataset then BatchDataset (last batch partial) give Energon's batches, and its len()."""

    def wrap(lib, ds, wc):
        kept = lib.FilterDataset(ds, filter_fn=lambda s: int(s.__key__[-1]) % 3 != 0, worker_config=wc)
        return lib.BatchDataset(kept, 4, lambda ss: [s.__key__ for s in ss], worker_config=wc)

    theirs, ours, ds = _both(path, 0, wrap)
    assert ours == theirs and len(ours) == 4 and len(ours[-1]) == 2
    assert len(ds) == 6  # the unfiltered 23 samples in batches of 4, as Energon counts


def test_batch_drop_last_and_limit_split_over_workers_match_energon(path):
    """Two workers: batches of 5 with drop_last, limited to 3 (worker 0 gives 2, worker 1 one)."""

    def wrap(lib, ds, wc):
        batched = lib.BatchDataset(ds, 5, lambda ss: [s.__key__ for s in ss], drop_last=True, worker_config=wc)
        return lib.LimitDataset(batched, 3, worker_config=wc)

    theirs, ours, ds = _both(path, 2, wrap)
    assert ours == theirs and len(ours) == 3 and len(ds) == 3


def test_repeat_matches_energon(path):
    """Two and a half repetitions of a validation dataset: Energon's order, per worker, and count."""

    def wrap(lib, ds, wc):
        return lib.RepeatDataset(ds, repeats=2.5, worker_config=wc)

    theirs, ours, ds = _both(path, 0, wrap)
    assert ours == theirs and len(ours) == 23 * 2 + 11
    assert len(ds) == 57


def test_repeating_on_a_rank_without_samples_is_refused_like_energon(tmp_path):
    """A 1-sample dataset on 4 ranks: rank 3 holds no sample. Energon refuses to repeat its empty
    training dataset, or a ``RepeatDataset`` of its empty validation dataset; so do we (that loop
    ended at once with no batch, and the rank left training while the others went on). Rank 0
    repeats its one sample in both, and ``repeat=False`` gives rank 3 no batch in both."""
    import megatron.energon as me

    one = prefixed_text_dataset(tmp_path / "one", "t", 1)
    refusal = {me: (AssertionError, "Cannot repeat empty dataset"), er: (er.DatasetConfigError, r"rank 3 of world size 4 .* holds no sample")}
    for lib in (me, er):

        def train(rank, **kwargs):
            wc = lib.WorkerConfig(rank=rank, world_size=4, num_workers=0)
            kw = dict(batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None)
            return lib.get_loader(lib.get_train_dataset(one, split_part="train", worker_config=wc, **kw, **kwargs))

        first = iter(train(0))
        assert [list(next(first).__key__) for _ in range(2)] == [["t_000000", "t_000000"]] * 2, lib.__name__
        assert [list(b.__key__) for b in train(3, repeat=False)] == [], lib.__name__
        empty = train(3)
        assert len(empty) == 0, lib.__name__
        with pytest.raises(refusal[lib][0], match=refusal[lib][1]):
            next(iter(empty))
        wc = lib.WorkerConfig(rank=3, world_size=4, num_workers=0)
        repeated = lib.RepeatDataset(lib.get_val_dataset(one, split_part="train", batch_size=None, worker_config=wc), worker_config=wc)
        with pytest.raises(refusal[lib][0], match=refusal[lib][1]):
            next(iter(lib.get_loader(repeated)))


def test_augment_task_encoder_changes_only_what_it_overrides(path):
    """Energon's ``test_weight_aug`` pattern: a subclass adds a field in encode_sample; batches come as before."""

    @er.edataclass
    class Weighted(er.TextSample):
        weight: float = 0.0

    class Aug(er.AugmentTaskEncoder):
        def encode_sample(self, sample):
            sample = super().encode_sample(sample)
            return Weighted.extend(sample, weight=0.5)

    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=0)
    loader = er.get_loader(er.get_val_dataset(path, split_part="train", batch_size=10, worker_config=wc, task_encoder=Aug(er.DefaultTaskEncoder())))
    batches = list(loader)
    loader.close()
    assert [b.weight for b in batches] == [[0.5] * 10, [0.5] * 10, [0.5] * 3]
