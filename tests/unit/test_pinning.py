"""Pinned copies off the training thread (``loader.pinning``): who copies, when, and how many ahead.

torch pins only with CUDA; a recording copy stands in for ``pin_batch`` here."""

from __future__ import annotations

import gc
import threading

import pytest

import energon_ray.loader.pinning as pinning
from energon_ray.loader.merge import NOTHING, WorkerQueues
from energon_ray.pipeline import rows


def _pool_batches(worker, groups):
    return [f"seam{worker}"]


@pytest.fixture
def copied(monkeypatch):
    """The values copied, in the order the copies ran."""
    out = []
    monkeypatch.setattr(pinning, "pin_batch", lambda value: (out.append(value), value)[1])
    return out


def test_a_pinning_item_is_copied_by_the_caller_when_the_pin_thread_has_not_started_it(monkeypatch):
    """``Pinning.result``: a copy the pin thread is busy with (or finished) is waited for; one not
    asked for (``start``), or still queued behind other items' copies, is made by the caller, at once."""
    started, release = threading.Event(), threading.Event()

    def pin(value):
        if value == "a":
            started.set()
            release.wait(10)
        return (value, threading.current_thread().name)

    monkeypatch.setattr(pinning, "pin_batch", pin)
    me = threading.current_thread().name
    pinner = pinning.Pinner()
    try:
        busy = pinner.pinning("a")
        busy.start()
        assert started.wait(10)
        queued = pinner.pinning("b")
        queued.start()
        assert queued.result() == ("b", me)  # not waiting for "a"
        never = pinner.pinning("n")
        assert never.future is None and never.result() == ("n", me)
        assert not busy.future.done()
        release.set()
        assert busy.result() == ("a", "energon_ray_pin_0")
        done = pinner.pinning("c")
        done.start()
        done.start()  # once
        done.future.result()
        assert done.result() == ("c", "energon_ray_pin_0")
    finally:
        release.set()
        pinner.close()


def test_only_each_worker_streams_next_batch_is_copied_ahead(copied):
    """Handing out a pinned batch asks for the copy of its ``successor`` (the same worker stream's
    next batch) and of nothing else: with the blocks' first copies asked for, at most one batch per
    worker stream is copied ahead of the trainer, not a whole block."""
    pinner = pinning.Pinner()
    try:
        q = WorkerQueues(2, None, _pool_batches)
        items = {w: pinning.chained(pinner, [f"w{w}b{i}" for i in range(3)]) for w in (0, 1)}
        for w in (0, 1):
            for seq, item in enumerate(items[w]):
                q.feed((rows.ITEM, w, 0, seq, item), False)

        def asked():
            return sorted(p.value for w in (0, 1) for p in items[w] if p.asked)

        assert asked() == ["w0b0", "w1b0"]
        assert q.pop(0) == "w0b0"
        assert asked() == ["w0b0", "w0b1", "w1b0"]
        assert q.pop(1) == "w1b0" and q.pop(0) == "w0b1"
        assert asked() == ["w0b0", "w0b1", "w0b2", "w1b0", "w1b1"]
        assert [q.pop(1), q.pop(0), q.pop(1)] == ["w1b1", "w0b2", "w1b2"] and q.pop(0) is NOTHING
        assert sorted(copied) == sorted(p.value for w in (0, 1) for p in items[w])  # each copied once
    finally:
        pinner.close()


def test_a_blocks_first_batch_is_copied_when_its_streams_batch_before_is_handed_out(copied):
    """A block that arrives while its worker stream's previous batch waits for its turn is linked
    behind it (its copy asked for at that batch's hand-out, a round ahead of its own turn, not at
    arrival); one that arrives after is asked for at once. Streams are told apart by their key."""
    pinner = pinning.Pinner()
    try:
        first = pinning.chained(pinner, ["a0", "a1"], stream=(0, 0))
        other = pinning.chained(pinner, ["b0"], stream=(0, 1))
        early = pinning.chained(pinner, ["a2", "a3"], stream=(0, 0))
        assert [p.asked for p in first + other + early] == [True, False, True, False, False]
        assert first[1].successor is early[0]
        assert pinning.handed_out(first[0]) == "a0" and first[1].asked and not early[0].asked
        assert pinning.handed_out(first[1]) == "a1" and early[0].asked and not early[1].asked
        assert [pinning.handed_out(p) for p in early] == ["a2", "a3"]
        late = pinning.chained(pinner, ["a4"], stream=(0, 0))  # the stream's batches so far all handed out
        assert late[0].asked and pinning.handed_out(late[0]) == "a4"
        assert pinning.handed_out(other[0]) == "b0"
        assert sorted(copied) == ["a0", "a1", "a2", "a3", "a4", "b0"]
    finally:
        pinner.close()


def test_at_most_ahead_copies_run_ahead_and_the_rest_start_in_the_order_asked(copied):
    """The pin thread copies at most ``ahead`` batches not handed out yet; later asks wait in order
    and start as batches are handed out. A waiting batch needed first is copied by the caller (and
    skipped by the thread); one dropped unseen (a restore skips it) gives its place up."""
    pinner = pinning.Pinner(ahead=2)
    try:
        items = [pinner.pinning(f"b{i}") for i in range(6)]
        for item in items:
            item.start()
        assert [p.future is not None for p in items] == [True, True, False, False, False, False]
        assert pinning.handed_out(items[0]) == "b0"
        assert [p.future is not None for p in items[1:]] == [True, True, False, False, False]
        assert pinning.handed_out(items[3]) == "b3"  # needed before the thread got to it: copied here
        assert items[4].future is None
        items[1].result(), items[2].result()
        assert items[4].future is not None and items[5].future is not None  # b3 skipped
        dropped, items[4] = items[4], None
        dropped.future.result()
        del dropped
        gc.collect()
        extra = pinner.pinning("b6")
        extra.start()
        assert extra.future is not None  # b4's place (dropped unseen) is free again
        assert items[5].result() == "b5" and extra.result() == "b6"
        assert sorted(copied) == [f"b{i}" for i in range(7)]  # each once
        with pytest.raises(ValueError, match="ahead must be at least 1"):
            pinning.Pinner(ahead=0)
    finally:
        pinner.close()


def test_an_item_is_handed_out_as_torchs_dataloader_gives_it_and_its_numpy_tensors_pinned(monkeypatch):
    """``handed_out``: numpy arrays become tensors and tuples lists (torch's ``default_convert``, which
    Energon's loader applies); with pinning, an item that held numpy arrays is pinned again (its new
    tensors), one that held none is not copied a second time."""
    import numpy as np
    import torch

    from energon_ray.loader import handout

    pinned = []
    monkeypatch.setattr(handout, "pin_batch", lambda value: (pinned.append(value), value)[1])
    out = handout.handed_out({"a": np.arange(3), "t": (1, "x"), "b": [np.float32(2.0)]}, pin=True)
    assert list(out) == ["a", "t", "b"] and out["a"].tolist() == [0, 1, 2] and out["a"].dtype == torch.int64
    assert out["t"] == [1, "x"] and isinstance(out["b"][0], torch.Tensor) and out["b"][0].dtype == torch.float32
    assert pinned == [out]
    plain = {"a": torch.ones(2), "t": ("k",)}
    assert handout.handed_out(plain, pin=True) == {"a": plain["a"], "t": ["k"]} and pinned == [out]
    assert handout.handed_out(np.arange(2), pin=False).tolist() == [0, 1]
