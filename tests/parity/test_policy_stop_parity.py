"""Where a validation loader stops on ``FatalSampleError``: after the same batches as Energon's."""

from __future__ import annotations

import json
import re

import pytest

import energon_ray as er
from tests.helpers import stop_abandoned_loader_workers, text_dataset

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return text_dataset(tmp_path_factory.mktemp("policy_stop") / "text", [5, 7, 3, 9, 6])  # 30 samples


def _encoder(lib, stage, fails=None, tolerance=None):
    if fails is None:
        fails = {"encode_sample": {9, 10, 11, 24, 25, 26}, "batch": {9, 12, 24, 27}, "encode_batch": {9, 12, 24, 27}}[stage]
    if tolerance is None:
        tolerance = 3 if stage == "encode_sample" else 2

    class Encoder(lib.DefaultTaskEncoder):
        @lib.stateless(failure_tolerance=tolerance)
        def encode_sample(self, sample):
            if stage == "encode_sample" and int(sample.text) in fails:
                raise ValueError(f"bad sample {sample.text}")
            return {"i": int(sample.text)}

        @lib.stateless(failure_tolerance=tolerance)
        def batch(self, samples):
            ii = [s["i"] for s in samples]
            if stage == "batch" and ii[0] in fails:
                raise ValueError(f"bad batch {ii[0]}")
            return {"ii": ii}

        @lib.stateless(failure_tolerance=tolerance)
        def encode_batch(self, batch):
            if stage == "encode_batch" and batch["ii"][0] in fails:
                raise ValueError(f"bad encoded batch {batch['ii'][0]}")
            return batch

    return Encoder()


def _until_fatal(lib, path, stage, workers):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = lib.get_val_dataset(str(path), split_part="train", batch_size=3, task_encoder=_encoder(lib, stage), worker_config=wc)
    got = []
    with pytest.raises(lib.FatalSampleError if lib is er else Exception) as raised:
        for batch in lib.get_loader(ds):
            got.append(batch["ii"])
    stop_abandoned_loader_workers()
    return got, raised.value


@pytest.mark.parametrize("stage", ["encode_sample", "batch", "encode_batch"])
@pytest.mark.parametrize("workers", [1, 2])
def test_fatal_error_comes_after_the_batches_energon_gives_before_it(path, stage, workers):
    """Too many failures in a row in the middle of a worker stream: Energon gives the batches made
    before them (of that worker and, interleaved, of the others) and then raises. Ours raised as the
    failing segment's report arrived, dropping the batches the segment had made and those still
    queued (0 batches instead of 3 with one worker, 6 with two)."""
    import megatron.energon as me

    ours, error = _until_fatal(er, path, stage, workers)
    theirs, their_error = _until_fatal(me, path, stage, workers)
    assert "FatalSampleError" in f"{type(their_error).__name__}: {their_error}"
    expected = [[0, 1, 2], [3, 4, 5], [6, 7, 8]] if workers == 1 else [
        [0, 1, 2], [15, 16, 17], [3, 4, 5], [18, 19, 20], [6, 7, 8], [21, 22, 23]]  # fmt: skip
    assert theirs == expected
    assert ours == theirs
    assert f"consecutive failures in stage {stage!r}" in str(error)


# -- a user's error handler that raises; runs of failures across small segments ---------------------


class Abort(Exception):
    """What the user's handler raises (its own exception, not the hook's)."""


def _args(exc, sample, sources) -> list:
    """The handler's arguments, comparable across processes (Energon calls it in its worker)."""
    if isinstance(sample, list):
        what = ["batch", [getattr(s, "__key__", None) if not isinstance(s, dict) else s.get("__key__") for s in sample]]
    elif isinstance(sample, dict):
        what = ["dict", sample.get("__key__")]
    else:
        what = [type(sample).__name__, getattr(sample, "__key__", None)]
    where = [[s.shard_name, int(s.index), list(s.file_names)] for s in sources or ()]
    return [type(exc).__name__, str(exc), what, where]


def _raising(log):
    def handler(exc, sample, sources):
        with open(log, "a") as f:
            f.write(json.dumps(_args(exc, sample, sources)) + "\n")
        raise Abort(f"handler stops at {exc}")

    return handler


