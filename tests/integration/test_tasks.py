"""The built-in tasks train on their generated data (loss falls), the training loader's state
travels in Lightning checkpoints, and the same task runs under ray.train with 2 workers — all on
the session's 2-CPU Ray."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import List

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.trainer.connectors import data_connector

from energon_ray.train import compose
from energon_ray.train.config import BUILTIN_TASKS
from energon_ray.train.fit import fit, fit_here

#: Every task: mean loss of its last 3 steps below this fraction of its first step's loss. Measured
#: at 12 steps with seeds 0-3: ratios at most 0.74 (captioning), 0.79 (igpt with classify), 0.55 (vqa), 0.76 (lm).
MARGIN = 0.9
STEPS = 12


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    """One work dir for the module: each synthetic dataset is generated once."""
    return str(tmp_path_factory.mktemp("tasks_work"))


def _cfg(work_dir: str, task: str, *overrides: str):
    return compose([
        f"+task={task}", f"+dataset={BUILTIN_TASKS[task]}", f"work_dir={work_dir}", "seed=0",
        "trainer.enable_progress_bar=false", "trainer.enable_checkpointing=false", "trainer.callbacks=[]", *overrides,
    ])  # fmt: skip


@pytest.mark.parametrize("task", sorted(BUILTIN_TASKS))
def test_task_trains_and_its_loss_falls(work_dir, task, caplog):
    """STEPS steps on generated data, one validation at the end: loss(last 3) < MARGIN * loss(first); quiet:
    none of Lightning's info lines (hardware, tips to install its products) and no deprecation of its internals."""
    extra = ["task.classify=true"] if task == "vision/igpt" else []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(_cfg(work_dir, task, f"trainer.max_steps={STEPS}", f"trainer.val_check_interval={STEPS}", *extra))
    assert [r.getMessage() for r in caplog.records if r.name.startswith("lightning") and r.levelno < logging.WARNING] == []
    assert [str(w.message) for w in caught if "LeafSpec" in str(w.message)] == []
    assert (result.global_step, result.world_size, len(result.losses)) == (STEPS, 1, STEPS)
    first, last = result.losses[0], sum(result.losses[-3:]) / 3
    assert last < MARGIN * first, result.losses
    assert torch.isfinite(torch.tensor(result.metrics["val_loss"]))
    if task == "vision/igpt":
        assert 0.0 <= result.metrics["train_accuracy"] <= 1.0


