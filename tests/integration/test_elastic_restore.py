"""Restoring on another world size or worker count: the epoch goes on, nothing lost, nothing repeated.

The states of every old rank go into ``restore_state_global`` (or a folder of rank files into
``restore_loader_state``); each new rank gets its share of what the old streams had not yet given.
Counted by sample key over the old ranks' batches before the save and the new ranks' batches after.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch
from click.testing import CliRunner

import energon_ray as er
from energon_ray.cli.main import main as cli_main
from energon_ray.tasks.text_packing import TextPackingTaskEncoder, lognormal_corpus
from energon_ray.format.jsonl import prepare_jsonl
from tests.helpers import keys_of, prefixed_text_dataset


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("elastic")
    return {
        "a": prefixed_text_dataset(base / "a", "a", 45, per_shard=8),
        "b": prefixed_text_dataset(base / "b", "b", 30, per_shard=7),
        "base": base,
    }


class Grouped(er.DefaultTaskEncoder):
    """Buckets by key parity, so the trainer side pools samples across segments."""

    def batch_group_criterion(self, sample):
        return int(sample.__key__.split("_")[-1]) % 2, None


def wc(rank, world, workers):
    return er.WorkerConfig(rank=rank, world_size=world, num_workers=workers)


def train(path, config, batch_size, **kwargs):
    return er.get_train_dataset(
        path, worker_config=config, batch_size=batch_size, shuffle_buffer_size=10, max_samples_per_sequence=5,
        **kwargs,
    )  # fmt: skip


def flat(batches):
    return [key for keys in keys_of(batches) for key in keys]


def take(loader, count):
    """``count`` items from a live iteration (kept in ``loader._test_iter``: an abandoned finite
    iteration ends its pass, and a state saved then starts the next one)."""
    if getattr(loader, "_test_iter", None) is None:
        loader._test_iter = iter(loader)
    return [next(loader._test_iter) for _ in range(count)]


def all_keys(prefix, n):
    return Counter(f"{prefix}_{i:06d}" for i in range(n))


@pytest.mark.parametrize("segments", [None, (4, 8)])
def test_two_ranks_to_one_rank_finishes_the_epoch_exactly_once(roots, segments):
    """2 ranks x 2 workers (batch 4) saved mid-epoch, restored on 1 rank x 3 workers (batch 8): the
    pass gives exactly the samples the old ranks had not; the next pass is a whole epoch again.
    ``(4, 8)``: the states stand in the longer segments after each stream's short first one."""
    more = {} if segments is None else {"samples_per_segment": segments}
    old = [er.get_savable_loader(train(roots["a"], wc(r, 2, 2), 4, repeat=False, **more)) for r in range(2)]
    seen = flat(take(old[0], 3)) + flat(take(old[1], 3))
    states = [json.loads(loader.save_state_rank().to_json()) for loader in old]
    for loader in old:
        loader.close()
    assert len(seen) == 24

    new = er.get_savable_loader(train(roots["a"], wc(0, 1, 3), 8, repeat=False, **more))
    new.restore_state_global(states)
    rest = list(new)
    assert all(len(b.__key__) == 8 for b in rest[:-3])  # full batches except each stream's last
    assert Counter(seen + flat(rest)) == all_keys("a", 45)
    assert Counter(flat(new)) == all_keys("a", 45)  # the next pass: a whole epoch, new sharding


def test_a_rank_that_had_finished_its_pass_counts_as_at_its_end(roots):
    """``repeat=False``, 2 ranks x 1 worker: rank 1 had given all its batches (its state is saved
    between passes) while rank 0 was mid-pass; on 1 rank x 2 workers the pass gives exactly rank 0's
    rest (it was refused: "states are from different passes"). States of really different passes
    are refused naming them."""
    old = [er.get_savable_loader(train(roots["a"], wc(r, 2, 1), 4, repeat=False)) for r in range(2)]
    done = flat(list(old[1]))
    seen = flat(take(old[0], 2))
    states = [json.loads(loader.save_state_rank().to_json()) for loader in old]
    assert [(s["passes"], s["pass_index"]) for s in states] == [(1, 0), (1, None)]
    new = er.get_savable_loader(train(roots["a"], wc(0, 1, 2), 4, repeat=False))
    new.restore_state_global(states)
    rest = flat(new)
    assert len(done) == 22 and len(seen) == 8 and Counter(done + seen + rest) == all_keys("a", 45)
    assert Counter(flat(new)) == all_keys("a", 45)  # the next pass: a whole epoch
    new.close()
    take(old[1], 1)  # rank 1 now in its second pass, rank 0 still in its first
    later = [loader.save_state_rank().to_json() for loader in old]
    for loader in old:
        loader.close()
    again = er.get_savable_loader(train(roots["a"], wc(0, 1, 2), 4, repeat=False))
    with pytest.raises(er.StateError, match=re.escape("states are from different passes (passes started, pass in progress: [(1, 0), (2, 1)]")):
        again.restore_state_global(later)
    again.close()


