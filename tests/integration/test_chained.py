"""A generator ``encode_sample`` batches its worker stream's outputs as one stream, as Energon's does.

Its segments are chained (``StageConfig.chained``): each Ray task gets the outputs its worker stream
had before it and the samples of the batch still open, so batches run across segment boundaries and
every output reads the index of the batch it goes into (``current_batch_index``), whatever the
segment length; save/restore rebuilds the open batch from the segments before the save point, and
``restore_sample`` rebuilds a batch from its outputs' keys.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter

import pytest

import energon_ray as er
from energon_ray.pipeline.chained import chains_outputs, counts_outputs
from tests.helpers import batch_key, kill_batch_makers, prefixed_text_dataset
from tests.integration.test_save_restore import round_trip


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return prefixed_text_dataset(tmp_path_factory.mktemp("chained") / "a", "a", 38, per_shard=6)


class Varying(er.DefaultTaskEncoder):
    """0, 1, 2 or 3 outputs per sample (by its index), each recording where it was made."""

    @er.stateless(restore_seeds=True)
    def encode_sample(self, sample):
        index = int(sample.__key__.split("_")[-1])
        for sub in range(index % 4):
            text = f"{sample.__key__}/{sub} b{self.current_batch_index} s{self.current_sample_index} r{random.randint(0, 999)}"
            yield er.TextSample.derive_from(sample, text=text)

    def batch(self, samples):
        # the round-trip helper compares keys, texts and "r"
        return {"keys": [s.__key__ for s in samples], "texts": [s.text for s in samples], "r": self.current_batch_index}


def texts(loader):
    return [(tuple(b["texts"]), b["r"]) for b in loader]


def build(root, segment, workers=1, **kwargs):
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    return er.get_val_dataset(root, split_part="train", batch_size=3, worker_config=wc, task_encoder=Varying(),
                              samples_per_segment=segment, **kwargs)  # fmt: skip


def test_which_streams_chain_and_which_count_outputs():
    class Plain(er.DefaultTaskEncoder):
        def encode_sample(self, sample):
            return sample

    class SeededBatch(Plain):  # Energon seeds it from its batch count (skipped samples lower it)
        @er.stateless(restore_seeds=True)
        def batch(self, samples):
            return samples

    class SeededEncodeBatch(Plain):
        @er.stateless(restore_seeds=True)
        def encode_batch(self, batch):
            return batch

    assert chains_outputs(SeededBatch(), 3, False, False)
    assert chains_outputs(er.AugmentTaskEncoder(SeededEncodeBatch()), 3, False, False)
    # packing: always chained (buffers run across segments), not across datasets or for old states
    assert chains_outputs(SeededBatch(), 3, True, False) and chains_outputs(Plain(), None, True, False)
    assert not chains_outputs(Plain(), 3, True, True) and not chains_outputs(Plain(), 3, True, False, chain_packs=False)

    assert chains_outputs(Varying(), 3, False, False)
    assert chains_outputs(er.AugmentTaskEncoder(er.AugmentTaskEncoder(Varying())), 3, False, False)
    # plain batches too (a skipped sample shifts every batch after it), unless segments batch their own
    assert chains_outputs(Plain(), 3, False, False) and chains_outputs(er.AugmentTaskEncoder(Plain()), 3, False, False)
    assert not chains_outputs(er.AugmentTaskEncoder(Plain()), 3, False, False, chain_batches=False)
    assert not chains_outputs(Plain(), 3, False, False, chain_batches=False)
    assert chains_outputs(Varying(), 3, False, False, chain_batches=False)
    assert chains_outputs(SeededBatch(), 3, False, False, chain_batches=False)
    assert not chains_outputs(Plain(), 3, False, True)  # across datasets: the trainer's pool batches
    # unbatched: a generator's stream (its hooks count the outputs given), unless a state saved before says not
    assert chains_outputs(Varying(), None, False, False) and not chains_outputs(Plain(), None, False, False)
    assert not chains_outputs(Varying(), None, False, False, chain_unbatched=False)
    assert not chains_outputs(Varying(), None, False, True)  # across datasets: not chained
    assert chains_outputs(Varying(), 3, True, False)

    class Postencoded(Plain):  # postencode_sample runs on each output as it is encoded: chained as the rest
        def postencode_sample(self, sample):
            return sample

    assert chains_outputs(Postencoded(), 3, False, False) and not chains_outputs(Postencoded(), 3, False, False, chain_batches=False)
    # only generators and restore_seeds batch hooks count outputs while encoding (their keys name them)
    assert counts_outputs(Varying()) and counts_outputs(SeededBatch()) and counts_outputs(SeededEncodeBatch())
    assert not counts_outputs(Plain()) and not counts_outputs(er.AugmentTaskEncoder(Plain()))


def test_batches_run_across_segments_with_energons_batch_index(root, ray_session):
    """One worker: the outputs in stream order, cut every 3, each reading its own batch's index."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    plain = er.get_val_dataset(root, split_part="train", batch_size=1, worker_config=wc)
    order = [int(b.__key__[0].split("_")[-1]) for b in er.get_loader(plain)]
    outputs = [(f"a_{i:06d}/{sub}", i) for i in order for sub in range(i % 4)]
    for segment in (3, 6, 1000):
        got = texts(er.get_loader(build(root, segment)))
        flat = [text for batch, _ in got for text in batch]
        assert [t.split(" ")[0] for t in flat] == [name for name, _ in outputs], segment
        assert [len(batch) for batch, _ in got] == [3] * (len(outputs) // 3) + [len(outputs) % 3] * (len(outputs) % 3 > 0), segment
        for n, (batch, index) in enumerate(got):
            assert index == n, (segment, n)
            assert all(t.split(" ")[1] == f"b{n}" for t in batch), (segment, batch)
        assert [int(t.split(" ")[2][1:]) for t in flat] == [i for _, i in outputs]


def test_segment_length_does_not_change_the_batches(root, ray_session):
    """Two workers, segments of 3 and 6 samples and one per stream: the same batches, hook draws
    included; batch_drop_last drops each stream's short last batch only."""
    whole = texts(er.get_loader(build(root, 1000, workers=2)))
    assert any(len(b[0]) < 3 for b in whole)  # a stream ends with a short batch
    assert texts(er.get_loader(build(root, 3, workers=2))) == whole
    assert texts(er.get_loader(build(root, 6, workers=2))) == whole
    dropped = texts(er.get_loader(build(root, 3, workers=2, batch_drop_last=True)))
    assert dropped == [b for b in whole if len(b[0]) == 3]


def test_restore_sample_rebuilds_each_batch(root, ray_session):
    """Every batch, rebuilt from its restore key alone (outputs' keys name their sub and stream index):
    the same outputs, hook draws and batch indices, also where a batch spans segments."""

    class DefaultBatches(Varying):
        def batch(self, samples):
            return er.DefaultTaskEncoder.batch(self, samples)

    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    ds = er.get_val_dataset(root, split_part="train", batch_size=3, worker_config=wc, task_encoder=DefaultBatches(),
                            samples_per_segment=3)  # fmt: skip
    loader = er.get_savable_loader(ds)
    batches = list(loader)
    assert all(len(key) == 8 for batch in batches for key in batch_key(batch)[1])
    for batch in batches:
        again = loader.restore_sample(batch.__restore_key__)
        assert (again.text, again.__key__, again.__restore_key__) == (batch.text, batch.__key__, batch.__restore_key__)
    with pytest.raises(er.StateError, match="which output of a sample each holds"):
        loader.restore_sample(tuple(key[:6] for key in batch_key(batches[0])[1]))
    loader.close()


def test_executor_ray_data_runs_chained_segments_as_tasks(root, ray_session, caplog):
    whole = texts(er.get_loader(build(root, 1000)))
    with caplog.at_level("WARNING", logger="energon_ray"):
        assert texts(er.get_loader(build(root, 3), executor="ray_data")) == whole
    assert "cannot chain segments (packing buffers, a generator encode_sample or a restore_seeds batch hook of" in caplog.text


@pytest.mark.parametrize("workers", [1, 2])
def test_save_restore_rebuilds_the_open_batch(root, ray_session, workers):
    """States taken where a batch is open across segments (and where one spans several short
    segments) restore exactly, through JSON, and again after the restore."""

    def make():
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        return er.get_train_dataset(root, batch_size=3, worker_config=wc, task_encoder=Varying(), shuffle_buffer_size=5,
                                    max_samples_per_sequence=4, samples_per_segment=3)  # fmt: skip

    round_trip(make, [0, 1, 2, 4, 5, 7, 11], count=16)


class VaryingPids(Varying):
    def batch(self, samples):
        return {"keys": [s.__key__ for s in samples], "texts": [s.text for s in samples], "r": self.current_batch_index, "pid": os.getpid()}


def test_killed_ray_workers_break_no_chain(root, ray_session):
    """SIGKILL the Ray workers that made the first batches: Ray re-runs the lost tasks (carries
    included) and the batches equal an undisturbed run's."""

    def build():
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
        return er.get_val_dataset(root, split_part="train", batch_size=3, worker_config=wc, task_encoder=VaryingPids(),
                                  samples_per_segment=3)  # fmt: skip

    reference = texts(er.get_loader(build()))
    it = iter(er.get_loader(build()))
    got, killed = kill_batch_makers(it, 3)
    assert killed
    got += list(it)
    assert [(tuple(b["texts"]), b["r"]) for b in got] == reference


@pytest.mark.parametrize("segment,taken", [(3, 4), (1000, 1)])
def test_another_world_size_loses_no_output(root, ray_session, segment, taken):
    """2 ranks x 2 workers saved mid-epoch, restored on 1 rank x 3 workers: every output comes,
    and only the outputs of a sample whose outputs straddled a save point come twice (lossless,
    not exact: the new streams batch and count afresh); the redistributed pass restores exactly.
    One segment per stream and one batch taken: a state at the stream's first segment."""

    def train(rank, world, workers):
        wc = er.WorkerConfig(rank=rank, world_size=world, num_workers=workers)
        return er.get_train_dataset(root, batch_size=3, worker_config=wc, task_encoder=Varying(), shuffle_buffer_size=5,
                                    max_samples_per_sequence=4, samples_per_segment=segment, repeat=False)  # fmt: skip

    def outputs(batches):
        return [text.split(" ")[0] for batch, _ in batches for text in batch]

    old = [er.get_savable_loader(train(r, 2, 2)) for r in range(2)]
    its = [iter(loader) for loader in old]
    seen = [(tuple(b["texts"]), b["r"]) for it in its for b in [next(it) for _ in range(taken)]]
    states = [json.loads(loader.save_state_rank().to_json()) for loader in old]
    for loader in old:
        loader.close()
    new = er.get_savable_loader(train(0, 1, 3))
    new.restore_state_global(states)
    it = iter(new)
    middle = [next(it) for _ in range(2)]
    state = new.save_state_rank().to_json()
    rest = [(tuple(b["texts"]), b["r"]) for b in it]
    again = er.get_savable_loader(train(0, 1, 3))
    again.restore_state_rank(state)
    assert texts(again) == rest
    got = Counter(outputs(seen) + outputs([(tuple(b["texts"]), b["r"]) for b in middle]) + outputs(rest))
    expected = Counter(f"a_{i:06d}/{sub}" for i in range(38) for sub in range(i % 4))
    assert set(got) == set(expected)
    twice = {name.split("/")[0] for name, n in got.items() if n > 1}
    assert all(n <= 2 for n in got.values()) and len(twice) <= 4  # at most one straddling sample per old stream


@pytest.mark.parametrize("mode", ["always", "off"])
def test_cold_start_first_block_made_here(root, ray_session, monkeypatch, mode):
    """``ENERGON_RAY_LOCAL_START``: a chained stream's first block made in the trainer (``always``)
    or by Ray (``off``): the same batches; every later batch is made in a Ray worker."""
    monkeypatch.setenv("ENERGON_RAY_LOCAL_START", mode)

    def build():
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
        return er.get_val_dataset(root, split_part="train", batch_size=3, worker_config=wc, task_encoder=VaryingPids(),
                                  samples_per_segment=6)  # fmt: skip

    got = list(er.get_loader(build()))
    monkeypatch.setenv("ENERGON_RAY_LOCAL_START", "off")
    assert [(tuple(b["texts"]), b["r"]) for b in got] == texts(er.get_loader(build()))
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    order = [int(b.__key__[0].split("_")[-1]) for b in er.get_loader(er.get_val_dataset(root, split_part="train", batch_size=1, worker_config=wc))]
    local = sum(i % 4 for i in order[:6]) // 3 if mode == "always" else 0  # the full batches of the first 6 samples
    assert [b["pid"] == os.getpid() for b in got] == [True] * local + [False] * (len(got) - local)
    assert mode == "off" or local >= 1


class Failing(Varying):
    """Fails on the samples whose index ends in 7, after one output (kept, as Energon's lazy map
    gives it before the failure)."""

    @er.stateless(restore_seeds=True)
    def encode_sample(self, sample):
        if int(sample.__key__.split("_")[-1]) % 10 == 7:
            yield er.TextSample.derive_from(sample, text=f"{sample.__key__}/kept b{self.current_batch_index}")
            raise ValueError(f"cannot encode {sample.__key__}")
        yield from Varying.encode_sample(self, sample)


def test_failed_samples_keep_their_outputs_and_the_chain_runs_on(root, ray_session):
    """The error policy counts a sample that fails after one output and keeps that output; the
    stream's batches and indices run on over it, the same for any segment length."""

    def build(segment):
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
        return er.get_val_dataset(root, split_part="train", batch_size=3, worker_config=wc, task_encoder=Failing(),
                                  samples_per_segment=segment)  # fmt: skip

    whole = texts(er.get_loader(build(1000)))
    assert texts(er.get_loader(build(3))) == whole
    names = [t.split(" ")[0] for batch, _ in whole for t in batch]
    expected = {f"a_{i:06d}/{sub}" for i in range(38) for sub in range(i % 4) if i % 10 != 7}
    expected |= {f"a_{i:06d}/kept" for i in (7, 17, 27, 37)}
    assert sorted(names) == sorted(expected)
    assert all(t.split(" ")[1] == f"b{r}" for batch, r in whole for t in batch)  # each output knew its batch


class Rendezvous(er.DefaultTaskEncoder):
    """Packs of two. The worker stream's sample at position 3 waits up to 30 s for a later sample to
    be encoded and says whether one was: only another segment can get there meanwhile (its own
    segment waits on it), so a packed stream's segments must encode side by side, packing alone
    waiting for the previous segment's open buffer."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def encode_sample(self, sample):
        marker = os.path.join(self.folder, "later")
        if self.current_sample_index > 3:
            open(marker, "w").close()
        if self.current_sample_index == 3:
            deadline = time.monotonic() + 30
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.02)
            return er.TextSample.derive_from(sample, text=f"met={os.path.exists(marker)}")
        return sample

    def select_samples_to_pack(self, samples):
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]

    def pack_selected_samples(self, samples):
        return er.TextSample(__key__="+".join(s.__key__ for s in samples), __restore_key__=(), text="|".join(s.text for s in samples))


def test_packed_segments_encode_before_the_previous_one_ends(root, ray_session, tmp_path):
    ds = er.get_val_dataset(root, split_part="train", batch_size=2, packing_buffer_size=4, task_encoder=Rendezvous(str(tmp_path)),
                            worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=1), samples_per_segment=4)  # fmt: skip
    started = time.monotonic()
    texts = [text for batch in er.get_loader(ds) for text in batch.text]
    assert len(texts) == 19 and "met=True" in texts[1].split("|")
    assert time.monotonic() - started < 25


def test_plain_batched_segments_encode_before_the_previous_one_ends(root, ray_session, tmp_path):
    """Plain batches are chained too (a skipped sample shifts the batches after it), yet a segment
    is encoded while the one before it still runs: ``Rendezvous``'s sample 3 meets a later one."""
    ds = er.get_val_dataset(root, split_part="train", batch_size=2, task_encoder=Rendezvous(str(tmp_path)),
                            worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=1), samples_per_segment=4)  # fmt: skip
    started = time.monotonic()
    batches = [batch.text for batch in er.get_loader(ds)]
    assert len(batches) == 19 and batches[1][1] == "met=True"
    assert time.monotonic() - started < 25


