"""A packed sample blend starts its next chunk's packing and its next group's batching ahead of the
trainer (``blend.packed_blend``): the same batches and the same errors, at the same batch, as when
each task starts only when the trainer reaches it. At a cold start, what its first batch waits for
is made in the trainer process (the same packs and batches as Ray's)."""

from __future__ import annotations

import importlib
import os
import time
from collections import Counter

import pytest

import energon_ray as er
import energon_ray.blend.packed_blend as packed_blend
import energon_ray.blend.sample_blend as sample_blend
from energon_ray.tasks.text_packing import PackedTextBatch, TextPackingTaskEncoder
from tests.helpers import prefixed_text_dataset

ONE_WORKER = er.WorkerConfig(rank=0, world_size=1, num_workers=1)  # a batch's index is its step
_SUBMIT = sample_blend._GroupBatcher.__call__


@er.edataclass
class IndexedPackedBatch(PackedTextBatch):
    batch_index: int = -1


class Indexed(TextPackingTaskEncoder):
    def batch(self, samples):  # the loader's batch number, as Energon's hook sees it
        return IndexedPackedBatch.extend(super().batch(samples), batch_index=self.current_batch_index)


class FailsToPack(Indexed):
    """A fatal ImportError packing the chunk that holds one document."""

    def __init__(self, key: str, **kwargs):
        super().__init__(**kwargs)
        self.key = key

    def select_samples_to_pack(self, samples):
        if any(s.__key__ == self.key for s in samples):
            importlib.import_module("not_a_module_that_exists")
        return super().select_samples_to_pack(samples)


class FailsToBatch(Indexed):
    """A fatal ImportError in ``batch`` for one batch index (its group's task fails as a whole)."""

    def __init__(self, index: int, **kwargs):
        super().__init__(**kwargs)
        self.index = index

    def batch(self, samples):
        if self.current_batch_index == self.index:
            importlib.import_module("not_a_module_that_exists")
        return super().batch(samples)


@pytest.fixture
def blend_yaml(tmp_path):
    prefixed_text_dataset(tmp_path / "a", "a", 45)
    prefixed_text_dataset(tmp_path / "b", "b", 30)
    (tmp_path / "packed.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 2, path: a}\n      - {weight: 1, path: b}\n"
    )
    return tmp_path / "packed.yaml"


def _packed(yaml, encoder):
    return er.get_train_dataset(yaml, batch_size=3, shuffle_buffer_size=4, worker_config=ONE_WORKER, repeat=False,
                                packing_buffer_size=2, task_encoder=encoder, samples_per_segment=6, blend_samples=True)  # fmt: skip


def _timed_pass(loader, step_s: float, batches: list, asked: list) -> None:
    """A pass of ``loader`` with a ``step_s`` training step (tasks started ahead finish meanwhile):
    each batch and when the trainer asked for it appended (kept if the pass raises)."""
    it = iter(loader)
    while True:
        asked.append(time.perf_counter())
        batch = next(it, None)
        if batch is None:
            return
        batches.append(batch)
        time.sleep(step_s)


def _pass(yaml, encoder, monkeypatch, ahead: bool, step_s: float = 0.0):
    """One pass of a packed blend (``ahead``: ``LOOK_AHEAD``): its batches (documents, index), the
    error that ended it (or None), when the trainer asked for each batch and, per batching task,
    when it was started and its first batch's index."""
    monkeypatch.setattr(packed_blend, "LOOK_AHEAD", ahead)
    started = []

    def recorded(self, worker, groups, first_index=None, **kwargs):
        started.append((first_index, time.perf_counter()))
        return _SUBMIT(self, worker, groups, first_index, **kwargs)

    monkeypatch.setattr(sample_blend._GroupBatcher, "__call__", recorded)
    loader = er.get_loader(_packed(yaml, encoder))
    batches, asked, error = [], [], None
    try:
        _timed_pass(loader, step_s, batches, asked)
    except er.FatalSampleError as exc:
        error = str(exc)
    finally:
        loader.close()
    return [([list(docs) for docs in b.documents], b.batch_index) for b in batches], error, asked, started


def test_the_next_groups_tasks_start_before_the_trainer_reaches_them(blend_yaml, monkeypatch):
    """With a 60 ms step, every group's batching task from the third on was started before the trainer
    asked for its first batch (a worker's first group is one batch, its second starts at its second
    batch; without looking ahead none is), and the pass is the same: every document once, the batch
    indices in order."""
    batches, error, asked, started = _pass(blend_yaml, Indexed(max_length=16), monkeypatch, ahead=True, step_s=0.06)
    plain, plain_error, plain_asked, plain_started = _pass(blend_yaml, Indexed(max_length=16), monkeypatch, ahead=False)
    assert error is None and plain_error is None
    assert batches == plain and [index for _, index in batches] == list(range(len(batches))) and len(batches) >= 12
    docs = Counter(doc for packs, _ in batches for pack in packs for doc in pack)
    assert docs == Counter([f"a_{i:06d}" for i in range(45)] + [f"b_{i:06d}" for i in range(30)])
    firsts = [index for index, _ in started]
    assert firsts == [0, 1] + list(range(5, len(batches), 4)) == [index for index, _ in plain_started]
    late = [index for index, at in started if index >= 5 and at > asked[index]]
    assert late == [], (late, started, asked)
    assert all(at > plain_asked[index] for index, at in plain_started)  # (the test tells the two apart)