def test_a_validation_rank_that_had_finished_its_second_pass_counts_as_at_its_end(roots):
    """As above for validation loaders (every pass has index 0): in the second pass, rank 1 had
    finished and rank 0 had given 2 batches; on 1 rank x 2 workers the pass gives rank 0's rest."""

    def val(config):
        return er.get_savable_loader(er.get_val_dataset(roots["a"], split_part="train", worker_config=config, batch_size=4))

    old = [val(wc(r, 2, 1)) for r in range(2)]
    for loader in old:
        assert len(flat(loader)) in (22, 23)
    done = flat(list(old[1]))
    seen = flat(take(old[0], 2))
    states = [loader.save_state_rank().to_json() for loader in old]
    for loader in old:
        loader.close()
    assert [(json.loads(s)["passes"], json.loads(s)["pass_index"]) for s in states] == [(2, 0), (2, None)]
    new = val(wc(0, 1, 2))
    new.restore_state_global(states)
    assert Counter(done + seen + flat(new)) == all_keys("a", 45)
    new.close()


def test_a_validation_pass_after_the_redistributed_one_is_whole_again(roots):
    """A validation loader's passes all have index 0: after the restored pass (the rest of the one
    saved by 2 ranks x 2 workers, on 1 rank x 3 workers, batch 3) the next pass gave that rest again
    (37 of 45 samples) instead of the whole split; it gives every sample once. So after restoring
    into a smaller batch size (same world size)."""

    def val(config, batch_size):
        return er.get_savable_loader(er.get_val_dataset(roots["a"], split_part="train", worker_config=config, batch_size=batch_size))

    old = [val(wc(r, 2, 2), 2) for r in range(2)]
    seen = flat(take(old[0], 2)) + flat(take(old[1], 2))
    states = [loader.save_state_rank().to_json() for loader in old]
    for loader in old:
        loader.close()
    new = val(wc(0, 1, 3), 3)
    new.restore_state_global(states)
    assert Counter(seen + flat(new)) == all_keys("a", 45)
    assert Counter(flat(new)) == all_keys("a", 45)
    new.close()
    fresh = val(wc(0, 2, 2), 2)
    rank0 = Counter(flat(fresh))
    fresh.close()
    smaller = val(wc(0, 2, 2), 1)
    smaller.restore_state_rank(states[0])
    assert Counter(flat(smaller)) == rank0 - Counter(seen[:4])
    assert Counter(flat(smaller)) == rank0
    smaller.close()


def test_one_rank_to_two_ranks_blend_with_grouped_batches(roots):
    """A blend with grouped batching (samples pooled across segments) moves from 1 rank x 2 workers
    to 2 ranks x 1 worker: each source's samples all come exactly once over both new ranks."""

    def blend(config, batch):
        return er.BlendDataset(
            (train(roots["a"], config, batch, repeat=False, task_encoder=Grouped()), 0.6),
            (train(roots["b"], config, batch, repeat=False, task_encoder=Grouped()), 0.4),
        )

    old = er.get_savable_loader(blend(wc(0, 1, 2), 4))
    seen = flat(take(old, 7))
    state = old.save_state_rank()
    old.close()
    new = [er.get_savable_loader(blend(wc(r, 2, 1), 2)) for r in range(2)]
    rest = []
    for loader in new:
        loader.restore_state_global([state.to_json()])
        rest += flat(loader)
    assert Counter(seen + rest) == all_keys("a", 45) + all_keys("b", 30)


