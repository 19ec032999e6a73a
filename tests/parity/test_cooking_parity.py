"""Crude datasets cooked as Energon cooks them: a ``cook_crude_sample`` override with Energon's
signature ``(sample, cooker, aux)``, its ``restore_seeds`` draws, and a dataset no cooker matches."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import yaml

import energon_ray as er
from energon_ray.format.prepare import prepare_dataset
from energon_ray.synthetic import write_shards

pytestmark = pytest.mark.parity


def _crude(root, prefix, n):
    samples = [(f"{prefix}_{i:04d}", {"txt": f"{prefix}{i}".encode(), "json": b'{"i": %d}' % i}) for i in range(n)]
    write_shards(root / "shards", samples, 4)
    prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="CrudeWebdataset", progress=False)
    return root


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    """A metadataset of two crude datasets (10 and 6 samples) with subflavors kind A and kind B."""
    root = tmp_path_factory.mktemp("cooking_parity")
    a, b = _crude(root / "a", "a", 10), _crude(root / "b", "b", 6)
    path = root / "mix.yaml"
    path.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": {"blend": [
        {"weight": 1, "path": str(a), "subflavors": {"kind": "A"}},
        {"weight": 1, "path": str(b), "subflavors": {"kind": "B", "x": 1}},
    ]}}}))  # fmt: skip
    return path


def _encoder(lib, draws: bool, kinds=("A", "B")):
    @lib.stateless
    def cook_a(sample):
        return lib.TextSample(**lib.basic_sample_keys(sample), text="A:" + sample["txt"])

    @lib.stateless
    def cook_b(sample):
        return lib.TextSample(**lib.basic_sample_keys(sample), text=f"B:{sample['txt']}:{sample['json']['i']}")

    cooks = {"A": cook_a, "B": cook_b}

    class Encoder(lib.DefaultTaskEncoder):
        cookers = [lib.Cooker(cooks[kind], has_subflavors={"kind": kind}) for kind in kinds]

        @lib.stateless(restore_seeds=draws)
        def cook_crude_sample(self, sample, cooker, aux):
            cooked = super().cook_crude_sample(sample, cooker, aux)
            cooked.text += f"|{cooker.cook.__name__}|{sorted(aux)}"
            if draws:
                cooked.text += f"|{self.current_sample_index}|{random.randint(0, 1000)}|{np.random.randint(0, 1000)}"
                cooked.text += f"|{int(torch.randint(0, 1000, ()))}"
            return cooked

        def batch(self, samples):
            return [(s.__key__, s.text) for s in samples]

    return Encoder()


def _batches(lib, path, workers, draws):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = lib.get_val_dataset(path, split_part="train", batch_size=3, task_encoder=_encoder(lib, draws), worker_config=wc)
    return [[tuple(s) for s in batch] for batch in lib.get_loader(ds)]


@pytest.mark.parametrize("workers", [0, 2])
def test_override_with_energons_signature_cooks_as_energon(blend, workers):
    """``cook_crude_sample(self, sample, cooker, aux)`` calling ``super()``: each sample gets the cooker
    matching its dataset's subflavors and the (empty) aux dict; the batches equal Energon's. Every
    sample used to fail (the hook was called with the sample alone) and the loader gave nothing."""
    import megatron.energon as me

    ours = _batches(er, blend, workers, draws=False)
    assert ours == _batches(me, blend, workers, draws=False)
    assert sorted(s for b in ours for s in b)[::7] == [
        ("a_0000", "A:a0|cook_a|[]"), ("a_0007", "A:a7|cook_a|[]"), ("b_0004", "B:b4:4|cook_b|[]"),
    ]  # fmt: skip
    assert sum(len(b) for b in ours) == 16


@pytest.mark.parametrize("workers", [0, 2])
def test_restore_seeds_cook_override_draws_energons_numbers(blend, workers):
    """A ``@stateless(restore_seeds=True)`` ``cook_crude_sample``: its ``current_sample_index`` is the
    sample's position in its own dataset (Energon cooks each dataset before concatenating them:
    b_0000 is sample 0 again) and its python, numpy and torch draws are Energon's."""
    import megatron.energon as me

    ours = _batches(er, blend, workers, draws=True)
    assert ours == _batches(me, blend, workers, draws=True)
    first_b = next(text for b in ours for key, text in b if key == "b_0000")
    assert first_b.split("|")[3] == "0"
    assert len({text.split("|", 3)[3] for b in ours for _, text in b if text.startswith("A")}) == 10


def test_a_dataset_no_cooker_matches_is_refused_when_built(blend):
    """Cookers for kind A only: Energon refuses the kind-B dataset when the loader is built
    (``ValueError``); so does energon_ray (``DatasetConfigError``, a ``ValueError``, naming the dataset
    and its subflavors). Each of its samples used to be skipped, losing the dataset."""
    import megatron.energon as me

    for lib, error in ((me, ValueError), (er, er.DatasetConfigError)):
        with pytest.raises(error, match=r"(?s)subflavors.*'kind': 'B', 'x': 1") as info:
            wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=1)
            encoder = _encoder(lib, draws=False, kinds=("A",))
            ds = lib.get_val_dataset(blend, split_part="train", batch_size=3, task_encoder=encoder, worker_config=wc)
            list(lib.get_loader(ds))
    assert "b/.nv-meta/dataset.yaml" in str(info.value) and "[{'kind': 'A'}]" in str(info.value)