class PackedPids(er.DefaultTaskEncoder):
    """Packs of two (of each buffer of 4); a batch names its packs and the process that batched it."""

    def select_samples_to_pack(self, samples):
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]

    def pack_selected_samples(self, samples):
        return er.TextSample(__key__="+".join(s.__key__ for s in samples), __restore_key__=(), text="|".join(s.text for s in samples))

    def batch(self, samples):
        return {"texts": [s.text for s in samples], "pid": os.getpid()}


class SkippingPids(PackedPids):
    """Plain batches of 2, samples 1, 5 and 6 skipped (every later batch straddles segments)."""

    def encode_sample(self, sample):
        if int(sample.__key__.split("_")[-1]) in (1, 5, 6):
            raise er.SkipSample()
        return sample


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "plain"])
def test_killed_ray_workers_break_no_packed_or_plain_chain(root, ray_session, packed):
    """SIGKILL the Ray workers that batched the first packs, or plain batches after skipped samples
    (samples 1, 5, 6), whose segment tasks may be waiting there for their carry: the lost tasks run
    again and the batches equal an undisturbed run's (the plain ones Energon's)."""

    def build():
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
        chain = {"packing_buffer_size": 4, "task_encoder": PackedPids()} if packed else {"task_encoder": SkippingPids()}
        return er.get_val_dataset(root, split_part="train", batch_size=2, worker_config=wc, samples_per_segment=3, **chain)

    reference = [b["texts"] for b in er.get_loader(build())]
    it = iter(er.get_loader(build()))
    got, killed = kill_batch_makers(it, 2)
    assert killed
    got += list(it)
    assert [b["texts"] for b in got] == reference and len(reference) == (10 if packed else 18)
    if not packed:
        stream0 = [str(i) for i in range(19) if i not in (1, 5, 6)]  # worker 0's 19 samples, 16 kept
        assert [t for b in reference[0::2][:8] for t in b] == stream0



