"""The packing hooks of a packed validation metadataset (its packing buffers run from one dataset
into the next) read Energon's indices: each hook's calls before it in the worker stream, counted on
from chunk to chunk of the blend's packing tasks (``blend.packed_blend``), as a single packed
dataset's do across its segments."""

from __future__ import annotations

import functools
import json
import re

import megatron.energon as me
import pytest

import energon_ray as er
from tests.helpers import val_metadataset
from tests.parity.test_packing_parity import _counted_encoder, _counted_view
from tests.roundtrip import assert_round_trip, json_transport

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def two_val(tmp_path_factory):
    """A validation metadataset of two datasets (18 and 13 samples)."""
    return val_metadataset(tmp_path_factory.mktemp("blend_pack_counts"), [("a", 18, 5), ("b", 13, 4)])


def _dataset(lib, path, workers, batch_size, **kwargs):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    return lib.get_val_dataset(str(path), split_part="val", worker_config=wc, batch_size=batch_size, packing_buffer_size=5,
                               task_encoder=_counted_encoder(lib), **kwargs)  # fmt: skip


def _unselected(view: list) -> list:
    """A view without what ``select_samples_to_pack`` wrote (``/s…``: it does not run again)."""
    strip = functools.partial(re.sub, r"/s[\d,]+", "")
    return [view[0], [strip(t) for t in view[1]] if isinstance(view[1], list) else strip(view[1])]


def _key(item):
    return item["__restore_key__"] if isinstance(item, dict) else item.__restore_key__


@pytest.mark.parametrize("batch_size", [3, None], ids=["batched", "unbatched"])
@pytest.mark.parametrize("workers", [0, 2])
def test_val_metadataset_packing_hooks_read_energons_indices_and_seeds(two_val, workers, batch_size):
    """``select_samples_to_pack``, ``postencode_sample`` and ``pack_selected_samples``, all
    ``restore_seeds`` and recording ``current_sample_index``, ``current_batch_index`` and a draw,
    samples skipped before packing: the same packs, indices and draws as Energon's (they read their
    first sample's position, over the datasets before, and drew our own numbers); restore_sample
    makes each batch (pack) again with them."""
    loader = er.get_savable_loader(_dataset(er, two_val, workers, batch_size, samples_per_segment=5))
    items = list(loader)
    ours = [_counted_view(item) for item in items]
    assert ours == [_counted_view(item) for item in me.get_loader(_dataset(me, two_val, workers, batch_size))]
    if workers == 0:  # the last pack: the 21st sample kept; its hooks' calls before it counted over both datasets
        last = ours[-1][1][-1] if batch_size else ours[-1][1]
        assert re.search(r"/e20,\d+,\d+/p\d+,\d+,\d+$", last), last
    for item in items:
        assert _counted_view(loader.restore_sample(_key(item))) == _unselected(_counted_view(item))
    loader.close()


class _Run:
    """A savable loader as ``assert_round_trip`` drives it."""

    def __init__(self, path):
        self.loader = er.get_savable_loader(_dataset(er, path, 2, 3, samples_per_segment=5))
        self.it = None

    def __next__(self):
        if self.it is None:
            self.it = iter(self.loader)
        return _counted_view(next(self.it))

    def save(self):
        return self.loader.save_state_rank()

    def restore(self, state):
        self.loader.restore_state_rank(state)


def test_val_metadataset_packing_counts_restore_and_older_states_read_positions(two_val):
    """Restored after any batch, the hooks count on as in the loader saved (the state holds the
    counts before the chunk its next pack comes from); a state saved before they were counted (no
    ``counts``) restores with the hooks reading positions, as it was made: the same packs."""
    runs = []

    def make():
        runs.append(_Run(two_val))
        return runs[-1]

    try:
        items = assert_round_trip(make, [0, 1, 3, "mid", -1], transport=json_transport)
    finally:
        for run in runs:
            run.loader.close()
    first = er.get_savable_loader(_dataset(er, two_val, 2, 3, samples_per_segment=5))
    it = iter(first)
    head = [_counted_view(next(it)) for _ in range(3)]
    state = json.loads(first.save_state_rank().to_json())
    first.close()
    nodes = [n for workers in state["nodes"] for n in workers if isinstance(n, dict) and "counts" in n]
    assert nodes and all(len(n["counts"]) == 4 for n in nodes)
    for node in nodes:
        del node["counts"]
    again = er.get_savable_loader(_dataset(er, two_val, 2, 3, samples_per_segment=5))
    again.restore_state_rank(state)
    rest = [_counted_view(item) for item in again]
    again.close()
    assert [view[0] for view in head + rest] == [view[0] for view in items]  # the same packs
    assert [view[1] for view in rest] != [view[1] for view in items[3:]]  # their hooks read positions
