"""The built-in tasks train on their generated data (loss falls), the training loader's state
travels in Lightning checkpoints, and the same task runs under ray.train with 2 workers — all on
the session's 2-CPU Ray."""

from __future__ import annotations

import os
from typing import List

import lightning.pytorch as pl
import pytest
import torch

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
def test_task_trains_and_its_loss_falls(work_dir, task):
    """STEPS steps on generated data, one validation at the end: loss(last 3) < MARGIN * loss(first)."""
    extra = ["task.classify=true"] if task == "vision/igpt" else []
    result = fit(_cfg(work_dir, task, f"trainer.max_steps={STEPS}", f"trainer.val_check_interval={STEPS}", *extra))
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
    (the checkpointed run used the Ray Data executor, set by `loader.executor`: states do not depend on it)."""
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
    resumed, result = run(6, ckpt_path=path)
    assert first == expected[:3]
    assert resumed == expected[3:] and result.global_step == 6


def test_ray_train_runs_the_task_on_two_workers(work_dir):
    """trainer.ray.num_workers=2: TorchTrainer on the session Ray (0.25 CPU each), one rank per worker; the
    reported Lightning checkpoint holds both ranks' loader states."""
    result = fit(_cfg(work_dir, "vision/captioning", "trainer.max_steps=4", "trainer.limit_val_batches=0", "trainer.ray.num_workers=2",
                      "dataset.virtual_epoch_length=4"))  # fmt: skip
    assert (result.global_step, result.world_size, len(result.losses)) == (4, 2, 4)
    assert all(torch.isfinite(torch.tensor(result.losses)))
    checkpoint = torch.load(os.path.join(result.checkpoint, "checkpoint.ckpt"), weights_only=True)
    states = checkpoint["EnergonDataModule"]["train_loader_states"]
    assert [(s["rank"], s["world_size"]) for s in states] == [(0, 2), (1, 2)]
    assert checkpoint["global_step"] == 4