def test_sample_blend_moves_to_another_world_size(roots, tmp_path):
    """A train metadataset blended sample by sample (blend_samples=True: batches mix the datasets, made
    in groups by Ray actors), saved by 2 ranks x 2 workers inside a group, restored on 1 rank x 3
    workers: every sample of both datasets comes exactly once over the old and the new batches."""
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - {{weight: 2, path: {roots['a']}}}\n      - {{weight: 1, path: {roots['b']}}}\n"
    )

    def blend(config, batch):
        return train(mix, config, batch, repeat=False, blend_samples=True)

    old = [er.get_savable_loader(blend(wc(r, 2, 2), 4)) for r in range(2)]
    # 5 batches per rank, its workers in turn: each worker's first group (one batch), then 2 and 1 of
    # the next groups' 4 batches
    before = [take(loader, 5) for loader in old]
    states = [json.loads(loader.save_state_rank().to_json()) for loader in old]
    for loader in old:
        loader.close()
    seen = flat(before[0] + before[1])
    assert len(seen) == 40 and any(len({k[0] for k in b.__key__}) == 2 for b in before[0] + before[1])
    # the batches given of each rank's current group are named in its state (the leaves' states are
    # from before that group)
    consumed = [n.get("consumed") for s in states for per_worker in s["nodes"] for n in per_worker if isinstance(n, dict)]
    assert sorted(len(c) for c in consumed if c) == [4, 4, 8, 8]

    new = er.get_savable_loader(blend(wc(0, 1, 3), 8))
    new.restore_state_global(states)
    rest = list(new)
    assert Counter(seen + flat(rest)) == all_keys("a", 45) + all_keys("b", 30)
    assert Counter(flat(new)) == all_keys("a", 45) + all_keys("b", 30)  # the next pass: both datasets once


def test_a_redistributed_pass_saves_and_restores_exactly(roots, tmp_path):
    """During the redistributed pass a state is as exact as any: a fresh loader restored from it gives
    the same batches; restore_loader_state reads every rank's file of a folder."""
    old = [er.get_savable_loader(train(roots["a"], wc(r, 2, 2), 2, repeat=False)) for r in range(2)]
    seen = flat(take(old[0], 4)) + flat(take(old[1], 4))
    for loader in old:
        er.save_loader_state(loader, str(tmp_path))
        loader.close()
    first = er.get_savable_loader(train(roots["a"], wc(0, 1, 2), 4, repeat=False))
    assert er.restore_loader_state(first, str(tmp_path)) is True
    middle = flat(take(first, 2))
    state = first.save_state_rank().to_json()
    assert len(state) < 16 * 1024
    rest = list(first._test_iter)
    again = er.get_savable_loader(train(roots["a"], wc(0, 1, 2), 4, repeat=False))
    again.restore_state_rank(state)
    assert keys_of(list(again)) == keys_of(rest)
    assert Counter(seen + middle + flat(rest)) == all_keys("a", 45)


def test_endless_stream_gives_the_rest_of_the_epoch_first(roots):
    """repeat=True, samples (no batching), 1 rank x 2 workers → 1 rank x 1 worker: the first items
    after the restore are exactly the epoch's unseen samples, then whole epochs follow."""
    old = er.get_savable_loader(train(roots["b"], wc(0, 1, 2), None))
    seen = [s.__key__ for s in take(old, 11)]
    state = old.save_state_rank()
    old.close()
    new = er.get_savable_loader(train(roots["b"], wc(0, 1, 1), None))
    new.restore_state_global([state])
    after = [s.__key__ for s in take(new, 30 - 11 + 30)]
    new.close()
    assert Counter(seen + after[:19]) == all_keys("b", 30)
    assert Counter(after[19:]) == all_keys("b", 30)


def test_endless_stream_saved_just_after_an_epoch_boundary_repeats_nothing(roots):
    """repeat=True, 1 rank x 2 workers (15 samples each per epoch) saved after 37 items: each old
    stream had begun its second epoch inside the segment its checkpoint names. Restored on 1 rank x 1
    worker, the next 23 items complete the second epoch: every sample twice, none a third time (the
    second epoch's given samples were given again, others not at all)."""
    old = er.get_savable_loader(train(roots["b"], wc(0, 1, 2), None))
    seen = [s.__key__ for s in take(old, 37)]
    state = old.save_state_rank()
    old.close()
    new = er.get_savable_loader(train(roots["b"], wc(0, 1, 1), None))
    new.restore_state_global([state])
    after = [s.__key__ for s in take(new, 60 - 37 + 30)]
    new.close()
    assert Counter(seen + after[:23]) == all_keys("b", 30) + all_keys("b", 30)
    assert Counter(after[23:]) == all_keys("b", 30)