def test_a_packed_blends_batches_do_not_depend_on_where_its_leaves_segments_end(blend_yaml):
    """A packed blend's leaves only hand out their samples (the blend packs them): short first
    segments (by default a chunk's worth for a larger buffer, so the first batch waits for less than
    a long segment of every leaf) give the same batches as one segment length."""
    two = er.WorkerConfig(rank=0, world_size=1, num_workers=2)

    def build(segments, buffer=2):
        return er.get_train_dataset(blend_yaml, batch_size=3, shuffle_buffer_size=4, worker_config=two, repeat=False,
                                    packing_buffer_size=buffer, task_encoder=Indexed(max_length=16),
                                    samples_per_segment=segments, blend_samples=True)  # fmt: skip

    def run(segments):
        ds = build(segments)
        batches = [([list(docs) for docs in b.documents], b.batch_index) for b in er.get_loader(ds)]
        return [leaf.segment_layout.to_list() for leaf in ds.leaves()], batches

    (short, batches), (single, plain) = run((2, 8)), run(8)
    assert short == [[8, 2, 2]] * 2 and single == [[8, 0, 0]] * 2
    assert batches == plain and len(plain) >= 8
    assert [leaf.segment_layout.to_list() for leaf in build(None, buffer=256).leaves()] == [[1024, 128, 4]] * 2


@pytest.mark.parametrize("failing", ["pack", "batch"])
def test_an_error_met_ahead_comes_out_at_the_batch_it_would_without(blend_yaml, monkeypatch, failing):
    """A fatal error packing a chunk drawn ahead, or batching a group started ahead, ends the pass
    where it ends without looking ahead: the same batches handed out before it (past the first
    groups, where the look-ahead runs)."""

    def encoder():
        return FailsToPack("b_000006", max_length=16) if failing == "pack" else FailsToBatch(7, max_length=16)

    ahead = _pass(blend_yaml, encoder(), monkeypatch, ahead=True, step_s=0.03)
    plain = _pass(blend_yaml, encoder(), monkeypatch, ahead=False)
    assert "not_a_module_that_exists" in (ahead[1] or "") and "not_a_module_that_exists" in (plain[1] or "")
    assert ahead[0] == plain[0] and len(plain[0]) >= 5
    if failing == "batch":
        assert len(plain[0]) == 5  # batch 7's group (batches 5-8) fails as a whole, at its first batch


def test_with_pinning_a_groups_batches_started_ahead_are_copied_by_the_pin_thread(blend_yaml, monkeypatch):
    """On CUDA (pinning; a recording copy stands in for torch's), a 100 ms step: the batches of
    groups started ahead are copied by the pin thread before the trainer asks for them, a group's
    first too (read as soon as its task finished: from the third group on; fails if read only when
    the trainer reaches the group); the batches are those of an unpinned pass."""
    import threading

    import energon_ray.loader.pinning as pinning

    copied = {}

    def pin(batch):
        copied[str(batch.documents)] = (threading.current_thread().name, time.perf_counter())
        return batch

    monkeypatch.setattr(pinning, "pin_batch", pin)

    def second_pass(pin_it: bool):  # (a loader's first pass was set up unpinned when it was built)
        loader = er.get_loader(_packed(blend_yaml, Indexed(max_length=16)), pin_memory=False)
        batches, asked = [], []
        try:
            assert len(list(loader)) >= 12
            loader.pin = pin_it
            _timed_pass(loader, 0.1 if pin_it else 0.0, batches, asked)
        finally:
            loader.close()
        return [str(b.documents) for b in batches], asked

    plain, _ = second_pass(False)
    assert copied == {}
    batches, asked = second_pass(True)
    assert batches == plain and len(plain) >= 12 and sorted(copied) == sorted(plain)
    late = [i for i, key in enumerate(batches) if copied[key][0] != "energon_ray_pin_0" or copied[key][1] > asked[i]]
    assert set(late) <= {0, 1, 2, 3, 4}, late  # the first two groups (batches 0 and 1-4) start synchronously


class PidTagged(Indexed):
    """Each pack member's key tagged with the process that packed it (``postencode_sample`` runs
    where the chunk is packed)."""

    def postencode_sample(self, sample):
        sample.__key__ = f"{sample.__key__}@{os.getpid()}"
        return sample


def test_a_cold_packed_blend_packs_what_its_first_batch_waits_for_in_the_trainer(blend_yaml, monkeypatch):
    """At a cold start (forced: ``ENERGON_RAY_LOCAL_START=always``) the chunk the first batch waits
    for is packed in the trainer process (before: by a Ray worker still importing torch, seconds),
    later chunks by Ray; the batches are those Ray alone makes (``off``)."""

    def run(mode):
        monkeypatch.setenv("ENERGON_RAY_LOCAL_START", mode)
        loader = er.get_loader(_packed(blend_yaml, PidTagged(max_length=16)))
        try:
            return [[[doc.split("@") for doc in pack] for pack in b.documents] for b in loader]
        finally:
            loader.close()

    def untagged(batches):
        return [[[key for key, _ in pack] for pack in batch] for batch in batches]

    def packed_here(batch):
        return {int(pid) == os.getpid() for pack in batch for _, pid in pack}

    ray_only, cold = run("off"), run("always")
    assert untagged(cold) == untagged(ray_only) and len(cold) >= 12
    assert all(packed_here(b) == {False} for b in ray_only)
    assert packed_here(cold[0]) == {True} and packed_here(cold[-1]) == {False}
