"""Grouped segments: the leaves of a composition run as one-batch segments, several to a Ray task.

Consecutive segments of the plan (whatever leaf and worker stream, in the order the trainer takes
their batches) share a task and a block (``TaskStream``'s groups, ``pipeline.groups``), so the
trainer holds about the block it is taking instead of a partly taken one per leaf and worker
stream. A chained worker stream's segment (plain batches run across segments: a skipped sample
shifts every later batch) takes its carry from an earlier task or from its stream's segment before
it in the same task. The batches, their indices and saved states are those of long segments.
"""

from __future__ import annotations

import os
import random
import re

import pytest

import energon_ray as er
from energon_ray.plan.stream import SegmentLayout
from tests.helpers import kill_batch_makers, prefixed_text_dataset
from tests.integration.test_save_restore import describe, round_trip


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("grouped")
    return [prefixed_text_dataset(base / name, name, count, per_shard=7) for name, count in (("a", 45), ("b", 60), ("c", 30))]


class Skipping(er.DefaultTaskEncoder):
    """Samples 1 and 6 (mod 11) skipped, so later batches of their worker streams straddle
    segments; a seeded draw per sample and per batch, and the batch's index."""

    def encode_sample(self, sample):
        if int(sample.__key__.split("_")[-1]) % 11 in (1, 6):
            raise er.SkipSample()
        sample.text = f"{sample.text}|{random.random():.6f}"
        return sample

    def batch(self, samples):
        return {"keys": [s.__key__ for s in samples], "texts": [s.text for s in samples],
                "r": (self.current_batch_index, random.random())}  # fmt: skip


class SkippingPids(Skipping):
    """``Skipping``'s batches naming the process that made them."""

    def batch(self, samples):
        return {**super().batch(samples), "pid": os.getpid()}


def blend(roots, segments=None, workers=2, weights=(0.5, 0.3, 0.2), encoder=Skipping):
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    chosen = {} if segments is None else {"samples_per_segment": segments}
    leaves = [
        er.get_train_dataset(root, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4, worker_config=wc,
                             task_encoder=encoder(), **chosen)
        for root in roots
    ]  # fmt: skip
    return er.BlendDataset(*zip(leaves, weights))


def first(ds, count):
    loader = er.get_loader(ds)
    it = iter(loader)
    batches = [describe(next(it)) for _ in range(count)]
    stats, segments = loader.ray_stats(), loader.stats.segments_as_tasks
    loader.close()
    return batches, int(re.match(r"EnergonSegmentTasks: (\d+) segment tasks", stats).group(1)), segments


def test_a_blend_of_chained_leaves_gives_the_batches_of_long_segments_from_fewer_tasks(roots, ray_session):
    """One-batch segments (33 samples: whole batches of 3), 2 to each slot's first task (64 samples),
    then 4 (128): the same keys, draws and batch indices as 6-then-12-sample segments one a task."""
    ds = blend(roots)
    loader = er.get_loader(ds)
    assert [(leaf.segment_layout, leaf.task_samples) for leaf in ds.leaves()] == [(SegmentLayout(33), (64, 128))] * 3
    loader.close()
    grouped, tasks, segments = first(blend(roots), 60)
    plain, plain_tasks, plain_segments = first(blend(roots, segments=(6, 12)), 60)
    assert grouped == plain
    assert plain_tasks == plain_segments  # a length the user chose: one segment a task
    assert segments >= 2 * tasks and tasks >= 3
    assert len({b[2][0] for b in grouped}) > 10  # batch indices of several worker streams and leaves


def test_a_worker_streams_consecutive_segments_in_one_task_carry_on_inside_it(roots, ray_session):
    """One worker, a leaf drawn 90 % of the time: its consecutive segments share tasks, each taking
    the carry of the one before it in the task (the open batch after skipped samples)."""
    grouped, tasks, segments = first(blend(roots[:2], workers=1, weights=(0.9, 0.1)), 60)
    plain, _, _ = first(blend(roots[:2], segments=(6, 12), workers=1, weights=(0.9, 0.1)), 60)
    assert grouped == plain and segments >= 2 * tasks


def test_a_grouped_blend_restores_exactly_inside_and_between_groups(roots, ray_session):
    """States saved at batches that lie inside a task's group and at its edges restore the rest
    exactly, the carries of skipped samples rebuilt (``assert_round_trip``)."""
    items = round_trip(lambda: blend(roots), [1, 5, 14, 23], count=30)
    assert len(items) == 30


def test_a_grouped_first_block_made_in_the_loader_process_is_the_tasks_own(roots, ray_session, monkeypatch):
    """``ENERGON_RAY_LOCAL_START=always``: the first blocks (groups of chained segments from their
    streams' starts) are made in the loader's process; the batches are the tasks'."""
    monkeypatch.setenv("ENERGON_RAY_LOCAL_START", "off")
    reference, _, _ = first(blend(roots), 24)
    monkeypatch.setenv("ENERGON_RAY_LOCAL_START", "always")
    loader = er.get_loader(blend(roots))
    it = iter(loader)
    local = [describe(next(it)) for _ in range(24)]
    made_here = loader.ray_stats()
    loader.close()
    assert local == reference
    assert int(re.search(r"blocks made in this process: (\d+)", made_here).group(1)) >= 1


def test_a_sample_blend_groups_its_unchained_leaves(roots, ray_session, tmp_path):
    """A metadataset's train blend (samples blended, then batched): its leaves hand out samples from
    one-batch segments, several to a task; the batches equal those of long segments."""
    yaml = tmp_path / "blend.yaml"
    yaml.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        + "".join(f"      - weight: {w}\n        path: {root}\n" for root, w in zip(roots, (2, 1, 1)))
    )
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)

    def build(**kwargs):
        return er.get_train_dataset(yaml, batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=4, worker_config=wc,
                                    task_encoder=Skipping(), **kwargs)  # fmt: skip

    ds = build()
    assert [leaf.task_samples for leaf in ds.leaves()] == [(64, 128)] * 3
    grouped, tasks, segments = first(ds, 40)
    plain, _, _ = first(build(samples_per_segment=(8, 16)), 40)
    assert grouped == plain and segments >= 2 * tasks


def test_killed_workers_of_grouped_tasks_lose_and_repeat_nothing(roots, ray_session):
    """SIGKILL the Ray workers that made the first batches (their group tasks, some waiting for a
    carry, are lost): Ray runs them again and the batches equal an undisturbed run's."""
    reference, _, _ = first(blend(roots, encoder=SkippingPids), 40)
    loader = er.get_loader(blend(roots, encoder=SkippingPids))
    it = iter(loader)
    got, killed = kill_batch_makers(it, 2)
    assert killed
    got = [describe(b) for b in got] + [describe(next(it)) for _ in range(38)]
    loader.close()
    assert got == reference