def two_ranks_after_one_batch(make):
    """The states of ranks 0 and 1 of 2 (one worker each) saved after one batch: ``make(config)`` a loader."""
    loaders = [make(wc(r, 2, 1)) for r in range(2)]
    for loader in loaders:
        take(loader, 1)
    states = [loader.save_state_rank() for loader in loaders]
    for loader in loaders:
        loader.close()
    return states


def test_what_cannot_move_says_so(roots, tmp_path):
    """A single rank's state into another world size, a missing rank, and packed datasets: StateError."""
    states = two_ranks_after_one_batch(lambda config: er.get_savable_loader(train(roots["a"], config, 4, repeat=False)))
    new = er.get_savable_loader(train(roots["a"], wc(0, 1, 2), 4, repeat=False))
    with pytest.raises(er.StateError, match="restore_state_global"):
        new.restore_state_rank(states[0])
    with pytest.raises(er.StateError, match="states of all 2 ranks"):
        new.restore_state_global([states[1]])
    # the global batch size kept (8 on one rank): only the option that changes the order is named
    other = er.get_savable_loader(train(roots["a"], wc(0, 1, 2), 8, repeat=False, shuffle_over_epochs_multiplier=2))
    named = "options.shuffle_over_epochs was 1, is now 2"
    with pytest.raises(er.StateError, match=f"another dataset or sample order: {named}; only the world size, worker count"):
        other.restore_state_global(states)
    new.close()
    other.close()

    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"text": d}) for d in lognormal_corpus(40, mean_words=20, seed=3)) + "\n")
    prepare_jsonl(docs, progress=False)

    def packed(config):
        te = TextPackingTaskEncoder(max_length=64)
        return er.get_savable_loader(
            er.get_train_dataset(docs, worker_config=config, batch_size=2, packing_buffer_size=8, task_encoder=te, repeat=False)
        )

    packed_states = two_ranks_after_one_batch(packed)
    with pytest.raises(er.StateError, match="packs samples"):
        packed(wc(0, 1, 1)).restore_state_global(packed_states)

    # a validation metadataset batched across its datasets: that reason, not its batch index offsets
    mix = tmp_path / "val_mix.yaml"
    mix.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  val:\n    blend:\n"
                   f"      - path: {roots['a']}\n        split_part: train\n      - path: {roots['b']}\n        split_part: train\n")

    def val(config):
        return er.get_savable_loader(er.get_val_dataset(mix, split_part="val", worker_config=config, batch_size=4))

    val_states = two_ranks_after_one_batch(val)
    with pytest.raises(er.StateError, match="it batches across the datasets of a validation metadataset; restore with the world size"):
        val(wc(0, 1, 1)).restore_state_global(val_states)


