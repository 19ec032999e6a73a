"""A state saved with batch size 4 restores into batch size 2 or 1 as megatron-energon's does: each
worker stream goes on with the samples it had not given, in batches of the new size; a larger batch
size, or one that does not divide the saved one, is refused."""

from __future__ import annotations

import copy

import pytest

import energon_ray as er
from energon_ray.loader.state import StateError
from tests.helpers import captioning_dataset, stop_abandoned_loader_workers

pytest.importorskip("megatron.energon")
pytestmark = pytest.mark.parity

SAVED_BATCH, WORKERS, K, REST = 4, 2, 3, 8


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return captioning_dataset(tmp_path_factory.mktemp("rebatch_parity") / "ds", n=50, per_shard=7)


def _loader(lib, path, train, batch_size):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=WORKERS)
    if train:
        ds = lib.get_train_dataset(path, worker_config=wc, batch_size=batch_size, shuffle_buffer_size=None, max_samples_per_sequence=None)
    else:
        ds = lib.get_val_dataset(path, split_part="train", worker_config=wc, batch_size=batch_size)
    return lib.get_savable_loader(ds)


def _take(loader, it, count):
    out = []
    for batch in it:
        out.append(list(batch.__key__))
        if len(out) == count:
            break
    return out


@pytest.fixture(scope="module")
def saved(path):
    """Per (library, train): the state after ``K`` batches of 4, and the saved loader's next ``REST`` batches."""
    import megatron.energon as me

    out = {}
    for lib in (er, me):
        for train in (False, True):
            loader = _loader(lib, path, train, SAVED_BATCH)
            it = iter(loader)
            _take(loader, it, K)
            state = loader.save_state_rank()
            out[lib.__name__, train] = (state, _take(loader, it, REST if train else 10**6))
            stop_abandoned_loader_workers()  # Energon's, left mid-pass (torch waits 5 s for each at collection)
    return out


def _restored(lib, path, train, batch_size, state):
    loader = _loader(lib, path, train, batch_size)
    loader.restore_state_rank(copy.deepcopy(state))  # Energon's scales the state it is given in place
    out = _take(loader, iter(loader), REST * SAVED_BATCH // batch_size if train else 10**6)
    stop_abandoned_loader_workers()
    return out


def _per_worker(batches, first_worker):
    """Each worker stream's samples, flattened, for endless streams (their batches alternate)."""
    streams = [[] for _ in range(WORKERS)]
    for i, keys in enumerate(batches):
        streams[(first_worker + i) % WORKERS].extend(keys)
    return streams


def _val_streams(batches):
    """Each validation worker stream's samples, flattened (worker ``w`` reads samples 25w to 25w+24)."""
    streams = [[] for _ in range(WORKERS)]
    for keys in batches:
        streams[int(keys[0][-6:]) // 25].extend(keys)
    return streams


@pytest.mark.parametrize("batch_size", [2, 1])
def test_val_state_restores_into_a_smaller_batch_size_as_energon(path, saved, batch_size):
    """Validation, saved after 3 batches of 4, restored into batches of ``batch_size``: the same keys in
    the same batches as megatron-energon's restored loader, and each worker stream's samples are the
    ones the saved loader would have given next."""
    import megatron.energon as me

    ours = _restored(er, path, False, batch_size, saved["energon_ray", False][0])
    assert ours == _restored(me, path, False, batch_size, saved["megatron.energon", False][0])
    assert all(len(keys) <= batch_size for keys in ours) and len(ours[0]) == batch_size
    assert _val_streams(ours) == _val_streams(saved["energon_ray", False][1])


@pytest.mark.parametrize("batch_size", [2, 1])
def test_train_state_restores_into_a_smaller_batch_size_as_energon(path, saved, batch_size):
    """Training (energon_ray's own shuffle), saved after 3 batches of 4 and restored into batches of
    ``batch_size``: in both libraries each worker stream goes on with exactly the samples the saved
    loader would have given next (across the epoch's end), the worker that was next first."""
    for name in ("energon_ray", "megatron.energon"):
        lib = er if name == "energon_ray" else pytest.importorskip("megatron.energon")
        state, following = saved[name, True]
        restored = _restored(lib, path, True, batch_size, state)
        assert [len(keys) for keys in restored] == [batch_size] * len(restored), name
        assert _per_worker(restored, K % WORKERS) == _per_worker(following, K % WORKERS), name


@pytest.mark.parametrize("batch_size", [8, 3])
def test_a_larger_or_not_dividing_batch_size_is_refused_as_energon(path, saved, batch_size):
    """Batch size 8 (larger) or 3 (does not divide 4): Energon raises ValueError; we raise a StateError
    naming both batch sizes."""
    import megatron.energon as me

    with pytest.raises(ValueError):
        _loader(me, path, False, batch_size).restore_state_rank(copy.deepcopy(saved["megatron.energon", False][0]))
    reason = "is larger than" if batch_size > 4 else "does not divide"
    with pytest.raises(StateError, match=f"batch_size was 4, is now {batch_size}; .*batch size {batch_size} {reason} the saved 4"):
        _loader(er, path, False, batch_size).restore_state_rank(saved["energon_ray", False][0])
