"""Packing and grouping stages on hand-built samples (no Ray)."""

from __future__ import annotations

import pytest

from energon_ray import DefaultTaskEncoder, TextSample
from energon_ray.errors import FatalSampleError, SkipSample, log_exception
from energon_ray.pipeline.grouping import Grouper, bucket_size
from energon_ray.pipeline.packing import Packer
from energon_ray.tasks.text_packing import first_fit_decreasing


def _items(n):
    return [(i, 0, TextSample(__key__=f"s{i}", text=str(i))) for i in range(n)]


class Pairs(DefaultTaskEncoder):
    """Packs consecutive pairs and leaves out the last sample of each full buffer."""

    def select_samples_to_pack(self, samples):
        keep = samples[:-1] if len(samples) == 5 else samples
        return [keep[i : i + 2] for i in range(0, len(keep), 2)]

    def pack_selected_samples(self, samples):
        return "+".join(s.__key__ for s in samples)


def test_packer_follows_energons_buffer_semantics():
    """Buffer 5: select on full buffers, emit one pack per refill, drop unselected, flush the partial buffer."""
    packer = Packer(Pairs(), 5, log_exception)
    runs = packer.new_runs()
    packs = [p for _, _, p in packer(_items(12), seed=1, runs=runs)]
    assert packs == ["s0+s1", "s2+s3", "s5+s6", "s7+s8", "s10+s11"]


def test_packer_postencode_runs_on_members_only():
    """postencode_sample runs only on the members of emitted packs."""
    seen = []

    class Post(Pairs):
        def postencode_sample(self, sample):
            seen.append(sample.__key__)
            return sample

    packer = Packer(Post(), 5, log_exception)
    packer(_items(5), seed=1, runs=packer.new_runs())
    assert seen == ["s0", "s1", "s2", "s3"]


def test_grouper_keys_each_sample_in_stream_order():
    """A segment only keys its samples (bucket, bucket size), in order; ignored samples drop out."""

    class ByParity(DefaultTaskEncoder):
        def batch_group_criterion(self, sample):
            if sample.text == "3":
                raise SkipSample()
            return int(sample.text) % 2, None

    grouper = Grouper(ByParity(), 2, log_exception)
    run = grouper.new_run()
    keyed = grouper(_items(5), run)
    assert [(key, size, [e[2].__key__ for e in items]) for key, size, items in keyed] == [
        (0, 2, ["s0"]), (1, 2, ["s1"]), (0, 2, ["s2"]), (0, 2, ["s4"]),
    ]  # fmt: skip
    assert run.ignored == 1


def test_an_unhashable_bucket_key_is_a_fatal_error_naming_sample_and_key():
    """A criterion returning a list as its bucket key fails naming the sample, the key and its type
    (not a bare TypeError from the segment task)."""

    class ListKey(DefaultTaskEncoder):
        def batch_group_criterion(self, sample):
            return [len(sample.text)], None

    grouper = Grouper(ListKey(), 2, log_exception)
    with pytest.raises(FatalSampleError, match=r"sample 's0': batch_group_criterion returned bucket key \[1\] \(list\), which is not hashable"):
        grouper(_items(2), grouper.new_run())


def test_grouping_messages_name_a_dict_samples_key():
    """A dict sample (encode_sample returning a dict) is named by its ``__key__``, not '?'."""

    class NoTuple(DefaultTaskEncoder):
        def batch_group_criterion(self, sample):
            return sample["__key__"]

    grouper = Grouper(NoTuple(), 2, log_exception)
    items = [(i, 0, {"__key__": f"d{i}", "text": str(i)}) for i in range(2)]
    with pytest.raises(FatalSampleError, match=r"^sample 'd0': batch_group_criterion must return \(key, batch_size or None\), got 'd0'$"):
        grouper(items, grouper.new_run())


def test_bucket_size_rules():
    """Exactly one of the criterion's size and batch_size must be set."""
    assert bucket_size("k", None, 4, "x") == 4 and bucket_size("k", 3, None, "x") == 3
    with pytest.raises(FatalSampleError, match="batch size 3 for bucket 'k'"):
        bucket_size("k", 3, 4, "x")
    with pytest.raises(FatalSampleError, match="no valid batch size"):
        bucket_size("k", None, None, "x")


def test_first_fit_decreasing_fills_bins():
    """FFD places every item once and never exceeds the capacity."""
    lengths = [7, 3, 9, 1, 5, 5, 2, 8]
    bins = first_fit_decreasing(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(8))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins) and len(bins) == 4  # sum 40: optimal
