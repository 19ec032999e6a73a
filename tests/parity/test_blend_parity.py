"""Metadataset blending against megatron-energon on the same YAML files."""

from __future__ import annotations

import collections
import random

import pytest

import energon_ray as er
from tests.helpers import prefixed_text_dataset

pytest.importorskip("megatron.energon")
pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("blend_parity")
    prefixed_text_dataset(root / "a", "a", 30)
    prefixed_text_dataset(root / "b", "b", 44)
    (root / "epochized.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 2, path: a}\n      - {repetitions: 1.5, path: b}\n"
    )
    (root / "blend.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - {weight: 0.7, path: a}\n      - {weight: 0.3, path: b}\n"
    )
    return root


def _energon_keys(path, batches=None, **kwargs):
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    loader = get_loader(get_train_dataset(path, worker_config=wc, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None, **kwargs))
    out = []
    for i, batch in enumerate(loader):
        if batches is not None and i >= batches:
            break
        out.extend(batch.__key__)
    return out


def _our_keys(path, batches=None, **kwargs):
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    loader = er.get_loader(er.get_train_dataset(path, worker_config=wc, batch_size=1, shuffle_buffer_size=None, max_samples_per_sequence=None, **kwargs))
    out = []
    for i, batch in enumerate(loader):
        if batches is not None and i >= batches:
            break
        out.extend(batch.__key__)
    loader.close()
    return out


def test_blend_epochized_epoch_matches_energon(root):
    """One epoch of blend_epochized (2× and 1.5×) holds exactly Energon's multiset for the whole
    repetitions and the same per-source count for the fractional part."""
    ours = collections.Counter(_our_keys(root / "epochized.yaml", repeat=False))
    theirs = collections.Counter(_energon_keys(root / "epochized.yaml", repeat=False))
    assert {k: v for k, v in ours.items() if k.startswith("a")} == {k: v for k, v in theirs.items() if k.startswith("a")}
    assert all(v == 2 for k, v in ours.items() if k.startswith("a")) and len([k for k in ours if k.startswith("a")]) == 30
    for counter in (ours, theirs):
        b = [v for k, v in counter.items() if k.startswith("b")]
        assert len(b) == 44 and sum(b) == 44 + 22 and set(b) == {1, 2}
    assert sum(ours.values()) == sum(theirs.values())


def test_repeating_blend_epochized_goes_on_past_its_first_epoch_like_energon(root):
    """A train blend_epochized (repeat=True, the default) is endless, as Energon's: 18 batches over 2
    workers of epochs of 2 a-samples x1 and 2 b-samples x2 are 3 whole epochs of each worker (was:
    6 batches, then the iteration ended)."""
    (root / "tiny_epochized.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend_epochized:\n"
        "      - {repetitions: 1, path: a, subset: {range: [0, 2]}}\n      - {repetitions: 2, path: b, subset: {range: [0, 2]}}\n"
    )
    want = {"a_000000": 3, "a_000001": 3, "b_000000": 6, "b_000001": 6}
    for keys in (_our_keys(root / "tiny_epochized.yaml", batches=18), _energon_keys(root / "tiny_epochized.yaml", batches=18)):
        assert len(keys) == 18 and dict(collections.Counter(keys)) == want


def test_blend_shares_agree_with_energon(root):
    """Over 1500 batches both libraries give source shares within ±4 points of 70/30 and of each other."""
    ours = _our_keys(root / "blend.yaml", batches=1500)
    theirs = _energon_keys(root / "blend.yaml", batches=1500)
    share = lambda keys: sum(k.startswith("a") for k in keys) / len(keys)  # noqa: E731
    assert abs(share(ours) - 0.7) <= 0.04 and abs(share(theirs) - 0.7) <= 0.04
    assert abs(share(ours) - share(theirs)) <= 0.04


