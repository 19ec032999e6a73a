"""Packing and grouped batching against megatron-energon: same data, same hooks, same WorkerConfig."""

from __future__ import annotations

import functools
import random
import re

import pytest

import energon_ray as er
from tests.helpers import prefixed_text_dataset, val_metadataset

me = pytest.importorskip("megatron.energon")
pytestmark = pytest.mark.parity


class JoinedPack:
    """A pack is one TextSample: its members' keys joined by ``+``, their texts by ``|``."""

    def pack_selected_samples(self, samples):
        return self.sample_cls(__key__="+".join(s.__key__ for s in samples), __restore_key__=(), text="|".join(s.text for s in samples))


class PackingHooks(JoinedPack):
    """Deterministic packing: groups whose sizes cycle 1, 4, 2, 3 over the buffer; the last sample of
    each full buffer is left out (Energon drops unselected samples)."""

    def select_samples_to_pack(self, samples):
        keep = samples[:-1] if len(samples) == self.buffer else samples
        out, i, k = [], 0, 0
        while i < len(keep):
            size = (1, 4, 2, 3)[k % 4]
            out.append(keep[i : i + size])
            i, k = i + size, k + 1
        return out


class OurPacking(PackingHooks, er.DefaultTaskEncoder):
    sample_cls = er.TextSample
    buffer = 7


class TheirPacking(PackingHooks, me.DefaultTaskEncoder):
    sample_cls = me.TextSample
    buffer = 7


class GroupHooks:
    def batch_group_criterion(self, sample):
        return int(sample.text) % 3, None


class OurGroup(GroupHooks, er.DefaultTaskEncoder):
    pass


class TheirGroup(GroupHooks, me.DefaultTaskEncoder):
    pass


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return prefixed_text_dataset(tmp_path_factory.mktemp("pack") / "t", "t", 61, per_shard=9)


def _keys(loader):
    return [list(b.__key__) for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_pack_patterns_match_energon(text, workers):
    """Val packing with buffer 7 and batch 2 gives exactly Energon's packs and batches (keys joined per pack)."""
    ours = er.get_val_dataset(
        text, split_part="train", worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=2,
        packing_buffer_size=7, task_encoder=OurPacking(), samples_per_segment=1000,
    )  # fmt: skip
    theirs = me.get_val_dataset(
        text, split_part="train", worker_config=me.WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=2,
        packing_buffer_size=7, task_encoder=TheirPacking(),
    )  # fmt: skip
    got, expected = _keys(er.get_loader(ours)), _keys(me.get_loader(theirs))
    assert got == expected
    assert any("+" in k for b in got for k in b)


@pytest.mark.parametrize("workers,segment", [(0, None), (2, None), (0, 4), (2, 8)])
def test_grouped_batches_match_energon(text, workers, segment):
    """batch_group_criterion buckets (text % 3) with batch 4 give Energon's batches, flushes included,
    also when each worker's stream spans several segments (Ray tasks) whose buckets straddle them."""
    extra = {} if segment is None else {"samples_per_segment": segment}
    ours = er.get_val_dataset(
        text, split_part="train", worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=4,
        task_encoder=OurGroup(), **extra,
    )  # fmt: skip
    theirs = me.get_val_dataset(text, split_part="train", worker_config=me.WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=4, task_encoder=TheirGroup())
    got, expected = _keys(er.get_loader(ours)), _keys(me.get_loader(theirs))
    assert sorted(map(tuple, got)) == sorted(map(tuple, expected))
    assert got == expected


class EmptyGroupHooks(JoinedPack):
    """Pack the first sample alone and the next two together: on a short last buffer (one sample) the
    second group is empty; a separate ``[]`` comes first and last too."""

    def select_samples_to_pack(self, samples):
        return [[], [samples[0]], samples[1:3], []]


class OurEmptyGroups(EmptyGroupHooks, er.DefaultTaskEncoder):
    sample_cls = er.TextSample


class TheirEmptyGroups(EmptyGroupHooks, me.DefaultTaskEncoder):
    sample_cls = me.TextSample


@pytest.mark.parametrize("workers,buffer", [(0, 3), (2, 2), (2, 1)])
def test_empty_groups_from_select_samples_to_pack_are_ignored_like_energon(text, workers, buffer):
    """Empty groups in select_samples_to_pack's answer are no packs, as in Energon (we raised
    FatalSampleError 'returned an empty group' on each of these, at the latest on a worker's short last buffer)."""
    wc = dict(rank=0, world_size=1, num_workers=workers)
    ours = er.get_val_dataset(text, split_part="train", worker_config=er.WorkerConfig(**wc), batch_size=2, packing_buffer_size=buffer, task_encoder=OurEmptyGroups())
    theirs = me.get_val_dataset(text, split_part="train", worker_config=me.WorkerConfig(**wc), batch_size=2, packing_buffer_size=buffer, task_encoder=TheirEmptyGroups())
    got, expected = _keys(er.get_loader(ours)), _keys(me.get_loader(theirs))
    assert got == expected
    if workers == 0:  # 61 samples: 20 buffers of 3 (two packs each), then t_000060 alone
        assert len(got) == 21 and got[:2] == [["t_000000", "t_000001+t_000002"], ["t_000003", "t_000004+t_000005"]]
        assert got[-2:] == [["t_000057", "t_000058+t_000059"], ["t_000060"]]


class RareHooks(JoinedPack):
    """With tolerance 5: buffers (of 3) starting at sample 18k+15 are packed (in pairs), the 5 before
    each give no pack; ``never`` gives no pack at all."""

    __default_failure_tolerance__ = 5
    never = False

    def select_samples_to_pack(self, samples):
        if self.never or int(samples[0].text) % 18 != 15:
            return []
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]