def _keyed_encoder(lib, stage, fails):
    class Encoder(lib.DefaultTaskEncoder):
        def encode_sample(self, sample):
            if stage == "encode_sample" and int(sample.text) in fails:
                raise ValueError(f"bad sample {sample.text}")
            return {"i": int(sample.text), "__key__": sample.__key__}

        def batch(self, samples):
            ii = [s["i"] for s in samples]
            if stage == "batch" and ii[0] in fails:
                raise ValueError(f"bad batch {ii[0]}")
            return {"ii": ii}

        def encode_batch(self, batch):
            if stage == "encode_batch" and batch["ii"][0] in fails:
                raise ValueError(f"bad encoded batch {batch['ii'][0]}")
            return batch

    return Encoder()


def _until_abort(lib, path, log, stage, fails, workers, **kwargs):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers, global_error_handler=_raising(str(log)))
    ds = lib.get_val_dataset(str(path), split_part="train", batch_size=3, task_encoder=_keyed_encoder(lib, stage, fails),
                             worker_config=wc, **kwargs)  # fmt: skip
    got = []
    with pytest.raises(Exception) as raised:
        for batch in lib.get_loader(ds):
            got.append(batch["ii"])
    stop_abandoned_loader_workers()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    return got, raised.value, calls


@pytest.mark.parametrize(
    "stage, fails, workers, segment",
    [
        ("encode_sample", {13}, 1, None), ("encode_sample", {13}, 2, None), ("encode_sample", {14}, 1, 4),
        ("encode_sample", {29}, 2, None), ("batch", {12}, 1, None), ("batch", {15}, 2, None), ("encode_batch", {6}, 2, 3),
    ],
)  # fmt: skip
def test_a_raising_error_handler_stops_where_energons_does(path, tmp_path, stage, fails, workers, segment):
    """A ``global_error_handler`` that raises: Energon's worker calls it as it meets the failed sample
    (or batch), while it makes the batch that sample would have gone into, so the loader gives the
    batches before it (of this and, interleaved, the other workers) and then raises the handler's
    exception. Ours called the handler as the segment's block arrived, before any of its batches:
    no batch at all (4 instead of Energon's, 8 with two workers). The handler gets Energon's
    arguments: the exception, the sample (a batch hook's: the list of samples) and its sources."""
    import megatron.energon as me

    kwargs = {} if segment is None else {"samples_per_segment": segment}
    ours, error, our_calls = _until_abort(er, path, tmp_path / "ours.jsonl", stage, fails, workers, **kwargs)
    theirs, their_error, their_calls = _until_abort(me, path, tmp_path / "theirs.jsonl", stage, fails, workers)
    assert "Abort" in f"{type(their_error).__name__}: {their_error}"
    assert theirs and ours == theirs
    assert isinstance(error, Abort) and str(error).startswith("handler stops at bad ")
    assert our_calls == their_calls and len(our_calls) == 1


@pytest.mark.parametrize(
    "stage, fails, tolerance, batch_size, segment",
    [
        ("encode_sample", {10, 11, 12}, 3, 1, 4), ("encode_sample", {10, 11, 12}, 3, 2, 4),
        ("encode_sample", {11, 12}, 2, 3, 6), ("encode_sample", {11, 12}, 2, 2, 4), ("batch", {3, 4, 5, 6, 7}, 3, 1, 4),
    ],
)  # fmt: skip
def test_a_run_of_failures_across_segments_stops_where_energons_does(path, stage, fails, tolerance, batch_size, segment):
    """Too many failures in a row, the run spread over two segments whose second goes on with good
    samples: Energon raises at the failure that makes ``failure_tolerance`` in a row, after the
    batches made before it. Ours joined the run when the second segment's report came, after that
    segment's batches: 3 batches more than Energon (batch size 1), 1-2 with larger batches."""
    import megatron.energon as me

    def until_fatal(lib, **kwargs):
        wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=1, global_error_handler=lambda *args: None)
        encoder = _encoder(lib, stage, fails, tolerance)
        ds = lib.get_val_dataset(str(path), split_part="train", batch_size=batch_size, task_encoder=encoder, worker_config=wc, **kwargs)
        got = []
        with pytest.raises(Exception) as raised:
            for batch in lib.get_loader(ds):
                got.append(batch["ii"])
        stop_abandoned_loader_workers()
        return got, raised.value

    ours, error = until_fatal(er, samples_per_segment=segment)
    theirs, their_error = until_fatal(me)
    assert "FatalSampleError" in f"{type(their_error).__name__}: {their_error}"
    assert ours == theirs
    assert isinstance(error, er.FatalSampleError)
    assert re.match(rf"{tolerance} consecutive failures in stage {stage!r} of worker stream 0 .*last: .*bad (sample|batch) {sorted(fails)[tolerance - 1]}\b", str(error))