@pytest.mark.parametrize("workers,segment", [(0, None), (2, None), (2, 4), (3, 8)])
def test_val_metadataset_batches_across_datasets_like_energon(root, workers, segment):
    """A validation metadataset batches its datasets as one stream per worker: a batch runs from the
    end of one dataset into the next (lengths 30 and 44 are not multiples of 4), exactly as Energon,
    with its datasets split into several segments (Ray tasks) or not."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    yaml_file = root / "val_concat.yaml"
    yaml_file.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  val:\n    blend:\n"
        "      - {weight: 1, path: a, split_part: train}\n      - {weight: 1, path: b, split_part: train}\n"
    )
    extra = {} if segment is None else {"samples_per_segment": segment}
    their_ds = get_val_dataset(yaml_file, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=4)
    our_ds = er.get_val_dataset(
        yaml_file, worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=4, **extra
    )  # fmt: skip
    theirs = [list(b.__key__) for b in get_loader(their_ds)]
    ours = [list(b.__key__) for b in er.get_loader(our_ds)]
    assert any(k[0] != b[0][0] for b in theirs for k in b)  # some batch straddles the two datasets
    assert ours == theirs
    assert len(our_ds) == len(their_ds) == len(theirs)


def _indexed_encoder(lib):
    class Indexed(lib.DefaultTaskEncoder):
        @lib.stateless(restore_seeds=True)
        def encode_sample(self, sample):
            return (sample.__key__, self.current_batch_index, self.current_sample_index, random.randint(0, 10**6))

        def batch(self, samples):
            return [tuple(s) + (self.current_batch_index,) for s in samples]

    return Indexed()


@pytest.mark.parametrize("workers", [1, 2])
def test_val_metadataset_batch_indices_count_on_across_datasets_like_energon(root, workers):
    """Across the datasets of a validation metadataset, ``current_batch_index`` (in ``encode_sample``
    and in ``batch``) and ``current_sample_index`` count on through the worker's concatenated stream,
    as Energon's, and a ``restore_seeds`` hook draws Energon's numbers: every (key, indices, draw) equal."""
    import megatron.energon as me

    yaml_file = root / "val_concat.yaml"
    yaml_file.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  val:\n    blend:\n"
        "      - {weight: 1, path: a, split_part: train}\n      - {weight: 1, path: b, split_part: train}\n"
    )

    def batches(lib, **more):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        ds = lib.get_val_dataset(yaml_file, worker_config=wc, batch_size=4, task_encoder=_indexed_encoder(lib), **more)
        return [[tuple(s) for s in batch] for batch in lib.get_loader(ds)]

    ours = batches(er, samples_per_segment=4)
    assert ours == batches(me)
    assert [b[0][4] for b in ours] == list(range(len(ours)))
    assert any(s[0].startswith("b") and s[1] > 0 for b in ours for s in b)  # b's batches count on from a's


def _batch_index_encoder(lib):
    class BatchIndex(lib.DefaultTaskEncoder):
        def batch(self, samples):
            return {"keys": [s.__key__ for s in samples], "index": self.current_batch_index}

    return BatchIndex()


def test_train_blend_batch_hook_counts_the_loaders_batches_like_energon(root):
    """In a train metadataset's blend (samples blended, then batched), ``batch`` sees the loader's
    batch number, as Energon's does; a restored loader's batches go on counting from there."""
    import megatron.energon as me

    def loader(lib, savable=False):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = lib.get_train_dataset(root / "blend.yaml", batch_size=3, worker_config=wc, task_encoder=_batch_index_encoder(lib),
                                   shuffle_buffer_size=None, max_samples_per_sequence=None)  # fmt: skip
        return (lib.get_savable_loader if savable else lib.get_loader)(ds)

    def indices(it, n):
        return [next(it)["index"] for _ in range(n)]

    assert indices(iter(loader(er)), 12) == indices(iter(loader(me)), 12) == list(range(12))
    first = loader(er, savable=True)
    it = iter(first)
    indices(it, 5)
    state = first.save_state_rank()
    rest = indices(it, 4)
    again = loader(er, savable=True)
    again.restore_state_rank(state)
    assert indices(iter(again), 4) == rest == [5, 6, 7, 8]
    first.close()
    again.close()
