"""Sample hooks that read indices which skipped samples shift get Energon's.

Energon counts ``encode_sample``'s ``current_batch_index`` as the batches its worker gave before,
and ``postencode_sample``'s indices (and a ``restore_seeds`` seed) from the outputs of
``encode_sample`` before it, so a ``SkipSample`` lowers them for every later sample of the worker
stream. Ours read the sample's position until such hooks chained their streams
(``chained.reads_shifted_indices``).
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

import energon_ray as er
from energon_ray.pipeline.chained import chains_outputs, reads_shifted_indices
from tests.helpers import text_dataset
from tests.integration.test_save_restore import round_trip

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return text_dataset(tmp_path_factory.mktemp("shifted") / "text", [5, 7, 3, 9, 6])  # 30 samples, 4 skipped


def _encoder(lib, reads: str):
    """Skips each sample whose number is 3 modulo 7; records what ``reads`` names: ``encode``
    (``encode_sample``'s batch index, through a helper method), ``seeded`` (a ``restore_seeds``
    ``postencode_sample``'s draw) or ``post`` (``postencode_sample``'s indices, read in a lambda)."""

    class Encoder(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            if int(sample.text) % 7 == 3:
                raise lib.SkipSample()
            seen = self._batch_seen() if "encode" in reads else None
            return {"key": sample.__key__, "encode": seen, "post": None, "__restore_key__": sample.__restore_key__}

        def _batch_seen(self):
            return self.current_batch_index

        if "seeded" in reads:

            @lib.stateless(restore_seeds=True)
            def postencode_sample(self, sample):
                return {**sample, "post": random.randint(0, 10**6)}

        elif "post" in reads:

            def postencode_sample(self, sample):
                read = lambda: [self.current_batch_index, self.current_sample_index]  # noqa: E731
                return {**sample, "post": read()}

        def batch(self, samples):
            return {"keys": [s["key"] for s in samples], "texts": [(s["encode"], s["post"]) for s in samples],
                    "r": random.random(), "__restore_key__": ()}  # fmt: skip

    return Encoder()


def _dataset(lib, path, reads, batch_size, workers, **kwargs):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    te = _encoder(lib, reads)
    return lib.get_val_dataset(str(path), split_part="train", batch_size=batch_size, task_encoder=te, worker_config=wc, **kwargs)


def _view(item) -> list:
    if "keys" in item:
        return [item["keys"], [list(t) if isinstance(t, tuple) else t for t in item["texts"]]]
    return [item["key"], item["encode"], item["post"]]


@pytest.mark.parametrize(
    "reads,batch_size,workers",
    [("encode", 2, 2), ("seeded", 2, 1), ("post", 2, 2), ("encode seeded", None, 2), ("encode post", None, 1)],
)
def test_sample_hooks_reading_shifted_indices_match_energon(path, reads, batch_size, workers):
    """Batches of 2 (or unbatched) over segments of 3 samples, 4 of 30 samples skipped: every
    output's recorded indices and draws are Energon's, and ``restore_sample`` makes each item again
    as it was."""
    import megatron.energon as me

    loader = er.get_savable_loader(_dataset(er, path, reads, batch_size, workers, samples_per_segment=3))
    ours = [dict(item) for item in loader]
    theirs = [dict(item) for item in me.get_loader(_dataset(me, path, reads, batch_size, workers))]
    assert [_view(item) for item in ours] == [_view(item) for item in theirs]
    assert sum(len(item["keys"]) if batch_size else 1 for item in ours) == 26  # 4 of 30 skipped
    for item in ours:
        assert _view(loader.restore_sample(item["__restore_key__"])) == _view(item)
    loader.close()


def _cooking_encoder(lib):
    """``cook_crude_sample`` records the batch index; ``encode_sample`` skips every fifth sample."""

    @lib.stateless
    def cook(sample):
        return lib.TextSample(**lib.basic_sample_keys(sample), text=sample["txt"])

    class Encoder(lib.DefaultTaskEncoder):
        cookers = [lib.Cooker(cook)]

        def cook_crude_sample(self, sample, cooker, aux):
            cooked = super().cook_crude_sample(sample, cooker, aux)
            cooked.text += f"|c{self.current_batch_index}"
            return cooked

        def encode_sample(self, sample):
            if int(sample.__key__.split("_")[-1]) % 5 == 2:
                raise lib.SkipSample()
            return sample

        def batch(self, samples):
            return {"keys": [s.__key__ for s in samples], "texts": [s.text for s in samples], "__restore_key__": ()}

    return Encoder()


def test_cook_crude_sample_reading_the_batch_index_matches_energon_after_skips(tmp_path):
    """A crude dataset (24 samples, 2 workers, segments of 3) whose ``cook_crude_sample`` reads
    ``current_batch_index`` while ``encode_sample`` skips samples: Energon's index (the batches given
    before) in every batch, and ``restore_sample`` makes each again."""
    import megatron.energon as me

    from tests.parity.test_cooking_parity import _crude

    root = _crude(tmp_path / "crude", "a", 24)

    def dataset(lib, **kwargs):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=2)
        return lib.get_val_dataset(str(root), split_part="train", batch_size=2, task_encoder=_cooking_encoder(lib), worker_config=wc, **kwargs)

    loader = er.get_savable_loader(dataset(er, samples_per_segment=3))
    ours = [dict(b) for b in loader]
    view = lambda b: [b["keys"], b["texts"]]  # noqa: E731
    assert [view(b) for b in ours] == [view(dict(b)) for b in me.get_loader(dataset(me))]
    assert sum(len(b["keys"]) for b in ours) == 19  # 5 of 24 skipped
    for batch in ours:
        assert view(loader.restore_sample(batch["__restore_key__"])) == view(batch)
    loader.close()


def test_shifted_index_streams_restore_mid_pass_and_older_states(path):
    """A batched stream whose ``encode_sample`` reads the batch index restores exactly from states
    saved at any batch (the round trip); a state saved before such streams were chained
    (``sample_hooks_counted`` False) restores the same keys with the hook reading positions, as it
    was made, and states saved from it record that."""

    def build():
        return _dataset(er, path, "encode seeded", 2, 2, samples_per_segment=3)

    items = round_trip(build, [0, 1, 4, 7, 12], count=15)
    assert len(items) == 15 and items[-1] == "<end of pass>"  # 14 batches: 13 + 13 outputs of the workers
    first = er.get_savable_loader(build())
    it = iter(first)
    head = [dict(next(it)) for _ in range(3)]
    state = first.save_state_rank()
    first.close()
    assert state.sample_hooks_counted
    old = dataclasses.replace(state, sample_hooks_counted=False)
    again = er.get_savable_loader(build())
    again.restore_state_rank(json.loads(old.to_json()))
    rest = [dict(b) for b in again]
    assert [b["keys"] for b in head + rest] == [list(item[0]) for item in items[:-1]]
    by_position = [t[0] for b in rest for t in b["texts"]]
    # the old loader's batch index: the position in the worker stream (worker w: samples 15w..15w+14)
    # over the batch size, interleaved with the other worker
    positions = [int(key) % 15 // 2 * 2 + int(key) // 15 for b in rest for key in b["keys"]]
    assert by_position == positions and by_position != [t[0] for item in items[3:-1] for t in item[1]]
    assert not again.save_state_rank().sample_hooks_counted
    again.close()


def _batch_of(task_encoder):
    return task_encoder.current_batch_index


def test_reads_shifted_indices_sees_reads_in_the_hook_its_functions_and_methods():
    """What chains a stream: reads of ``current_batch_index`` in ``encode_sample`` (directly, in a
    nested function, in a method it names, a static method's too, in a function of its module it
    calls) or ``cook_crude_sample``, or of either index in
    ``postencode_sample``, or a ``restore_seeds`` ``postencode_sample``; not a read in ``batch``
    (batches are made after the carry), nor ``current_sample_index`` in ``encode_sample`` (the
    sample's position, which skips do not shift), nor other hooks' names."""

    class Plain(er.DefaultTaskEncoder):
        def encode_sample(self, sample):
            return sample

        def batch(self, samples):
            return [self.current_batch_index, samples]

    class Direct(Plain):
        def encode_sample(self, sample):
            return (sample, self.current_batch_index)

    class Nested(Plain):
        def encode_sample(self, sample):
            def inner():
                return self.current_batch_index

            return (sample, inner())

    class Through(Plain):
        def encode_sample(self, sample):
            return self.helper(sample)

        def helper(self, sample):
            return self.deeper(sample)

        @staticmethod
        def deeper(sample):
            return sample.current_batch_index

    class OwnPosition(Plain):
        def encode_sample(self, sample):
            return (sample, self.current_sample_index)

    class PostIndex(Plain):
        def postencode_sample(self, sample):
            return (sample, self.current_sample_index)

    class PostSeeded(Plain):
        @er.stateless(restore_seeds=True)
        def postencode_sample(self, sample):
            return (sample, random.random())

    class PostPlain(Plain):
        def postencode_sample(self, sample):
            return sample

    class ModuleHelper(Plain):
        def encode_sample(self, sample):
            return (sample, _batch_of(self))

    class Cook(Plain):
        def cook_crude_sample(self, sample, cooker, aux):
            return (sample, self.current_batch_index)

    for cls, expected in [(Plain, False), (Direct, True), (Nested, True), (Through, True), (OwnPosition, False),
                          (PostIndex, True), (PostSeeded, True), (PostPlain, False), (ModuleHelper, True), (Cook, True)]:  # fmt: skip
        assert reads_shifted_indices(cls()) is expected, cls.__name__
    assert chains_outputs(Direct(), None, False, False) and not chains_outputs(Direct(), None, False, False, sample_hooks=False)
    assert not chains_outputs(Direct(), None, False, True)  # a stream batched across datasets is not chained