def test_another_seed_offset_is_refused_by_name(roots, tmp_path):
    """The seed decides every stream's order, so a state's positions name other samples under another
    WorkerConfig.seed_offset (10 of the rest were lost and 10 given twice): refused by name, on
    another world size and on the same one, as are the states of two runs of different seeds (by
    ``energon-ray checkpoint redist`` too). A
    state without the field (saved before it was recorded) still restores."""

    def run(config, batch):
        return er.get_savable_loader(train(roots["a"], config, batch, repeat=False))

    old = [run(er.WorkerConfig(rank=r, world_size=2, num_workers=2, seed_offset=s), 4) for r in range(2) for s in (0, 1)]
    for loader in old:
        take(loader, 1)
    states = [loader.save_state_rank() for loader in old]  # rank 0 seed 0, rank 0 seed 1, rank 1 seed 0, rank 1 seed 1
    for loader in old:
        loader.close()
    saved, other_run = [states[0], states[2]], [states[0], states[3]]
    message = "the state was saved with WorkerConfig seed_offset=0, this loader has seed_offset=5; the seed decides the sample order"
    elastic = run(er.WorkerConfig(rank=0, world_size=1, num_workers=3, seed_offset=5), 8)
    with pytest.raises(er.StateError, match=message):
        elastic.restore_state_global(saved)
    with pytest.raises(er.StateError, match=r"runs of different seeds \(WorkerConfig seed_offset \[0, 1\]\)"):
        elastic.restore_state_global(other_run)
    for state, name in zip(other_run, ("energon_ray_loader_rank0.json", "energon_ray_loader_rank1.json")):
        (tmp_path / name).write_text(state.to_json())
    refused = CliRunner().invoke(cli_main, ["checkpoint", "redist", str(tmp_path), str(tmp_path / "out.json"), "--new-world-size", "1"])
    assert refused.exit_code == 1 and refused.output == (
        f"Error: {tmp_path}: the ranks' states are from runs of different seeds (WorkerConfig seed_offset [0, 1]); "
        "pass the states every rank of one run saved at the same step\n"
    )
    elastic.close()
    same = run(er.WorkerConfig(rank=1, world_size=2, num_workers=2, seed_offset=5), 4)
    with pytest.raises(er.StateError, match=message):
        same.restore_state_global(saved)
    same.close()
    unrecorded = []
    for state in saved:
        data = state.to_dict()
        del data["seed_offset"]
        unrecorded.append(data)
    fine = run(er.WorkerConfig(rank=0, world_size=1, num_workers=3), 8)
    fine.restore_state_global(unrecorded)
    assert sum(len(keys) for keys in keys_of(fine)) == 45 - 8  # a batch of 4 given by each old rank
    fine.close()


def test_endless_restore_on_a_rank_without_samples_is_refused(roots, tmp_path):
    """A 3-sample dataset (repeat=True) saved by 1 rank after one sample, restored on 4 ranks: rank 3
    holds no sample and gets none of the rest; it raises as a fresh loader of that rank does, rather
    than ending at once while the other ranks go on. Ranks 0 to 2 take over the rest and repeat."""
    tiny = prefixed_text_dataset(tmp_path / "c", "c", 3, per_shard=3)
    old = er.get_savable_loader(train(tiny, wc(0, 1, 1), None))
    seen = [s.__key__ for s in take(old, 1)]
    state = old.save_state_rank()
    old.close()
    firsts = []
    for rank in range(3):
        loader = er.get_savable_loader(train(tiny, wc(rank, 4, 1), None))
        loader.restore_state_global([state])
        got = [s.__key__ for s in take(loader, 3)]
        loader.close()
        firsts.append(got[0])
        assert set(got[1:]) == {f"c_{rank:06d}"}  # its own sample, repeated
    assert Counter(seen + firsts[:2]) == all_keys("c", 3)  # the rest of the epoch: ranks 0 and 1
    last = er.get_savable_loader(train(tiny, wc(3, 4, 1), None))
    last.restore_state_global([state])
    with pytest.raises(er.DatasetConfigError, match=r"rank 3 of world size 4 \(1 workers\) holds no sample of"):
        iter(last)
    last.close()


def test_wrappers_move_unless_they_hold_items(roots, tmp_path):
    """A BatchDataset wrapper (nothing held between its groups) moves from 2 ranks x 2 workers to 1 x 3,
    every sample once; a ShuffleBufferDataset under it holds pulled samples, so its state is refused
    by name instead of repeating them (by ``energon-ray checkpoint redist`` too)."""

    def keyed(samples):
        return [s.__key__ for s in samples]

    def wrapped(config, shuffle):
        inner = train(roots["b"], config, None, repeat=False)
        if shuffle:
            inner = er.ShuffleBufferDataset(inner, size=6, worker_config=config)
        return er.get_savable_loader(er.BatchDataset(inner, batch_size=4, batcher=keyed, worker_config=config))

    for shuffle in (False, True):
        old = [wrapped(wc(r, 2, 2), shuffle) for r in range(2)]
        seen = [key for loader in old for batch in take(loader, 3) for key in batch]
        states = [loader.save_state_rank() for loader in old]
        for loader in old:
            loader.close()
        new = wrapped(wc(0, 1, 3), shuffle)
        if shuffle:
            with pytest.raises(er.StateError, match=r"while a wrapper held items.*ShuffleBufferDataset"):
                new.restore_state_global(states)
            listed = tmp_path / "held.json"
            listed.write_text(json.dumps([s.to_dict() for s in states]))
            refused = CliRunner().invoke(cli_main, ["checkpoint", "redist", str(listed), str(tmp_path / "out"), "--new-world-size", "1"])
            assert refused.exit_code == 1 and re.fullmatch(
                rf"Error: {re.escape(str(listed))}: restoring on world size 1: rank 0's worker stream \d was saved while a "
                r"wrapper held items it had pulled \(a ShuffleBufferDataset .*\n", refused.output, re.S
            )
            assert not (tmp_path / "out").exists()
            new.close()
            continue
        new.restore_state_global(states)
        rest = [key for batch in new for key in batch]
        assert len(seen) == 24 and Counter(seen + rest) == all_keys("b", 30)