class OurRare(RareHooks, er.DefaultTaskEncoder):
    sample_cls = er.TextSample


class TheirRare(RareHooks, me.DefaultTaskEncoder):
    sample_cls = me.TextSample


def test_buffers_without_a_pack_are_counted_across_segments_like_energon(text):
    """Energon raises once select_samples_to_pack gave no pack for more than the tolerance's buffers
    in a row; so do we when the run spans segments (4 buffers each here; each segment counted alone
    before, so a selection that never packs ended the pass with no batch and no error, and a repeating
    loader waited forever). Runs of exactly the tolerance pass, as in Energon."""
    wc = dict(rank=0, world_size=1, num_workers=0)

    def ours(never):
        te = OurRare()
        te.never = never
        return er.get_loader(er.get_val_dataset(text, split_part="train", worker_config=er.WorkerConfig(**wc), batch_size=2,
                                                packing_buffer_size=3, task_encoder=te, samples_per_segment=12))  # fmt: skip

    def theirs(never):
        te = TheirRare()
        te.never = never
        return me.get_loader(me.get_val_dataset(text, split_part="train", worker_config=me.WorkerConfig(**wc), batch_size=2,
                                                packing_buffer_size=3, task_encoder=te))  # fmt: skip

    expected = [["t_000015+t_000016", "t_000017"], ["t_000033+t_000034", "t_000035"], ["t_000051+t_000052", "t_000053"]]
    assert _keys(ours(False)) == _keys(theirs(False)) == expected
    with pytest.raises(RuntimeError, match=r"did not yield any packs after 6 rounds"):
        _keys(theirs(True))
    # at the buffer that makes 6, as Energon (the message named the second segment's 8 and its last buffer)
    with pytest.raises(er.FatalSampleError, match=r"^select_samples_to_pack returned no packs for 6 buffers in a row of worker stream 0 \(failure_tolerance=5; last: no pack from the buffer starting at 't_000015'\)"):
        _keys(ours(True))


