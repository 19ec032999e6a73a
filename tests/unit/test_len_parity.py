"""len() of train/val datasets, metadataset blends, mixes and epochized datasets equals megatron-energon's."""

from __future__ import annotations

import warnings

import megatron.energon as me
import pytest

import energon_ray as er
from tests.helpers import prefixed_text_dataset

pytestmark = pytest.mark.parity

YAMLS = {
    "v1.yaml": "__module__: megatron.energon\n__class__: Metadataset\nsplits:\n  train:\n    datasets:\n"
    "      - {weight: 1, path: a}\n      - {weight: 3, path: b}\n  val:\n    datasets:\n"
    "      - {weight: 1, path: a, split_part: train}\n      - {weight: 1, path: b, split_part: train}\n",
    "nested.yaml": "splits:\n  train:\n    datasets:\n      - {weight: 4, path: ./v1.yaml, split_part: train}\n"
    "      - {weight: 1, path: ./v1.yaml, split_part: val}\n",
    "blend.yaml": "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
    "      - {weight: 0.7, path: a}\n      - {weight: 0.3, path: b}\n      - {weight: 1, path: c}\n",
    "epochized.yaml": "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
    "    blend_epochized:\n      - {repetitions: 2, path: a}\n      - {repetitions: 1.5, path: b}\n"
    "      - {repetitions: 0.5, path: c}\n",
    "twins.yaml": "__module__: megatron.energon\n__class__: Metadataset\nsplits:\n  train:\n    datasets:\n"
    "      - {weight: 1, path: a}\n      - {weight: 1, path: a2}\n",
    # shuffle_over_epochs changes the order only: Energon's len() counts the leaf's samples once
    "multiplier.yaml": "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
    "      - {weight: 1, path: a, shuffle_over_epochs_multiplier: 3}\n      - {weight: 1, path: b}\n",
    "epochized_multiplier.yaml": "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
    "    blend_epochized:\n      - {repetitions: 2, path: a, shuffle_over_epochs_multiplier: 3}\n      - {repetitions: 0.5, path: c}\n",
}
WORKERS = [0, 2, 3]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("len_parity")
    prefixed_text_dataset(root / "a", "a", 55)
    prefixed_text_dataset(root / "a2", "d", 55)
    prefixed_text_dataset(root / "b", "b", 44)
    prefixed_text_dataset(root / "c", "c", 23, per_shard=7)
    for name, text in YAMLS.items():
        (root / name).write_text(text)
    return root


def _train(module, path, workers: int, batch_size: int, **kwargs):
    wc = module.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return module.get_train_dataset(
            path, worker_config=wc, batch_size=batch_size, shuffle_buffer_size=None, max_samples_per_sequence=None, **kwargs
        )


def test_two_leaves_of_55_make_11_batches_of_10(root):
    """Energon's own case: two 55-sample leaves, batch 10, no workers -> 11 batches (not 6 + 6)."""
    assert len(_train(er, root / "twins.yaml", 0, 10)) == len(_train(me, root / "twins.yaml", 0, 10)) == 11


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("batch_size", [10, 7])
@pytest.mark.parametrize("name", ["c", "v1.yaml", "nested.yaml", "blend.yaml", "epochized.yaml", "multiplier.yaml", "epochized_multiplier.yaml"])
def test_train_len_is_energons(root, name, batch_size, workers):
    """len(get_train_dataset(...)) equals Energon's for single datasets and every metadataset blend mode."""
    assert len(_train(er, root / name, workers, batch_size)) == len(_train(me, root / name, workers, batch_size))


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("batch_size", [10, 7])
def test_val_len_is_energons(root, batch_size, workers):
    """len(get_val_dataset(...)) of a metadataset (batches run across its datasets) equals Energon's."""
    lens = []
    for module in (me, er):
        wc = module.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        lens.append(len(module.get_val_dataset(root / "v1.yaml", worker_config=wc, batch_size=batch_size)))
    assert lens[0] == lens[1]


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("batch_size", [10, 7])
def test_user_blend_mix_and_epochize_len_is_energons(root, batch_size, workers):
    """BlendDataset of batched datasets sums their batches; MixBatchDataset batches per worker; epochize is its length."""
    lens = []
    for module in (me, er):
        wc = module.WorkerConfig(rank=0, world_size=1, num_workers=workers)
        a, c = (_train(module, root / n, workers, batch_size) for n in ("a", "c"))
        a1, c1 = (_train(module, root / n, workers, 1) for n in ("a", "c"))
        blend = module.BlendDataset((a, 0.5), (c, 0.5), worker_config=wc)
        mix = module.MixBatchDataset(
            (a1, 0.5), (c1, 0.5), batch_size=batch_size, batch_mix_fn=module.homogeneous_concat_mix, worker_config=wc
        )
        epochized = _train(module, root / "v1.yaml", workers, batch_size, virtual_epoch_length=13)
        lens.append((len(blend), len(mix), len(epochized)))
    assert lens[0] == lens[1]
