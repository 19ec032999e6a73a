"""Save/restore of every stateful driver stage, for every k, without Ray (``tests/roundtrip.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import energon_ray as er
from energon_ray.blend.compose import _Draws
from energon_ray.loader.merge import EXHAUSTED
from energon_ray.loader.round_robin import RoundRobin
from energon_ray.loader.state import STATE_VERSION, LoaderState, QueueCheckpoint, StateError, StreamState
from tests.roundtrip import SimLeaf, SimLoader, assert_round_trip, json_transport

WC2 = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
WC3 = er.WorkerConfig(rank=0, world_size=1, num_workers=3)


def every_k(make, **kwargs):
    """Round trip at every position of the pass, through JSON."""
    total = len(assert_round_trip(make, [], **kwargs))
    return assert_round_trip(make, range(total + 1), transport=json_transport, **kwargs)


class _Streams:
    """``RoundRobin`` over plain lists, with the list positions saved beside it."""

    def __init__(self, lengths, caps=None):
        self.pos = [0] * len(lengths)
        self.lengths = lengths

        def next_item(w):
            if self.pos[w] >= lengths[w]:
                return EXHAUSTED
            self.pos[w] += 1
            return f"w{w}i{self.pos[w] - 1}"

        self.rr = RoundRobin(len(lengths), next_item, caps=caps)

    def __next__(self):
        return next(self.rr)

    def save(self):
        return {"rr": self.rr.state().__dict__, "pos": list(self.pos)}

    def restore(self, state):
        from energon_ray.loader.state import RoundRobinState

        self.rr.restore(RoundRobinState(**state["rr"]))
        self.pos = list(state["pos"])


def test_round_robin_round_trip_with_uneven_streams_and_caps():
    items = every_k(lambda: _Streams([3, 1, 4], caps=[2, 5, 3]))
    assert items == ["w0i0", "w1i0", "w2i0", "w0i1", "w2i1", "w2i2"]


@pytest.mark.parametrize(
    "leaf",
    [
        dict(lengths=[11, 9], batch_size=2),  # plain batches, short last batches
        dict(lengths=[11, 9], batch_size=2, skip=[1, 6, 7, 14]),  # skips: pools straddle segments (seam batches)
        dict(lengths=[13, 10], batch_size=3, segment=6, skip=[2], drop_last=True),
        dict(lengths=[9, 7], batch_size=None),  # samples, no batching
        dict(lengths=[17, 12], batch_size=None, bucket=lambda p: (("odd",) if p % 2 else ("even", p % 4 == 0), 3), segment=5),
        dict(lengths=[0, 5, 3], batch_size=2),  # a worker without samples
    ],
    ids=["plain", "skips", "drop_last", "samples", "grouped", "empty_worker"],
)
def test_leaf_stream_round_trip(leaf):
    """A leaf's per-worker queues (items, pooled leftovers, grouping buckets, the stream's end)."""
    workers = len(leaf["lengths"])
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    items = every_k(lambda: SimLoader(SimLeaf(worker_config=wc, **leaf)))
    samples = sorted(p for item in items for p in (item if isinstance(item, tuple) else (item,)))
    assert len(samples) == len(set(samples))  # nothing repeated
    if not leaf.get("drop_last"):  # nothing lost
        assert len(samples) == sum(1 for n in leaf["lengths"] for p in range(n) if p not in leaf.get("skip", ()))


def test_grouped_buckets_keep_their_order_through_a_restore():
    """The final short batches come in the order the buckets first appeared (empty ones included)."""
    leaf = dict(lengths=[10], batch_size=None, segment=3, bucket=lambda p: ("a" if p < 2 else "b" if p % 3 else "c", 4))
    items = every_k(lambda: SimLoader(SimLeaf(worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=1), **leaf)))
    assert items == [("s0.2", "s0.4", "s0.5", "s0.7"), ("s0.0", "s0.1"), ("s0.8",), ("s0.3", "s0.6", "s0.9")]


def test_blend_round_trip():
    blend = lambda: er.BlendDataset(  # noqa: E731
        (SimLeaf([9, 8], name="a", worker_config=WC2), 0.7), (SimLeaf([6, 7], name="b", skip=[3], worker_config=WC2), 0.3)
    )
    items = every_k(lambda: SimLoader(blend()))
    assert {i[0][0] for i in items} == {"a", "b"}


def test_concat_and_mix_round_trip():
    every_k(lambda: SimLoader(er.ConcatDataset(SimLeaf([5, 4], name="a", worker_config=WC2), SimLeaf([3, 6], name="b", worker_config=WC2))))
    mix = lambda: er.MixBatchDataset(  # noqa: E731
        (SimLeaf([9, 8], name="a", batch_size=None, worker_config=WC2), 1.0),
        (SimLeaf([7, 9], name="b", batch_size=None, worker_config=WC2), 2.0),
        batch_size=3,
        batch_mix_fn=tuple,
    )
    items = every_k(lambda: SimLoader(mix()))
    assert all(len(i) == 3 for i in items[:-2])


def test_map_with_a_generator_round_trip_mid_expansion():
    """A 1 → n ``map_fn``: a save between its outputs restores to the rest of that expansion."""

    def explode(batch):
        for sample in batch:
            yield sample + "!"

    def build():
        inner = er.BlendDataset((SimLeaf([7, 6], name="a", batch_size=3, worker_config=WC2), 1), (SimLeaf([5, 5], name="b", batch_size=2, worker_config=WC2), 1))
        return SimLoader(er.MapDataset(inner, explode))

    items = every_k(build)
    assert len(items) == 23 and all(i.endswith("!") for i in items)


def test_nested_blend_of_concat_with_three_workers():
    def build():
        concat = er.ConcatDataset(SimLeaf([4, 3, 2], name="c", worker_config=WC3), SimLeaf([2, 2, 5], name="d", skip=[1], worker_config=WC3))
        return SimLoader(er.BlendDataset((concat, 2), (SimLeaf([8, 6, 7], name="e", worker_config=WC3), 1)))

    every_k(build)


def test_draws_skip_to_continues_the_same_sequence():
    ref = _Draws(1234, 2, 0)
    seq = [ref.next() for _ in range(3000)]
    for k in (0, 1, 1023, 1024, 1025, 2048, 2999):
        d = _Draws(1234, 2, 0)
        d.skip_to(k)
        assert [d.next() for _ in range(3000 - k)] == seq[k:]
        assert d.count == 3000


def _state(**kwargs):
    cp = QueueCheckpoint(event="feed", segment=3, pools=[(("k", 1), 2, [(0, 5, 0)])], held=[], waiting=False, done=False)
    base = dict(version=STATE_VERSION, rank=0, world_size=1, num_workers=1, fingerprint="f", passes=2, pass_index=1,
                streams=[[StreamState(cp, 1)]], nodes=[[{"draws": 3, "alive": [True, False]}]])  # fmt: skip
    base.update(kwargs)
    return LoaderState(**base)


def test_state_json_round_trip_and_size():
    state = _state()
    text = state.to_json()
    assert LoaderState.coerce(text) == state and LoaderState.coerce(json.loads(text)) == state
    assert LoaderState.coerce(state) is state
    assert len(text) < 745  # (a tiny state; every field named)


def test_state_errors_are_clear():
    with pytest.raises(StateError, match="version 99 is not supported"):
        LoaderState.from_dict({**_state().to_dict(), "version": 99})
    with pytest.raises(StateError, match="not an energon_ray loader state"):
        LoaderState.coerce({"passes": 1})
    # garbage or a cut-off save: a StateError naming it, not json's own error
    text = _state().to_json()
    for bad in ("checkpoint.pt", text[: len(text) // 2], text.encode()[:10] + b"\xff"):
        with pytest.raises(StateError, match="not a loader state: the text is not JSON"):
            LoaderState.coerce(bad)
    cp = QueueCheckpoint(event="feed", segment=0, pools=[(object(), 2, [])], held=[], waiting=False, done=False)
    with pytest.raises(StateError, match="bucket keys of batch_group_criterion must be"):
        _state(streams=[[StreamState(cp, 0)]]).to_json()


def test_a_cut_off_or_edited_state_dict_is_refused_naming_the_field():
    """A state dict without ``streams`` (its pass would restart) or with a field of the wrong type or
    shape is a StateError naming that field, not a silent restart or a KeyError/TypeError."""
    full = _state().to_dict()
    for name in ("streams", "pass_index", "round_robin", "rank"):
        cut = {k: v for k, v in full.items() if k != name}
        with pytest.raises(StateError, match=rf"not a complete loader state: it has no \['{name}'\]"):
            LoaderState.coerce(cut)
    with pytest.raises(StateError, match=r"field 'rank' must be int, got '0'"):
        LoaderState.coerce({**full, "rank": "0"})
    with pytest.raises(StateError, match=r"field 'streams' is malformed \(KeyError: 'checkpoint'\)"):
        LoaderState.coerce({**full, "streams": [[{"consumed": 1}]]})
    with pytest.raises(StateError, match=r"field 'round_robin' is malformed \(TypeError"):
        LoaderState.coerce({**full, "round_robin": {"next": 1}})


def test_numpy_seeded_draw_count_matches_pcg_advance():
    """``skip_to`` relies on PCG64 taking one 64-bit output per double; check it directly."""
    a = np.random.default_rng([1, 2, 3])
    a.random(4096)
    b = np.random.default_rng([1, 2, 3])
    b.bit_generator.advance(4096)
    assert a.random(5).tolist() == b.random(5).tolist()