class PairHooks(JoinedPack):
    """Pairs of the buffer (a buffer of 5 gives 3 packs); ``batch`` records the indices it sees."""

    def select_samples_to_pack(self, samples):
        return [samples[i : i + 2] for i in range(0, len(samples), 2)]

    def batch(self, packs):
        return [self.current_batch_index, self.current_sample_index, *(p.__key__ for p in packs)]


def _packed_val_loaders(text, workers, hooks, batch_size, **ours_kwargs):
    """Our and Energon's packed validation loaders (buffers of 5) with task encoders made of
    ``hooks`` over each library's ``DefaultTaskEncoder`` and ``TextSample``."""
    out = []
    for lib, kwargs in ((er, ours_kwargs), (me, {})):
        encoder = type(hooks.__name__, (hooks, lib.DefaultTaskEncoder), {"sample_cls": lib.TextSample})()
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        out.append(lib.get_loader(lib.get_val_dataset(text, split_part="train", worker_config=wc, batch_size=batch_size,
                                                      packing_buffer_size=5, task_encoder=encoder, **kwargs)))  # fmt: skip
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_of_packs_run_across_segments_like_energon(text, workers):
    """A worker stream's packs are batched in order, as Energon batches them, also where a segment's
    packs (12 per 20 samples here) do not fill whole batches of 5, and ``batch`` sees Energon's
    ``current_batch_index``/``current_sample_index`` (each segment batched its own packs and its last
    two waited in a pool for later segments' leftovers: batch 2 was packs 12-16, not 10-14; indices
    were the first member's position over the batch size)."""
    ours, theirs = _packed_val_loaders(text, workers, PairHooks, 5, samples_per_segment=20)
    got, expected = list(ours), list(theirs)
    assert got == expected
    assert [b[:2] for b in got] == [[i, i] for i in range(len(got))]
    if workers == 0:
        assert got[2] == [2, 2, "t_000017+t_000018", "t_000019", "t_000020+t_000021", "t_000022+t_000023", "t_000024"]


class IndexHooks:
    """Packs of three, each recording the ``current_batch_index`` its buffer's selection, its first
    member's ``postencode_sample`` and its ``pack_selected_samples`` saw."""

    def select_samples_to_pack(self, samples):
        for sample in samples:
            sample.text = f"s{self.current_batch_index}"
        return [samples[i : i + 3] for i in range(0, len(samples), 3)]

    def postencode_sample(self, sample):
        sample.text += f"e{self.current_batch_index}"
        return sample

    def pack_selected_samples(self, samples):
        return self.sample_cls(__key__="+".join(s.__key__ for s in samples), __restore_key__=(), text=f"{samples[0].text}p{self.current_batch_index}")


@pytest.mark.parametrize("workers", [0, 2])
def test_packing_hooks_read_current_batch_index(text, workers):
    """current_batch_index inside select_samples_to_pack, postencode_sample and pack_selected_samples
    is Energon's: the batch being filled when the hook runs (packs given before over the batch
    size; it was the first sample's position over the batch size, and before that it raised
    RuntimeError); the packs and batches are Energon's."""
    ours, theirs = _packed_val_loaders(text, workers, IndexHooks, 2)
    got, expected = list(ours), list(theirs)
    assert [(b.__key__, b.text) for b in got] == [(b.__key__, b.text) for b in expected]
    if workers == 0:  # buffers of 5 make packs of 3 and 2: each buffer one batch of 2 packs
        assert [b.text for b in got[:3]] == [["s0e0p0", "s0e0p0"], ["s1e1p1", "s1e1p1"], ["s2e2p2", "s2e2p2"]]


class SkipEveryThird(PairHooks):
    """Samples 1, 4, 7 … skipped in ``encode_sample``, before the packing buffer."""

    def encode_sample(self, sample):
        if int(sample.__key__.rsplit("_", 1)[-1]) % 3 == 1:
            raise er.SkipSample() if isinstance(self, er.DefaultTaskEncoder) else me.SkipSample()
        return sample


