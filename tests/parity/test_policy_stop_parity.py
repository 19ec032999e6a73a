"""Where a validation loader stops on ``FatalSampleError``: after the same batches as Energon's."""

from __future__ import annotations

import pytest

import energon_ray as er
from tests.helpers import text_dataset

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return text_dataset(tmp_path_factory.mktemp("policy_stop") / "text", [5, 7, 3, 9, 6])  # 30 samples


def _encoder(lib, stage):
    fails = {"encode_sample": {9, 10, 11, 24, 25, 26}, "batch": {9, 12, 24, 27}, "encode_batch": {9, 12, 24, 27}}[stage]
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
