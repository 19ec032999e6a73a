"""Energon's wrappers on compositions, without Ray (``tests/roundtrip.SimLeaf``): one documented
behaviour each, and the save-at-every-k / restore / compare-the-rest round trip for the stateful ones."""

from __future__ import annotations

import logging

import pytest

import energon_ray as er
from tests.roundtrip import SimLeaf, SimLoader, assert_round_trip, json_transport

WC1 = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
WC2 = er.WorkerConfig(rank=0, world_size=1, num_workers=2)


def every_k(make, **kwargs):
    """Round trip at every position of the pass, through JSON."""
    total = len(assert_round_trip(make, [], **kwargs))
    return assert_round_trip(make, range(total + 1), transport=json_transport, **kwargs)


def samples(lengths, name="s", wc=WC2, **kwargs):
    return SimLeaf(lengths, name=name, batch_size=None, worker_config=wc, **kwargs)


def test_filter_drops_items_and_restores():
    items = every_k(lambda: SimLoader(er.FilterDataset(samples([6, 5]), filter_fn=lambda s: s.endswith(("1", "3")))))
    assert items == ["s0.1", "s1.1", "s0.3", "s1.3"]


def test_batch_keeps_last_partial_batch_unless_drop_last():
    items = every_k(lambda: SimLoader(er.BatchDataset(samples([5, 3]), 2, tuple)))
    assert items == [("s0.0", "s0.1"), ("s1.0", "s1.1"), ("s0.2", "s0.3"), ("s1.2",), ("s0.4",)]
    dropped = every_k(lambda: SimLoader(er.BatchDataset(samples([5, 3]), 2, tuple, drop_last=True)))
    assert dropped == [("s0.0", "s0.1"), ("s1.0", "s1.1"), ("s0.2", "s0.3")]