class _Gate:
    """A flag one Ray task opens and another waits for (a Ray actor in the tests below)."""

    def __init__(self):
        self.opened = False

    def open(self):
        self.opened = True

    def is_open(self):
        return self.opened

def test_a_later_carry_is_looked_at_and_waited_for_through_its_future(ray_session):
    """A chained segment's task looks for its carry and waits for it without ``ray.wait``/``ray.get``
    (which would have Ray lend its CPU to a new worker process): ``ready()`` is false until the segment
    before has handed it on, ``wait()`` gives it, and an error of that segment is raised as
    ``ray.get`` raises it."""
    import ray

    from energon_ray.pipeline.build import LaterCarry

    Gate = ray.remote(num_cpus=0)(_Gate)

    @ray.remote(num_cpus=0, max_retries=0)
    def before(gate, value, fail):
        while not ray.get(gate.is_open.remote()):
            time.sleep(0.01)
        if fail:
            raise ValueError(f"segment {value} failed")
        return value

    @ray.remote(num_cpus=0, max_retries=0)
    def after(box, gate):
        later = LaterCarry(box[0])
        looks = [later.ready()]
        ray.get(gate.open.remote())
        carry = later.wait()
        return looks + [later.ready()], carry

    gate = Gate.remote()
    looks, carry = ray.get(after.remote([before.remote(gate, {"outputs": 3, "tail": [1, 2]}, False)], gate))
    assert looks == [False, True] and carry == {"outputs": 3, "tail": [1, 2]}
    gate = Gate.remote()
    with pytest.raises(ValueError, match="segment 7 failed"):
        ray.get(after.remote([before.remote(gate, 7, True)], gate))