class SplitInTwo(PairHooks):
    """A generator ``encode_sample``: each sample twice (``…a``, ``…b``), every fifth sample once."""

    def encode_sample(self, sample):
        yield self.sample_cls(__key__=sample.__key__ + "a", __restore_key__=(), text=sample.text)
        if int(sample.__key__.rsplit("_", 1)[-1]) % 5:
            yield self.sample_cls(__key__=sample.__key__ + "b", __restore_key__=(), text=sample.text)


@pytest.mark.parametrize("hooks", [SkipEveryThird, SplitInTwo], ids=["skipped", "generator"])
@pytest.mark.parametrize("workers", [0, 2])
def test_packing_buffers_run_across_segments_like_energon(text, workers, hooks):
    """Where samples are skipped before packing, or a generator ``encode_sample`` makes other than
    one output per sample, a worker stream's packing buffers run across its segments (of 20
    samples here: ``samples_per_segment`` is rounded up to 4 buffers) as Energon's do: the same packs and batches. Each segment packed its own outputs
    before (its last buffer short), so the packs differed from Energon's from the first segment on."""
    ours, theirs = _packed_val_loaders(text, workers, hooks, 3, samples_per_segment=10)
    got, expected = list(ours), list(theirs)
    assert got == expected
    assert sum(len(b) - 2 for b in got) > 20


@pytest.fixture(scope="module")
def two_val(tmp_path_factory):
    """A validation metadataset of two datasets (18 and 13 samples)."""
    return val_metadataset(tmp_path_factory.mktemp("valpack"), [("a", 18, 5), ("b", 13, 4)])


@pytest.mark.parametrize("hooks", [PairHooks, SkipEveryThird], ids=["pairs", "skipped"])
@pytest.mark.parametrize("workers", [0, 2])
def test_val_metadataset_packing_buffers_run_from_one_dataset_into_the_next_like_energon(two_val, workers, hooks):
    """A validation metadataset's packing buffers (of 5) run from the end of one dataset into the
    next, as Energon packs the concatenated stream: the same packs, batches and ``batch`` indices
    (each dataset's buffers restarted at its start: a's last short buffer was packed alone, and b's
    buffers started at b_000000)."""
    ours, theirs = (
        lib.get_loader(lib.get_val_dataset(
            two_val, split_part="val", worker_config=lib.WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=2,
            packing_buffer_size=5, task_encoder=type(hooks.__name__, (hooks, lib.DefaultTaskEncoder), {"sample_cls": lib.TextSample})(),
            **kwargs,
        ))
        for lib, kwargs in ((er, {"samples_per_segment": 5}), (me, {}))
    )  # fmt: skip
    got, expected = list(ours), list(theirs)
    assert got == expected
    if workers == 0 and hooks is PairHooks:  # a's last three samples open the buffer b's first two fill
        assert got[5:7] == [[5, 5, "a_000017+b_000000", "b_000001"], [6, 6, "b_000002+b_000003", "b_000004+b_000005"]]


@pytest.mark.parametrize("workers", [0, 2])
def test_val_metadataset_packing_drops_the_last_short_batch_like_energon(two_val, workers):
    """``batch_drop_last=True`` on a packed validation metadataset: each worker stream's last short
    batch of packs is dropped, as Energon drops it (it was handed out)."""
    ours, theirs = (
        lib.get_loader(lib.get_val_dataset(
            two_val, split_part="val", worker_config=lib.WorkerConfig(rank=0, world_size=1, num_workers=workers), batch_size=2,
            batch_drop_last=True, packing_buffer_size=5, task_encoder=type("P", (PairHooks, lib.DefaultTaskEncoder), {"sample_cls": lib.TextSample})(),
            **kwargs,
        ))
        for lib, kwargs in ((er, {"samples_per_segment": 5}), (me, {}))
    )  # fmt: skip
    got, expected = list(ours), list(theirs)
    assert got == expected
    assert all(len(b) == 4 for b in got)  # [batch index, sample index, pack, pack]


