"""``EnergonDataModule`` in Lightning: a resumed or reloaded training loader goes on with the batches an
uninterrupted run trains on (a tiny dataset, a one-parameter module, a few steps each)."""

from __future__ import annotations

import os
from typing import List

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from energon_ray.task_encoder import DefaultTaskEncoder
from energon_ray.tasks.datamodule import EnergonDataModule
from tests.helpers import captioning_dataset


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return captioning_dataset(tmp_path_factory.mktemp("dm_resume") / "ds", n=40, per_shard=6)


class _Keys(pl.LightningModule):
    """Records the keys of every training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.keys: List[List[str]] = []

    def training_step(self, batch, batch_idx):
        self.keys.append(list(batch.__key__))
        return (batch.image.float().mean() * self.weight) ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(path, ckpt_path=None, callbacks=(), virtual_epoch_length=0, **trainer_kwargs):
    data = EnergonDataModule(path, DefaultTaskEncoder(), 4, val_split=None, test_split=None, loader={"num_workers": 2},
                             shuffle_buffer_size=5, max_samples_per_sequence=3, virtual_epoch_length=virtual_epoch_length)  # fmt: skip
    module = _Keys()
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=bool(callbacks), callbacks=list(callbacks),
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, **trainer_kwargs)  # fmt: skip
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return module.keys, trainer


def test_an_epoch_end_checkpoint_of_an_epochized_loader_resumes_on_a_full_epoch(path, tmp_path):
    """virtual_epoch_length=3, max_epochs=3, resumed from the checkpoint of epoch 0's end: the next two
    epochs are trained in full (6 steps, the uninterrupted run's batches). The state said 3 items of
    the epoch were taken, so the restored loader's first iter() was empty: 3 steps, one epoch lost."""
    expected, _ = _fit(path, virtual_epoch_length=3, max_epochs=3)
    assert len(expected) == 9
    _fit(path, callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)], virtual_epoch_length=3, max_epochs=1)
    resumed, trainer = _fit(path, ckpt_path=os.path.join(tmp_path, "epoch=0-step=3.ckpt"), virtual_epoch_length=3, max_epochs=3)
    assert (trainer.global_step, resumed) == (9, expected[3:])


def test_a_checkpoint_saved_after_fit_keeps_the_loader_position(path, tmp_path):
    """trainer.save_checkpoint() after fit(max_steps=3) (Lightning's documented way to save at the end):
    the datamodule had closed its loader at teardown and saved no state, so a run resumed from that
    checkpoint trained on the first batches again."""
    expected, _ = _fit(path, max_steps=6)
    first, trainer = _fit(path, max_steps=3)
    trainer.save_checkpoint(tmp_path / "end.ckpt")
    states = torch.load(tmp_path / "end.ckpt", weights_only=True)["EnergonDataModule"]["train_loader_states"]
    assert [(s["rank"], s["world_size"]) for s in states] == [(0, 1)]
    resumed, trainer = _fit(path, ckpt_path=tmp_path / "end.ckpt", max_steps=6)
    assert first == expected[:3]
    assert (trainer.global_step, resumed) == (6, expected[3:])


def test_reloaded_training_loaders_go_on_with_the_stream(path):
    """reload_dataloaders_every_n_epochs=1: each epoch gets a new training loader; it continues where the
    old one stopped (the batches of a run without reloads). Each new loader started from the
    beginning: every epoch trained on the same 3 batches."""
    expected, _ = _fit(path, virtual_epoch_length=3, max_steps=8)
    reloaded, _ = _fit(path, virtual_epoch_length=3, max_steps=8, reload_dataloaders_every_n_epochs=1)
    assert reloaded == expected
    assert len({tuple(keys) for keys in expected}) == 8