def test_a_chained_task_keeps_its_cpus_while_it_waits_for_its_carry(ray_session):
    """While a chained segment's task waits for its carry, Ray does not lend its CPUs to another task
    (which would start another worker process, its own torch import): a task asking for a CPU of the
    2-CPU Ray starts only once the waiting task, holding both, has ended."""
    import ray

    from energon_ray.pipeline.build import LaterCarry

    Gate = ray.remote(num_cpus=0)(_Gate)

    @ray.remote(num_cpus=0, max_retries=0)
    def before(gate):
        while not ray.get(gate.is_open.remote()):
            time.sleep(0.01)
        return "carry"

    @ray.remote(num_cpus=2, max_retries=0)
    def waiting(box, started):
        started.open.remote()
        carry = LaterCarry(box[0]).wait(hold=60.0)
        return carry, time.time()

    @ray.remote(num_cpus=1, max_retries=0)
    def other():
        return time.time()

    gate, started = Gate.remote(), Gate.remote()
    waiter = waiting.remote([before.remote(gate)], started)
    while not ray.get(started.is_open.remote()):
        time.sleep(0.01)
    second = other.remote()
    ran_meanwhile, _ = ray.wait([second], timeout=1.0)
    gate.open.remote()
    (carry, ended), began = ray.get(waiter), ray.get(second)
    assert carry == "carry" and not ran_meanwhile and began >= ended