class IndexedPairs(PairHooks):
    """PairHooks whose ``postencode_sample`` records its ``current_sample_index`` in the sample's text."""

    def postencode_sample(self, sample):
        sample.text = f"{sample.text}@{self.current_sample_index}"
        return sample


def _unbatched_packs(lib, meta, hooks, world_size, workers, limit, **kwargs):
    """Per rank, ``(key, text)`` of each pack an unbatched packed validation loader hands out."""
    out = []
    for rank in range(world_size):
        encoder = type(hooks.__name__, (hooks, lib.DefaultTaskEncoder), {"sample_cls": lib.TextSample})()
        wc = lib.WorkerConfig(rank=rank, world_size=world_size, num_workers=workers)
        ds = lib.get_val_dataset(meta, split_part="val", worker_config=wc, batch_size=None, packing_buffer_size=5,
                                 task_encoder=encoder, limit=limit, **kwargs)  # fmt: skip
        out.append([(pack.__key__, pack.text) for pack in lib.get_loader(ds)])
    return out


@pytest.mark.parametrize(
    "hooks, world_size, workers, limit",
    [(IndexedPairs, 1, 0, None), (IndexedPairs, 1, 1, 12), (IndexedPairs, 2, 2, None), (IndexedPairs, 2, 0, 7), (SkipEveryThird, 1, 2, None)],
    ids=["w1-n0", "w1-n1-limit", "w2-n2", "w2-n0-limit", "skipped-n2"],
)
def test_unbatched_val_metadataset_packing_buffers_run_from_one_dataset_into_the_next_like_energon(two_val, hooks, world_size, workers, limit):
    """An unbatched (``batch_size=None``) packed validation metadataset packs each worker stream's
    samples through both datasets, as Energon packs the concatenated stream: the same packs, one by
    one, in the same order per rank (``limit`` counting packs), and ``postencode_sample`` sees
    Energon's ``current_sample_index``. Each dataset's buffers restarted at its start (a's last short
    buffer was packed alone, b's started at b_000000)."""
    ours = _unbatched_packs(er, two_val, hooks, world_size, workers, limit, samples_per_segment=5)
    assert ours == _unbatched_packs(me, two_val, hooks, world_size, workers, limit)
    if (world_size, workers, limit) == (1, 0, None):  # a's last three samples open the buffer b's first two fill
        assert [key for key, _ in ours[0][9:12]] == ["a_000015+a_000016", "a_000017+b_000000", "b_000001"]


