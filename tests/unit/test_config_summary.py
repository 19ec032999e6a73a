"""A state's summary of its configuration, and the refusals that name what differs (no Ray)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

import energon_ray as er
from energon_ray.loader.config_summary import CUT, MAX_CHARS, differences, explain, summarize
from energon_ray.loader.dataset import PlanOptions
from energon_ray.loader.savable import check_fits, describe, new_state
from energon_ray.loader.state import LoaderState, StateError, fingerprint
from energon_ray.plan.stream import SegmentLayout


class FakeLeaf:
    """What ``describe`` and ``new_state`` read of a leaf dataset, nothing else."""

    def __init__(self, batch_size=8, shards=3, split_part="train", shuffle_buffer_size=None):
        self.options = PlanOptions(training=True, repeat=True, batch_size=batch_size, shuffle_buffer_size=shuffle_buffer_size)
        names = [SimpleNamespace(name=f"shards/shard_{i:05d}.tar") for i in range(shards)]
        self.dataset = SimpleNamespace(split_part=split_part, total=10 * shards, shards=names, shard_starts=range(0, 10 * shards + 1, 10))
        self.excluded = ()
        self.subflavors = {}
        self.rotation_offset = self.rotation_base = 0
        self.worker_config = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
        self.num_workers = 1
        self.segment_layout = SegmentLayout(length=8)
        self.segment_pack_batches = False
        self.segment_packs = False
        self.segment_batches = False
        self.segment_unbatched = False
        self.pool_batches_counted = True
        self.pack_hooks_counted = True
        self.sample_hooks_counted = True
        self.task_encoder = er.DefaultTaskEncoder()

    def leaves(self):
        return [self]


class FakeBlend:
    """What ``describe`` and ``new_state`` read of a blend."""

    def __init__(self, weights, *leaves):
        self.weights = list(weights)
        self.datasets = list(leaves)
        self.worker_config = leaves[0].worker_config
        self.num_workers = 1

    def leaves(self):
        return [leaf for part in self.datasets for leaf in part.leaves()]


def test_a_leaf_is_summarized_by_readable_paths_with_its_shard_names_as_a_digest():
    summary = summarize(describe(FakeLeaf(shards=6)))
    assert summary["dataset.split_part"] == "train" and summary["dataset.total"] == 60
    assert summary["options.batch_size"] == 8 and summary["options.shuffle_buffer_size"] is None
    assert summary["rotation"] == 0 and summary["subflavors"] == {}
    assert summary["dataset.shards"].startswith("<6 items, sha1 ") and len(summary["dataset.shards"]) == 26
    assert summary["shard_counts"] == [10] * 6 and summary["excluded"] == []
    assert list(summary)[:2] == ["excluded", "rotation"]  # own values before nested ones


def test_a_leaf_of_ten_thousand_shards_keeps_the_state_small():
    leaf = FakeLeaf(shards=10_000)
    assert len(json.dumps(describe(leaf), default=str)) > 200_000
    state = new_state(leaf, 0, 0)
    assert state.config_summary["dataset.shards"].startswith("<10000 items, sha1 ")
    assert len(json.dumps(state.config_summary)) < 1200
    assert len(state.to_json()) < 1800


def test_a_large_blend_is_cut_at_max_chars_with_its_weights_kept():
    blend = FakeBlend(range(400), *[FakeLeaf() for _ in range(400)])
    summary = summarize(describe(blend))
    assert len(json.dumps(summary)) <= MAX_CHARS + 20
    assert summary["weights"].startswith("<400 items, sha1 ") and summary["type"] == "FakeBlend"
    assert summary[CUT] == len(summarize(describe(blend), max_chars=None)) - len(summary) + 1


def test_differences_name_each_path_with_both_values_changed_first():
    saved = {"weights": [1, 2], "parts[0].options.batch_size": 8, "parts[1].rotation": 0, "salt": 0}
    current = {"weights": [1, 3], "parts[0].options.batch_size": 4, "salt": 0, "limit": 1.0}
    assert differences(saved, current) == [
        "weights was [1, 2], is now [1, 3]",
        "parts[0].options.batch_size was 8, is now 4",
        "parts[1].rotation was 0, is now absent",
        "limit was absent, is now 1.0",
    ]
    assert differences(saved, current, ignore=("batch_size", "rotation")) == [
        "weights was [1, 2], is now [1, 3]",
        "limit was absent, is now 1.0",
    ]
    assert differences({"limit": 1}, {"limit": 1.0}) == ["limit was 1, is now 1.0"]  # another fingerprint
    assert differences({}, current) == []  # a state saved before summaries names nothing


def test_a_wrapper_added_or_removed_is_named_first_by_its_type():
    """A leaf's state restored under a blend of it (a wrapper added), and the reverse: the refusal
    named five of the leaf's paths as absent and hid the composition's type among "and 47 more"."""
    leaf = FakeLeaf()
    wrapped = FakeBlend([1], FakeLeaf())
    with pytest.raises(StateError) as added:
        check_fits(new_state(leaf, 0, 0), wrapped)
    assert str(added.value).startswith(
        "the state was saved for another dataset configuration: type was absent, is now 'FakeBlend'; excluded was [], is now absent;"
    )
    with pytest.raises(StateError) as removed:
        check_fits(new_state(wrapped, 0, 0), leaf)
    assert str(removed.value).startswith(
        "the state was saved for another dataset configuration: type was 'FakeBlend', is now absent; weights was [1], is now absent;"
    )
    saved = {"parts[0].type": "A", "parts[0].size": 4, "weights": [1]}
    assert differences(saved, {"parts[0].type": "B", "parts[0].size": 5, "weights": [2]})[0] == "parts[0].type was 'A', is now 'B'"


def test_differences_show_digests_bare_and_leave_out_paths_past_a_cut():
    saved = {"a.shards": "<3 items, sha1 0123456789>", "a.split_part": "train", CUT: 40}
    current = {"a.shards": "<4 items, sha1 9876543210>", "a.split_part": "val", "b.total": 5}
    assert differences(saved, current) == [
        "a.shards was <3 items, sha1 0123456789>, is now <4 items, sha1 9876543210>",
        "a.split_part was 'train', is now 'val'",
    ]


def test_explain_names_five_differences_and_counts_the_rest():
    lines = [f"p{i} was {i}, is now {i + 1}" for i in range(8)]
    assert explain(lines[:2]) == "p0 was 0, is now 1; p1 was 1, is now 2"
    assert explain(lines) == "; ".join(lines[:5]) + "; and 3 more"


def test_the_summary_round_trips_through_json_and_old_states_have_none():
    state = new_state(FakeBlend([1, 2], FakeLeaf(), FakeLeaf(batch_size=4)), 1, 0)
    assert state.config_summary["parts[1].options.batch_size"] == 4
    assert LoaderState.coerce(state.to_json()) == state and LoaderState.from_dict(state.to_dict()) == state
    old = state.to_dict()
    del old["config_summary"]
    assert LoaderState.from_dict(old).config_summary == {}


def test_a_refused_restore_names_the_options_and_weights_that_differ():
    saved = new_state(FakeBlend([1, 2], FakeLeaf(batch_size=8), FakeLeaf()), 1, 0)
    with pytest.raises(StateError) as refused:
        check_fits(saved, FakeBlend([1, 3], FakeLeaf(batch_size=4), FakeLeaf()))
    assert str(refused.value) == (
        "the state was saved for another dataset configuration: weights was [1, 2], is now [1, 3]; "
        "parts[0].options.batch_size was 8, is now 4; build the loader with the arguments it was saved with"
    )
    message = r"parts\[1\].dataset.split_part was 'train', is now 'val'; parts\[1\].dataset.total was 30, is now 40; "
    message += r"parts\[1\].dataset.shards was <3 items, sha1 \w{10}>, is now <4 items, sha1 \w{10}>; build"
    with pytest.raises(StateError, match=message):
        check_fits(saved, FakeBlend([1, 2], FakeLeaf(), FakeLeaf(shards=4, split_part="val")))


def test_an_old_state_without_a_summary_keeps_the_fingerprint_message_and_the_legacy_fingerprint_fits():
    leaf = FakeLeaf()
    old = dataclasses.replace(new_state(leaf, 1, 0), config_summary={})
    with pytest.raises(StateError, match=r"options or weights differ: fingerprint \w+ vs \w+\); build the loader"):
        check_fits(old, FakeLeaf(batch_size=4))
    legacy = dataclasses.replace(old, fingerprint=fingerprint(describe(leaf, encoders=True, layout=False)))
    check_fits(legacy, leaf)
    check_fits(dataclasses.replace(old, fingerprint=fingerprint(describe(leaf, layout=False))), leaf)  # before layouts
    check_fits(dataclasses.replace(legacy, config_summary={"options.batch_size": 99}), leaf)  # the fingerprint decides