def test_generator_batcher_restores_mid_group():
    """A batcher yielding two halves: a save between them restores to the second half."""

    def halves(group):
        yield group[: len(group) // 2]
        yield group[len(group) // 2 :]

    items = every_k(lambda: SimLoader(er.BatchDataset(samples([7, 4]), 4, halves)))
    assert items == [["s0.0", "s0.1"], ["s1.0", "s1.1"], ["s0.2", "s0.3"], ["s1.2", "s1.3"], ["s0.4"], ["s0.5", "s0.6"]]


def test_limit_splits_length_over_workers_like_energon():
    items = every_k(lambda: SimLoader(er.LimitDataset(samples([6, 6]), 5)))
    assert items == ["s0.0", "s1.0", "s0.1", "s1.1", "s0.2"]
    assert len(er.LimitDataset(samples([6, 6]), 5)) == 5 and len(er.LimitDataset(samples([1, 1]), 5)) == 2


def test_iter_map_stateful_and_stateless_restore_exactly():
    def pairs(it):  # aggregates: must be replayed from the pass start
        buf = []
        for s in it:
            buf.append(s)
            if len(buf) == 2:
                yield "+".join(buf)
                buf = []
        if buf:
            yield buf[0]

    items = every_k(lambda: SimLoader(er.IterMapDataset(samples([5, 2]), pairs, len_map_fn=lambda n: n // 2)))
    assert items == ["s0.0+s0.1", "s1.0+s1.1", "s0.2+s0.3", "s0.4"]
    assert len(er.IterMapDataset(samples([5, 2]), pairs, len_map_fn=lambda n: n // 2)) == 3

    def twice(it):
        for s in it:
            yield s + "a"
            yield s + "b"

    items = every_k(lambda: SimLoader(er.IterMapDataset(samples([3, 2]), twice, stateless_iter_fn=True)))
    assert items[:4] == ["s0.0a", "s1.0a", "s0.0b", "s1.0b"] and len(items) == 10


def test_shuffle_buffer_is_a_seeded_permutation_and_restores_exactly():
    make = lambda: SimLoader(er.ShuffleBufferDataset(samples([9, 7], segment=3), 4))  # noqa: E731
    items = every_k(make)
    assert sorted(items) == sorted([f"s0.{i}" for i in range(9)] + [f"s1.{i}" for i in range(7)])
    assert items != [f"s{w}.{i}" for i in range(9) for w in (0, 1) if not (w == 1 and i >= 7)]
    assert assert_round_trip(make, []) == items  # the same seed gives the same order


def test_shuffle_buffer_state_is_small():
    loader = SimLoader(er.ShuffleBufferDataset(samples([40], wc=WC1, segment=5), 10))
    for _ in range(20):
        next(loader)
    node_state = loader.save().nodes[-1][0]
    assert set(node_state) == {"live", "pulled", "draws"} and node_state["draws"] == 20
    assert sum(stop - start for start, stop in node_state["live"]) == 9  # filled to 10, one given


def test_group_batch_buckets_by_key_and_flushes_in_first_seen_order():
    key = lambda s: (int(s.split(".")[1]) % 3, None)  # noqa: E731
    items = every_k(lambda: SimLoader(er.GroupBatchDataset(samples([8], wc=WC1), 2, key, tuple)))
    assert items == [("s0.0", "s0.3"), ("s0.1", "s0.4"), ("s0.2", "s0.5"), ("s0.6",), ("s0.7",)]
    sized = lambda s: (s.endswith(("0", "2", "4")), 3 if s.endswith(("0", "2", "4")) else 2)  # noqa: E731
    items = every_k(lambda: SimLoader(er.GroupBatchDataset(samples([7], wc=WC1), None, sized, tuple, drop_last=True)))
    assert items == [("s0.1", "s0.3"), ("s0.0", "s0.2", "s0.4"), ("s0.5", "s0.6")]


def test_packing_packs_buffers_and_restores_mid_buffer():
    def pre(buf):  # pairs, dropping an odd one out
        return [buf[i : i + 2] for i in range(0, len(buf) - 1, 2)]

    items = every_k(lambda: SimLoader(er.PackingDataset(samples([7, 5]), 4, pre, "|".join, sample_encoder=str.upper)))
    assert items[:3] == ["S0.0|S0.1", "S1.0|S1.1", "S0.2|S0.3"] and len(items) == 5


def test_log_sample_logs_keys_and_passes_through(caplog):
    class Keyed(str):
        @property
        def __key__(self):
            return str(self)

    inner = er.MapDataset(samples([2, 1]), Keyed)
    with caplog.at_level(logging.DEBUG, logger="energon_ray"):
        items = every_k(lambda: SimLoader(er.LogSampleDataset(inner, "train")))
    assert items == ["s0.0", "s1.0", "s0.1"]
    assert "'m': 'train', 'idx': 1, 'keys': ['s0.1']" in caplog.text


def test_gc_and_savable_dataset():
    ds = er.GcDataset(samples([2, 1]), every_n_iter=5)
    assert every_k(lambda: SimLoader(er.GcDataset(samples([2, 1])))) == ["s0.0", "s1.0", "s0.1"]
    assert isinstance(ds, er.SavableDataset) and isinstance(samples([1]), er.SavableDataset)


def test_wrappers_nest_and_restore_exactly():
    """A shuffle buffer over batches of a filtered blend, limited: every k restores."""

    def build():
        blend = er.BlendDataset((samples([9, 8], name="a"), 1), (samples([6, 7], name="b"), 1))
        kept = er.FilterDataset(blend, filter_fn=lambda s: not s.endswith("5"))
        return SimLoader(er.LimitDataset(er.ShuffleBufferDataset(er.BatchDataset(kept, 3, tuple), 3), 9))

    items = every_k(build)
    assert len(items) == 9 and all(isinstance(i, tuple) for i in items)


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="BatchDataset: batch_size must be a positive int, got 0"):
        er.BatchDataset(samples([1]), 0, tuple)
    with pytest.raises(ValueError, match="RepeatDataset: repeats must be None or a finite number > 0, got -1"):
        er.RepeatDataset(samples([1]), repeats=-1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        er.FilterDataset(samples([1]), filter_fn=bool, filtr=1)
    with pytest.raises(ValueError, match="worker_config differs"):
        er.LimitDataset(samples([1, 1]), 1, worker_config=WC1)
    with pytest.raises(ValueError, match=r"exactly one of the two must be None"):
        list(assert_round_trip(lambda: SimLoader(er.GroupBatchDataset(samples([2]), 2, lambda s: (1, 2), tuple)), []))


def test_augment_task_encoder_forwards_hooks_and_overridden_state():
    from energon_ray.task_encoder.base import is_overridden

    class Inner(er.TaskEncoder):
        def encode_sample(self, sample):
            return sample * 2

    class Aug(er.AugmentTaskEncoder):
        def batch(self, samples):
            return ("aug", super().batch(samples))

    aug = Aug(Inner())
    assert aug.encode_sample(3) == 6 and aug.batch([1])[0] == "aug" and aug.decoder is Inner.decoder
    assert is_overridden(aug, "encode_sample") and is_overridden(aug, "batch")
    assert not is_overridden(aug, "batch_group_criterion") and not is_overridden(aug, "select_samples_to_pack")


def test_wrapper_options_are_part_of_the_state_fingerprint():
    """A state saved with one wrapper configuration is refused by a loader built with another."""
    from energon_ray.loader.savable import describe

    a, b = (describe(er.ShuffleBufferDataset(samples([3, 3]), n)) for n in (4, 5))
    c, d = (describe(er.LimitDataset(er.BatchDataset(samples([3, 3]), 2, tuple, drop_last=x), 2)) for x in (True, False))
    assert a != b and c != d


def test_buffers_over_half_given_groups_restore_exactly():
    """Held items whose source is itself mid-group (an aggregating iter_map_fn under a 1 → 2 map under
    a shuffle buffer; buckets over a shuffle buffer blended with packs) restore at every k."""

    def pairs(it):
        buf = []
        for s in it:
            buf.append(s)
            if len(buf) == 2:
                yield "+".join(buf)
                buf = []

    def twice(b):
        yield b + "!"
        yield b + "?"

    items = every_k(lambda: SimLoader(er.ShuffleBufferDataset(er.MapDataset(er.IterMapDataset(samples([7, 6]), pairs), twice), 3)))
    assert sorted(items) == sorted(f"s{w}.{i}+s{w}.{i + 1}{m}" for w, n in ((0, 6), (1, 6)) for i in range(0, n, 2) for m in "!?")

    def blend():
        key = lambda s: (len(s) % 2, 2 if len(s) % 2 else 3)  # noqa: E731
        grouped = er.GroupBatchDataset(er.ShuffleBufferDataset(samples([9, 8], segment=2), 4), None, key, "/".join)
        packed = er.PackingDataset(samples([6, 5], name="p"), 3, lambda buf: [buf[:2], buf[2:]], "|".join)
        return SimLoader(er.BlendDataset((grouped, 1), (packed, 1)))

    assert len(every_k(blend)) == 13