def test_a_limited_pass_or_a_counted_repeat_is_refused_by_name(roots):
    """A LimitDataset of 20 per rank saved after 9 items on 1 rank x 2 workers gave 20 more on
    1 rank x 3 workers (29 in one limited pass; its counters started again): such a state is refused
    naming LimitDataset (the same configuration restores it exactly). A RepeatDataset with
    ``repeats`` is refused naming RepeatDataset (it was called a blend_epochized part)."""

    def val(config):
        return er.get_val_dataset(roots["b"], split_part="train", batch_size=None, worker_config=config)

    def limited(config):
        return er.get_savable_loader(er.LimitDataset(val(config), 20, worker_config=config))

    old = limited(wc(0, 1, 2))
    seen = [s.__key__ for s in take(old, 9)]
    state = json.loads(old.save_state_rank().to_json())
    rest = [s.__key__ for s in old._test_iter]
    old.close()
    assert len(seen + rest) == 20 and json.loads(json.dumps(state))["nodes"][0][0] == {"limited": 5}
    new = limited(wc(0, 1, 3))
    with pytest.raises(er.StateError, match=r"worker stream 0 was saved after a LimitDataset had counted 5 of its items"):
        new.restore_state_global([state])
    # the same configuration restores the state exactly (and an older state's bare counts too)
    same = limited(wc(0, 1, 2))
    same.restore_state_rank(state)
    assert [s.__key__ for s in same] == rest
    state["nodes"][0] = [5, 4]
    same.restore_state_rank(state)
    assert [s.__key__ for s in same] == rest
    same.close()
    new.close()

    def repeated(config):
        return er.get_savable_loader(er.RepeatDataset(val(config), repeats=2, worker_config=config))

    old = repeated(wc(0, 1, 2))
    take(old, 3)
    states = [old.save_state_rank()]
    old.close()
    new = repeated(wc(0, 1, 3))
    with pytest.raises(er.StateError, match=r"repeats its epochs a set number of times \(a RepeatDataset with repeats"):
        new.restore_state_global(states)
    new.close()