class _Keys(pl.Callback):
    """The sample keys of every training batch."""

    def __init__(self) -> None:
        self.keys: List[List[str]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.keys.append(list(batch.__keys__))


def test_lightning_checkpoint_continues_on_the_next_batches(work_dir):
    """fit(ckpt_path) of a step-3 checkpoint trains steps 4-6 on exactly the batches an uninterrupted run did
    (the checkpointed run used the Ray Data executor, set by `loader.executor`: states do not depend on it),
    without Lightning's warnings that the data of a resumed run are unreliable or a hook is overridden."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    def run(steps: int, *callbacks, ckpt_path=None, overrides=()):
        keys = _Keys()
        saving = [f"trainer.enable_checkpointing={bool(callbacks)}"]
        cfg = _cfg(work_dir, "vision/captioning", f"trainer.max_steps={steps}", "trainer.limit_val_batches=0", *saving, *overrides)
        result = fit_here(cfg, callbacks=[keys, *callbacks], ckpt_path=ckpt_path)
        return keys.keys, result

    expected, _ = run(6)
    saver = instantiate(OmegaConf.create({"_target_": "lightning.pytorch.callbacks.ModelCheckpoint", "dirpath": os.path.join(work_dir, "ckpt"), "every_n_train_steps": 3}))
    first, _ = run(3, saver, overrides=["loader.executor=ray_data"])
    path = os.path.join(work_dir, "ckpt", os.listdir(os.path.join(work_dir, "ckpt"))[0])
    checkpoint = torch.load(path, weights_only=True)
    states = checkpoint["EnergonDataModule"]["train_loader_states"]
    assert [(s["rank"], s["world_size"], s["num_workers"]) for s in states] == [(0, 1, 2)]
    data_connector.warning_cache.clear()  # Lightning warns once per process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, result = run(6, ckpt_path=path)
    assert first == expected[:3]
    assert resumed == expected[3:] and result.global_step == 6
    # the loader is resumable (its state is the datamodule's part of the checkpoint) and its batches
    # move by Lightning's own transfer: Lightning says neither that the restored data are unreliable
    # nor that a module's transfer hook overrides a datamodule's
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "not resumable" in m or "transfer_batch_to_device" in m], said


def test_ray_train_runs_the_task_on_two_workers_and_the_command_line_on_a_private_ray_logs_no_cleaner_noise(work_dir, tmp_path):
    """trainer.ray.num_workers=2: TorchTrainer on the session Ray (0.25 CPU each), one rank per worker; the
    reported Lightning checkpoint holds both ranks' loader states. A second fit, the command line on the private
    Ray it starts (no dashboard), continues from it with ckpt_path and dataset.path relative to the caller's
    directory (ray.train workers run in their run's folder: they looked for both there and failed); so are its
    test_path and a ModelCheckpoint's dirpath (the test split was looked for, and the checkpoints written, in
    the worker's folder). Ray Train's PlacementGroupCleaner, which asks the dashboard's State API, said nothing
    there (it logged "Failed to query Ray Train Controller actor state" every second, or its thread's traceback
    where other Ray instances run, as this session's does); rank 0's progress bar and losses, and the result,
    still show. One test: every ray.train run starts a controller and its workers (seconds each)."""
    overrides = ("trainer.limit_val_batches=0", "trainer.ray.num_workers=2", "dataset.virtual_epoch_length=4")
    result = fit(_cfg(work_dir, "vision/captioning", "trainer.max_steps=4", *overrides))
    assert (result.global_step, result.world_size, len(result.losses)) == (4, 2, 4)
    assert all(torch.isfinite(torch.tensor(result.losses)))
    checkpoint = torch.load(os.path.join(result.checkpoint, "checkpoint.ckpt"), weights_only=True)
    states = checkpoint["EnergonDataModule"]["train_loader_states"]
    assert [(s["rank"], s["world_size"]) for s in states] == [(0, 2), (1, 2)]
    assert checkpoint["global_step"] == 4

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ENERGON_RAY_VERBOSE")}
    env["PYTHONPATH"] = str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")
    relative = (f"ckpt_path={os.path.relpath(result.checkpoint, work_dir)}", "dataset.path=data/vision_captioning_synthetic", "dataset.prepare=null",
                "test=true", "+dataset.test_path=data/vision_captioning_synthetic", "trainer.enable_checkpointing=true",
                "trainer.callbacks=[{_target_: lightning.pytorch.callbacks.ModelCheckpoint, dirpath: own_ckpts, save_last: true}]")  # fmt: skip
    argv = ["+task=vision/captioning", "+dataset=vision/captioning/synthetic", f"work_dir={work_dir}", "seed=0", "trainer.max_steps=6",
            *overrides, *relative, f"trainer.ray.storage_path={tmp_path / 'ray_results'}", f"hydra.run.dir={tmp_path / 'out'}"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "energon_ray.train", *argv], capture_output=True, text=True, env=env,
                          timeout=300, cwd=work_dir)  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-3000:]
    assert "PlacementGroupCleaner" not in said and "State API" not in said, said[-3000:]
    # the resumed run's result: 6 steps on 2 ranks, 2 losses of its own (the summary names how many it averaged), a test loss
    assert "trained 6 steps on 2 rank(s)" in proc.stdout, said[-3000:]
    assert re.search(r"^loss: first 2 steps [\d.]+, last 2 steps [\d.]+$", proc.stdout, re.M), said[-3000:]
    assert re.search(r"^test_loss: ", proc.stdout, re.M), said[-3000:]
    assert "Epoch 1: " in said and "train_loss=" in said, said[-3000:]  # it resumed at the start of epoch 1
    assert torch.load(os.path.join(work_dir, "own_ckpts", "last.ckpt"), weights_only=True)["global_step"] == 6


class _OwnModule(pl.LightningModule):
    """A LightningModule of a user's own: no batch-transfer hook, so Lightning moves each batch itself."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.seen: List[tuple] = []

    def training_step(self, batch, batch_idx):
        shards = [source.shard_name for sources in batch.__sources__ for source in sources]  # each sample's sources
        self.seen.append((batch.image.device.type, shards, list(batch.__key__)))
        return (batch.image.float().mean() * self.weight) ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_lightning_module_of_your_own_trains_on_batches_that_hold_their_sources(tmp_path):
    """EnergonDataModule's DefaultTaskEncoder batches hold the samples' (frozen) SourceInfo; Lightning's own
    transfer moves them (it refused frozen dataclasses until SourceInfo had `to`): 3 steps, 4 samples each,
    every sample's shard named."""
    from energon_ray.task_encoder import DefaultTaskEncoder
    from energon_ray.tasks.datamodule import EnergonDataModule
    from energon_ray.tasks.run import synthetic_captioning

    path = synthetic_captioning(tmp_path / "own", 48, 12, image_size=(32, 24), split_ratio=(1, 0, 0), progress=False)
    data = EnergonDataModule(path, DefaultTaskEncoder(), 4, val_split=None, test_split=None, loader={"num_workers": 1})
    module = _OwnModule()
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 3 and len(module.seen) == 3
    for device, shards, keys in module.seen:
        assert device == "cpu" and len(keys) == 4 and len(shards) == 4
        assert all(shard.startswith("shards/shard_") and shard.endswith(".tar") for shard in shards)


class _OwnModuleThatValidates(_OwnModule):
    def validation_step(self, batch, batch_idx):
        return self.training_step(batch, batch_idx)


def test_fit_with_an_empty_val_split_fails_at_setup_before_any_step_unless_nothing_validates(tmp_path):
    """A module with a validation_step and a dataset whose 'val' part has no shards: fit fails at setup,
    naming the path and split (was: when Lightning first validated, after an epoch of training); without a
    validation_step, or with limit_val_batches=0, the val split is not read and fit trains."""
    from energon_ray.errors import DatasetConfigError
    from energon_ray.task_encoder import DefaultTaskEncoder
    from energon_ray.tasks.datamodule import EnergonDataModule
    from energon_ray.tasks.run import synthetic_captioning

    path = synthetic_captioning(tmp_path / "own", 16, 8, image_size=(32, 24), split_ratio=(1, 0, 0), progress=False)

    def fit(module, **trainer_kwargs):
        data = EnergonDataModule(path, DefaultTaskEncoder(), 4, test_split=None, loader={"num_workers": 1})
        trainer = pl.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, **trainer_kwargs)  # fmt: skip
        trainer.fit(module, datamodule=data)
        return trainer

    module = _OwnModuleThatValidates()
    with pytest.raises(DatasetConfigError, match=re.escape(f"EnergonDataModule: the val split 'val' of {path} cannot be read: ")):
        fit(module, num_sanity_val_steps=0)  # no sanity check to meet the split before training
    assert module.seen == []
    assert fit(_OwnModule()).global_step == 1
    assert fit(_OwnModuleThatValidates(), limit_val_batches=0).global_step == 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.ray.num_workers=9"], "a ray.train worker (trainer.ray.num_workers=9, trainer.ray.cpus_per_worker=0.25) asks "
                                        "for CPU 0.25, 9 at once, and its nodes hold 8 (nodes: CPU 2)"),
        (["trainer.ray.num_workers=1", "trainer.ray.cpus_per_worker=3"], "a ray.train worker (trainer.ray.num_workers=1, "
                                        "trainer.ray.cpus_per_worker=3) asks for CPU 3, which no node of this Ray has (nodes: CPU 2)"),
        (["+loader.ray_remote_args.num_cpus=100"], "loader.ray_remote_args: a segment task asks for CPU 100, which no node "
                                                   "of this Ray has (nodes: CPU 2)"),
        (["trainer.ray.num_workers=1", "+loader.ray_remote_args.num_cpus=100"], "loader.ray_remote_args: a segment task asks "
                                                   "for CPU 100, which no node of this Ray has (nodes: CPU 2)"),
    ],
)  # fmt: skip
def test_command_line_names_the_ray_train_options_no_node_could_hold(tmp_path, monkeypatch, overrides, message):
    """More ray.train workers than the session's 2-CPU private Ray holds: "error: …" naming the trainer.ray
    options and exit 1 (before: a Hydra traceback of a ValueError that named no option); segment tasks asking
    for more than a node holds name loader.ray_remote_args as written (before: get_loader's keyword only)."""
    import sys

    from energon_ray.train.__main__ import main

    argv = ["energon_ray.train", "+task=vision/captioning", "+dataset=vision/captioning/synthetic", f"work_dir={tmp_path}",
            *overrides, f"hydra.run.dir={tmp_path / 'out'}"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as caught:
        main()
    assert caught.value.code == f"error: {message}; this private local Ray has no autoscaler to add a node, so it would wait forever"
