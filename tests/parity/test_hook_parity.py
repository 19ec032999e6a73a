"""Task-encoder hooks other than packing and cooking give Energon's validation batches."""

from __future__ import annotations

import pytest

import energon_ray as er
from tests.helpers import text_dataset

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return text_dataset(tmp_path_factory.mktemp("hook_parity") / "text", [5, 7, 3, 9, 6])  # 30 samples


def _batches(lib, path, task_encoder, workers, batch_size, **kwargs):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = lib.get_val_dataset(str(path), split_part="train", batch_size=batch_size, task_encoder=task_encoder, worker_config=wc, **kwargs)
    return [dict(b) for b in lib.get_loader(ds)]


def _preencode_encoder(lib):
    class Encoder(lib.DefaultTaskEncoder):
        def preencode_sample(self, sample):
            return {"key": sample.__key__, "index": self.current_sample_index}

        def batch(self, samples):
            return {"keys": [s["key"] for s in samples], "indices": [s["index"] for s in samples]}

    return Encoder()


@pytest.mark.parametrize("workers", [0, 2])
def test_preencode_sample_without_packing_encodes_each_sample_as_energon(path, workers):
    """Energon runs an overridden ``preencode_sample`` as the sample encoder with or without
    packing; ours ran it only with packing, so the samples reached ``batch`` unencoded (every batch
    failed: no batch at all). Now the same batches, keys and ``current_sample_index`` values."""
    import megatron.energon as me

    ours = _batches(er, path, _preencode_encoder(er), workers, 3)
    theirs = _batches(me, path, _preencode_encoder(me), workers, 3)
    assert ours == theirs
    assert len(ours) == 10 and sorted(k for b in ours for k in b["keys"]) == [f"{i:06d}" for i in range(30)]