def test_checkpoint_commands_describe_and_hand_on_states_for_another_world_size(roots, tmp_path):
    """``energon-ray checkpoint info`` on the folder 2 ranks x 2 workers saved into names each rank's
    worker streams; ``redist --new-world-size 1`` checks the set and writes it as a global file and as
    a folder, from which a 1-rank x 3-worker loader gives the batches ``restore_state_global`` gives;
    one rank's file alone is refused."""
    saved, folder, single = tmp_path / "saved", tmp_path / "redist", tmp_path / "global.json"
    saved.mkdir()
    old = [er.get_savable_loader(train(roots["a"], wc(r, 2, 2), 4, repeat=False)) for r in range(2)]
    for loader in old:
        take(loader, 3)
        er.save_loader_state(loader, str(saved))
    states = [loader.save_state_rank().to_dict() for loader in old]
    for loader in old:
        loader.close()

    info = CliRunner().invoke(cli_main, ["checkpoint", "info", str(saved)])
    streams = [
        "  dataset 0 worker 0: segment 0 from position 0 (feed), items given since 2, samples pooled 0",
        "  dataset 0 worker 1: segment 0 from position 0 (feed), items given since 1, samples pooled 0",
    ]
    assert info.exit_code == 0 and info.output.splitlines() == [
        "checkpoint: per-rank files (2 files)",
        "ranks: 2 (world size 2)",
        "workers per rank: 2",
        "batch size: 4",
        "state version: 2",
        "seed offset: 0",
        f"fingerprint: {states[0]['fingerprint']}",
        f"order fingerprint: {states[0]['order_fingerprint']}",
        "task encoders: DefaultTaskEncoder",
        "datasets (a state names no paths; rank 0's summary):",
        "  dataset.split_part: train",
        "  dataset.total: 45",
        f"  dataset.shards: {states[0]['config_summary']['dataset.shards']}",
        "rank 0 (energon_ray_loader_rank0.json): pass 0 (passes started 1), next worker 1, "
        "items per worker [2, 1]",
        *streams,
        "rank 1 (energon_ray_loader_rank1.json): pass 0 (passes started 1), next worker 1, "
        "items per worker [2, 1]",
        *streams,
    ]

    for out, written, how in [
        (single, f"a global file of 2 states: {single}", "restore_state_global(json.load(open(OUT)))"),
        (folder, f"2 rank files to {folder}", "restore_loader_state(loader, OUT)"),
    ]:
        result = CliRunner().invoke(
            cli_main, ["checkpoint", "redist", str(saved), str(out), "--new-world-size", "1", "--new-num-workers", "3"]
        )
        assert result.exit_code == 0 and result.output.splitlines() == [
            "read 2 states (per-rank): world size 2, 2 workers per rank, pass 0",
            "new shape: world size 1, 3 workers per rank",
            f"wrote {written}",
            f"each new rank: {how}; the restore checks the dataset (sample order, no packing or counted repeats) and "
            "computes its share",
        ]
    assert json.loads(single.read_text()) == states
    same = CliRunner().invoke(cli_main, ["checkpoint", "redist", str(single), str(tmp_path / "same"), "--new-world-size", "2"])
    assert same.exit_code == 0 and same.output.splitlines()[:3] == [
        "read 2 states (global): world size 2, 2 workers per rank, pass 0",
        "new shape: world size 2, 2 workers per rank",
        "same shape as saved: each rank restores its own state exactly",
    ]
    asked = CliRunner().invoke(cli_main, ["checkpoint", "redist", str(single), str(tmp_path / "asked")], input="1\n")
    assert asked.exit_code == 0 and asked.output.splitlines()[:5] == [  # no --new-world-size: asked, as Energon's
        "Current DP world size: 2",
        "Current number of workers per DP rank: 2",
        "Please enter the new DP world size: 1",
        "read 2 states (global): world size 2, 2 workers per rank, pass 0",
        "new shape: world size 1, 2 workers per rank",
    ]
    torch.save(states, tmp_path / "states.pt")  # to_dict() values: read with torch.load(weights_only=True)
    for path in (single, tmp_path / "states.pt"):
        again = CliRunner().invoke(cli_main, ["checkpoint", "info", str(path)]).output.splitlines()
        assert again[:13] == ["checkpoint: global file (2 entries)"] + info.output.splitlines()[1:13]
        assert again[13:] == [line.replace("energon_ray_loader_rank0.json", f"{path.name}[0]").replace(
            "energon_ray_loader_rank1.json", f"{path.name}[1]") for line in info.output.splitlines()[13:]]

    expected = er.get_savable_loader(train(roots["a"], wc(0, 1, 3), 8, repeat=False))
    expected.restore_state_global(states)
    from_file = er.get_savable_loader(train(roots["a"], wc(0, 1, 3), 8, repeat=False))
    from_file.restore_state_global(json.loads(single.read_text()))
    from_folder = er.get_savable_loader(train(roots["a"], wc(0, 1, 3), 8, repeat=False))
    assert er.restore_loader_state(from_folder, str(folder)) is True
    want = keys_of(list(expected))
    assert [len(b) for b in want] == [7, 7, 7] and keys_of(list(from_file)) == want and keys_of(list(from_folder)) == want

    lone = CliRunner().invoke(
        cli_main, ["checkpoint", "redist", str(saved / "energon_ray_loader_rank1.json"), str(tmp_path / "x.json"), "--new-world-size", "1"]
    )
    assert lone.exit_code == 1 and lone.output == (
        f"Error: {saved / 'energon_ray_loader_rank1.json'}: restoring on another world size needs the states of all 2 "
        "ranks of one run (ranks 0..1, one each); got ranks [1] of world sizes [2]\n"
    )
    assert not (tmp_path / "x.json").exists()