def _counted_encoder(lib):
    """Samples 1, 4, 7 … skipped before packing; each buffer (of 5) selected in groups of 3, 1, 2 …;
    every packing hook ``@stateless(restore_seeds=True)`` and recording its ``current_sample_index``,
    ``current_batch_index`` and a draw in the texts; ``batch`` a dict of its packs' keys and texts."""

    def seen(te) -> str:
        return f"{te.current_sample_index},{te.current_batch_index},{random.randint(0, 10**6)}"

    class Encoder(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            if int(sample.__key__.rsplit("_", 1)[-1]) % 3 == 1:
                raise lib.SkipSample()
            return sample

        @lib.stateless(restore_seeds=True)
        def select_samples_to_pack(self, samples):
            tag = f"/s{seen(self)}"
            for sample in samples:
                sample.text += tag
            out, i, k = [], 0, 0
            while i < len(samples):
                size = (3, 1, 2)[k % 3]
                out.append(samples[i : i + size])
                i, k = i + size, k + 1
            return out

        @lib.stateless(restore_seeds=True)
        def postencode_sample(self, sample):
            return lib.TextSample(__key__=sample.__key__, __restore_key__=sample.__restore_key__, text=f"{sample.text}/e{seen(self)}")

        @lib.stateless(restore_seeds=True)
        def pack_selected_samples(self, samples):
            text = "|".join(s.text for s in samples) + f"/p{seen(self)}"
            return lib.TextSample(__key__="+".join(s.__key__ for s in samples), __restore_key__=(), text=text)

        def batch(self, packs):
            return {"keys": [p.__key__ for p in packs], "texts": [p.text for p in packs], "__restore_key__": ()}

    return Encoder()


def _counted_dataset(lib, path, workers, batch_size, **kwargs):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    return lib.get_val_dataset(str(path), split_part="train", worker_config=wc, batch_size=batch_size,
                               packing_buffer_size=5, task_encoder=_counted_encoder(lib), **kwargs)  # fmt: skip


def _counted_view(item) -> list:
    return [item["keys"], item["texts"]] if isinstance(item, dict) else [item.__key__, item.text]


@pytest.mark.parametrize("batch_size", [3, None], ids=["batched", "unbatched"])
@pytest.mark.parametrize("workers", [0, 2])
def test_packing_hooks_read_energons_indices_and_seeds_across_segments(text, workers, batch_size):
    """``select_samples_to_pack``, ``postencode_sample`` and ``pack_selected_samples`` read Energon's
    ``current_sample_index`` (each hook's calls before it in the worker stream), its
    ``current_batch_index`` (the batch being filled: packs given before over the batch size) and, as
    ``restore_seeds`` hooks, draw Energon's numbers, across segments of 10 samples and after skipped
    samples, batched or not (they read the first sample's position and drew our own numbers); and
    ``restore_sample`` makes each batch (pack) again as it was."""
    loader = er.get_savable_loader(_counted_dataset(er, text, workers, batch_size, samples_per_segment=10))
    ours = [_counted_view(item) for item in loader]
    theirs = [_counted_view(item) for item in me.get_loader(_counted_dataset(me, text, workers, batch_size))]
    assert ours == theirs
    if workers == 0:  # the last pack, sample 60 alone: the 9th selection, 41st postencode, 25th pack
        last = ours[-1][1][-1] if batch_size else ours[-1][1]
        assert re.sub(r",\d+(/|$)", r"\1", last) == f"60/s8,{24 // (batch_size or 1)}/e40,{24 // (batch_size or 1)}/p24,{24 // (batch_size or 1)}"
    for item in list(loader)[:: 3 if batch_size else 7]:  # (select_samples_to_pack does not run again, as in Energon)
        again = loader.restore_sample(item["__restore_key__"] if isinstance(item, dict) else item.__restore_key__)
        assert _counted_view(again) == _unselected(_counted_view(item))
    loader.close()


def _unselected(view: list) -> list:
    """A view without what ``select_samples_to_pack`` wrote (``/s…``)."""
    strip = functools.partial(re.sub, r"/s[\d,]+", "")
    return [view[0], [strip(t) for t in view[1]] if isinstance(view[1], list) else strip(view[1])]


def test_packing_hook_counts_run_on_after_a_restore_and_older_states_and_keys_restore(text):
    """The packing hooks' counts (above, batched, 2 workers) run on in a restored loader as in the
    loader saved (a state records them where each worker stream's carry is rebuilt: 11 items in
    ``chain``); a state saved before they were counted (``pack_hooks_counted`` False, 3 items in
    ``chain``) restores and goes on as it was made, the hooks reading positions; and a pack's
    restore key without ``("PackMade", …)`` (saved before) is made again as it was."""

    def loader(counted: bool = True):
        dataset = _counted_dataset(er, text, 2, 3, samples_per_segment=10)
        for leaf in dataset.leaves():
            leaf.count_pack_hooks(counted)
        return er.get_savable_loader(dataset)

    def head_and_state(made, cut):
        it = iter(made)
        head = [_counted_view(next(it)) for _ in range(cut)]
        state = made.save_state_rank()
        made.close()
        return head, state

    full = [_counted_view(b) for b in loader()]
    for cut in (3, 5):
        head, state = head_and_state(loader(), cut)
        chains = [s.checkpoint.chain for s in state.streams[0]]
        assert state.pack_hooks_counted and any(chains) and all(c is None or len(c) == 11 for c in chains)
        restored = loader()
        restored.restore_state_rank(state)
        assert head + [_counted_view(b) for b in restored] == full
        restored.close()
    before = loader(counted=False)
    old = [dict(b) for b in before]
    before.close()
    assert [v[0] for v in map(_counted_view, old)] == [v[0] for v in full] and [_counted_view(b) for b in old] != full
    head, state = head_and_state(loader(counted=False), 4)
    assert not state.pack_hooks_counted and all(len(s.checkpoint.chain or ()) <= 3 for s in state.streams[0])
    again = loader()
    again.restore_state_rank(state)
    assert head + [_counted_view(b) for b in again] == [_counted_view(b) for b in old]
    for batch in old[::3]:
        assert _counted_view(again.restore_sample(batch["__restore_key__"])) == _unselected(_counted_view(batch))
    again.close()


def _generator_pack_encoder(lib):
    """Pairs of each buffer (of 5); ``postencode_sample`` fails on samples 3, 13, 23 … (their packs
    keep one member); a generator ``pack_selected_samples`` makes two packs of each pair; all three
    ``@stateless(restore_seeds=True)``, recording their indices and a draw."""

    def seen(te) -> str:
        return f"{te.current_sample_index},{te.current_batch_index},{random.randint(0, 10**6)}"

    class Encoder(lib.DefaultTaskEncoder):
        @lib.stateless(restore_seeds=True)
        def select_samples_to_pack(self, samples):
            return [samples[i : i + 2] for i in range(0, len(samples), 2)]

        @lib.stateless(restore_seeds=True)
        def postencode_sample(self, sample):
            if int(sample.__key__.rsplit("_", 1)[-1]) % 10 == 3:
                raise ValueError("this member fails")
            return lib.TextSample(__key__=sample.__key__, __restore_key__=sample.__restore_key__, text=f"{sample.text}/e{seen(self)}")

        @lib.stateless(restore_seeds=True)
        def pack_selected_samples(self, samples):
            for k in range(2):
                text = "|".join(s.text for s in samples) + f"/p{seen(self)}"
                yield lib.TextSample(__key__="+".join(s.__key__ for s in samples) + f"#{k}", __restore_key__=(), text=text)

        def batch(self, packs):
            return {"keys": [p.__key__ for p in packs], "texts": [p.text for p in packs], "__restore_key__": ()}

    return Encoder()


def test_generator_pack_selected_samples_and_failed_members_count_like_energon(text):
    """Each output of a generator ``pack_selected_samples`` is one more pack given (the next output
    reads the next ``current_batch_index``), a member that fails ``postencode_sample`` still counts
    as its call: the indices and draws are Energon's (2 workers, batches of 3, segments of 10), and
    restore_sample makes each batch again as it was."""
    made = []
    for lib, kwargs in ((er, {"samples_per_segment": 10}), (me, {})):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = lib.get_val_dataset(str(text), split_part="train", worker_config=wc, batch_size=3, packing_buffer_size=5,
                                 task_encoder=_generator_pack_encoder(lib), **kwargs)  # fmt: skip
        made.append((lib.get_savable_loader if lib is er else lib.get_loader)(ds))
    ours, theirs = list(made[0]), list(made[1])
    assert [_counted_view(b) for b in ours] == [_counted_view(b) for b in theirs]
    assert any("#1" in k for b in ours for k in b["keys"]) and not any("_000013" in k for b in ours for k in b["keys"])
    for batch in ours[::4]:
        assert _counted_view(made[0].restore_sample(batch["__restore_key__"])) == _counted_view(batch)
    made[0].close()
