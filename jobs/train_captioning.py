"""Train a small model with ``ray.train``'s ``TorchTrainer`` on energon_ray batches, with checkpoints
that hold the loader's state, so a restarted worker group trains on exactly the batches it would have.

    python jobs/train_captioning.py [--workdir DIR] [--steps 24] [--workers 2] [--fail-at STEP]

Each train worker builds its rank's loader (rank and world size come from the train context),
moves batches to its device, and reports ``{loss}`` each step; every ``--checkpoint-every`` steps the
checkpoint folder gets the model (rank 0) and every rank's loader state
(``er.save_loader_state``). ``--fail-at K`` kills train worker 1 once at step K
(``FailureConfig(max_failures=1)`` restarts the group from the last checkpoint). ``--log-dir`` (default
``WORKDIR/logs``) records the loss and the keys every rank trained on at every step. The model regresses each image's mean colour from a
64x64 crop, so its loss goes down within a few dozen steps.

Runs on a private local Ray (2 CPUs unless ``--cpus``), or on the cluster named by RAY_ADDRESS.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

import energon_ray as er
from energon_ray.tasks.captioning import CaptioningTaskEncoder, default_train_transform
from energon_ray.tasks.run import synthetic_captioning


def build_loader(config: dict, worker_config=None):
    """This rank's savable loader (rank and world size from the ray.train context, unless given)."""
    encoder = CaptioningTaskEncoder(image_transform=default_train_transform(64), max_length=16)
    dataset = er.get_train_dataset(
        config["path"], split_part="train", batch_size=config["batch_size"], shuffle_buffer_size=32,
        max_samples_per_sequence=16, task_encoder=encoder,
        worker_config=worker_config or er.WorkerConfig.default_worker_config(num_workers=2),
    )  # fmt: skip
    return er.get_savable_loader(dataset)


def train_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    device = ray.train.torch.get_device()
    model = ray.train.torch.prepare_model(nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)))
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-2)
    loader = build_loader(config)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            saved = torch.load(os.path.join(folder, "model.pt"), weights_only=True)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            start = saved["step"] + 1
            er.restore_loader_state(loader, folder)
    batches = iter(loader)
    log = Path(config["log_dir"]) / f"keys_rank{rank}.jsonl"
    for step in range(start, config["steps"]):
        batch = next(batches)
        images = batch.images.to(device, non_blocking=True)
        target = images.mean(dim=(2, 3))
        loss = nn.functional.mse_loss(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with open(log, "a") as f:
            f.write(json.dumps({"step": step, "loss": float(loss), "keys": list(batch.__keys__), "resumed": start > 0}) + "\n")
        marker = Path(config["log_dir"]) / "failed_once"
        if config.get("fail_at") == step and rank == 1 and not marker.exists():
            marker.write_text("1")
            os._exit(1)  # a worker process dies (no exception, no cleanup)
        metrics = {"loss": float(loss), "step": step}
        if (step + 1) % config["checkpoint_every"] == 0:
            with tempfile.TemporaryDirectory() as folder:
                if rank == 0:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                               os.path.join(folder, "model.pt"))  # fmt: skip
                er.save_loader_state(loader, folder)
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)
    loader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "energon_ray_train_captioning"))
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the private local Ray (ignored with RAY_ADDRESS)")
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args()

    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    workdir = Path(args.workdir)
    log_dir = Path(args.log_dir or workdir / "logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    path = synthetic_captioning(workdir / "dataset", args.samples, 40, (96, 72), split_ratio=(1, 0, 0), progress=False)
    config = {"path": str(path), "steps": args.steps, "batch_size": args.batch_size, "checkpoint_every": args.checkpoint_every,
              "fail_at": args.fail_at, "log_dir": str(log_dir)}  # fmt: skip
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        # fractional CPUs: the train workers mostly wait for batches, the segment tasks need the cores
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=torch.cuda.is_available(), resources_per_worker={"CPU": 0.25}),
        run_config=RunConfig(
            name="train_captioning", storage_path=str(workdir / "runs"),
            failure_config=FailureConfig(max_failures=1), checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),  # fmt: skip
    )
    result = trainer.fit()
    print(f"trained {args.steps} steps on {args.workers} workers; final loss {result.metrics['loss']:.5f}")
    rank0 = log_dir / "keys_rank0.jsonl"
    if rank0.exists():  # on this machine (a local Ray; on a cluster rank 0 may run elsewhere)
        by_step = {e["step"]: e["loss"] for e in map(json.loads, rank0.read_text().splitlines())}
        losses = [by_step[s] for s in sorted(by_step)]
        print(f"loss: first 3 steps {sum(losses[:3]) / 3:.5f}, last 3 steps {sum(losses[-3:]) / 3:.5f}")
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else None}")


if __name__ == "__main__":
    main()
