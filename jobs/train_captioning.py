"""Train a small model with ``ray.train``'s ``TorchTrainer`` on energon_ray batches, with checkpoints
that hold the loader's state, so a restarted worker group trains on exactly the batches it would have.

    python jobs/train_captioning.py [--workdir DIR] [--name NAME] [--resume | --fresh] [--steps 24] [--workers 2] [--fail-at STEP]

Each train worker builds its rank's loader (rank and world size come from the train context),
moves batches to its device and trains; every ``--checkpoint-every`` steps it reports ``{loss, step}``
with a checkpoint folder that holds the model (rank 0) and every rank's loader state
(``er.save_loader_state``), and it reports the last step's loss. ``--fail-at K`` kills train worker 1 once at step K
(``FailureConfig(max_failures=1)`` restarts the group from the last checkpoint). ``--log-dir`` (default
``WORKDIR/logs``) records the loss and the keys every rank trained on at every step. The model regresses each image's mean colour from a
64x64 crop, so its loss goes down within a few dozen steps.

The run's checkpoints go to ``WORKDIR/runs/NAME``. A run there that already has a checkpoint is never
continued or overwritten silently: ``--resume`` continues it from its latest checkpoint (the same
``--batch-size``, ``--samples`` and ``--workers``; a job that Ray may start again after a crash, e.g. a
retried ``ray job submit``, passes ``--resume``, which starts afresh when there is no checkpoint yet),
``--fresh`` deletes it and starts over, and without either the job stops with a usage error (exit 2).

Runs on a private local Ray (2 CPUs unless ``--cpus``), or on the cluster named by RAY_ADDRESS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

import energon_ray as er
from energon_ray.errors import DatasetConfigError
from energon_ray.ray_env import UnschedulableError, check_resources, ensure_ray, torch_trainer_class
from energon_ray.tasks.captioning import CaptioningTaskEncoder, default_train_transform
from energon_ray.tasks.job_args import positive_int
from energon_ray.tasks.run import synthetic_captioning

#: Ray Train (v2) lists a run's checkpoints in this file of the run's folder, and a fit() with the same
#: RunConfig(name, storage_path) restores the latest one listed (``ray.train.get_checkpoint()``).
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"
#: The options a run was started with (its folder); a resumed run must keep them, or its loaders cannot restore.
RUN_OPTIONS = "job_options.json"
#: A train worker's CPUs: a fraction, as it mostly waits for batches and the segment tasks need the cores.
WORKER_CPUS = 0.25


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
        # ray.train.report is a sync point: Ray Train takes one report per worker every 2 s (its health-check
        # poll), so a report per step would hold every step that long; report with checkpoints and at the end
        if (step + 1) % config["checkpoint_every"] == 0:
            with tempfile.TemporaryDirectory() as folder:
                if rank == 0:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                               os.path.join(folder, "model.pt"))  # fmt: skip
                er.save_loader_state(loader, folder)
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
        elif step == config["steps"] - 1:
            ray.train.report(metrics)
    loader.close()


class RunConflict(Exception):
    """The run folder's checkpoint and the options disagree on what to do (a usage error)."""


class RunPlan(NamedTuple):  # not a dataclass, which needs its module in sys.modules (tests load this file by path)
    """What this invocation does with the run: train steps ``start``..steps-1, afresh or from ``checkpoint``."""

    start: int
    checkpoint: Optional[Path]
    delete: bool  # --fresh over an existing checkpoint: the run folder goes first
    message: str


def latest_checkpoint(run_dir: Path) -> Optional[Tuple[int, Path]]:
    """``(step, folder)`` of the checkpoint Ray Train would restore for the run in ``run_dir``, if any."""
    snapshot = run_dir / RAY_SNAPSHOT
    if not snapshot.is_file():
        return None
    try:
        latest = json.loads(snapshot.read_text()).get("latest_checkpoint_result")
        return None if latest is None else (int(latest["metrics"]["step"]), run_dir / latest["checkpoint_dir_name"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RunConflict(f"{snapshot}: cannot tell the run's latest checkpoint ({type(exc).__name__}: {exc}); "
                          "pass --fresh to delete the run, or another --name") from None  # fmt: skip


def plan_run(run_dir: Path, name: str, steps: int, options: Dict[str, int], resume: bool = False, fresh: bool = False) -> RunPlan:
    """Start run ``name`` afresh, or resume it from its latest checkpoint in ``run_dir`` (only with ``resume``).

    Raises:
        RunConflict: the run has a checkpoint and neither ``resume`` nor ``fresh`` is set; or resuming
            it with other ``options`` than it was started with, or with no step left below ``steps``.
    """
    latest = latest_checkpoint(run_dir)
    if latest is None:
        note = " (--resume: it has no checkpoint yet)" if resume else ""
        return RunPlan(0, None, False, f"starting run {name!r} in {run_dir}{note}: training steps 0-{steps - 1}")
    step, folder = latest
    if fresh:
        return RunPlan(0, None, True, f"starting run {name!r} afresh in {run_dir} (--fresh: deleting its checkpoint "
                                      f"at step {step}): training steps 0-{steps - 1}")  # fmt: skip
    if not resume:
        raise RunConflict(f"{run_dir} already holds run {name!r}, with a checkpoint at step {step}: pass --resume to "
                          "continue it, --fresh to delete it and start over, or another --name or --workdir")  # fmt: skip
    saved = json.loads((run_dir / RUN_OPTIONS).read_text()) if (run_dir / RUN_OPTIONS).is_file() else {}
    changed = [f"--{key.replace('_', '-')} {value} (the run has {saved[key]})" for key, value in options.items()
               if key in saved and saved[key] != value]  # fmt: skip
    if changed:
        raise RunConflict(f"cannot resume run {name!r} from its checkpoint at step {step} ({folder}) with "
                          f"{', '.join(changed)}: resume with the run's values, or pass --fresh")  # fmt: skip
    if step + 1 >= steps:
        raise RunConflict(f"run {name!r} has already trained steps 0-{step} (checkpoint {folder}): --steps {steps} "
                          f"leaves nothing to train; pass --steps above {step + 1}, or --fresh")  # fmt: skip
    return RunPlan(step + 1, folder, False, f"resuming run {name!r} from its checkpoint at step {step} ({folder}): "
                                            f"training steps {step + 1}-{steps - 1}")  # fmt: skip


def start_run(plan: RunPlan, run_dir: Path, log_dir: Path, options: Dict[str, int]) -> None:
    """Apply ``plan`` to the folders: a fresh run deletes the old run and the old key logs and records
    its options; every invocation may fail once again at ``--fail-at`` (the marker goes)."""
    if plan.delete:
        shutil.rmtree(run_dir)
    (log_dir / "failed_once").unlink(missing_ok=True)
    if plan.start == 0:
        for old in log_dir.glob("keys_rank*.jsonl"):
            old.unlink()
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_OPTIONS).write_text(json.dumps(options))


def start_ray(cpus: int, workers: int) -> None:
    """The Ray to train on (the one running, RAY_ADDRESS's cluster, or a private local one of ``cpus``
    CPUs), checked to hold ``workers`` train workers.

    Raises:
        ConnectionError: RAY_ADDRESS names a host:port nothing answers at.
        UnschedulableError: a private local Ray that could never hold the train workers.
    """
    options = {"log_to_driver": False} if os.environ.get("RAY_ADDRESS") else {"num_cpus": cpus, "log_to_driver": False}
    ensure_ray(**options)
    needs = {"CPU": WORKER_CPUS, **({"GPU": 1.0} if torch.cuda.is_available() else {})}  # as ScalingConfig asks
    check_resources(needs, f"a train worker (--workers {workers})", count=workers)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--workdir", default=os.path.join(tempfile.gettempdir(), "energon_ray_train_captioning"),
        help="the dataset, the logs and runs/NAME (default: %(default)s)")  # fmt: skip
    add("--name", default="train_captioning", help="the run's name: its checkpoints go to WORKDIR/runs/NAME (default: %(default)s)")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run from its latest checkpoint (start it if it has none)")
    again.add_argument("--fresh", action="store_true", help="delete the run's checkpoints (WORKDIR/runs/NAME) and start over")
    add("--samples", type=positive_int, default=240, help="samples of the generated dataset (made once per --workdir: another count needs another --workdir, or WORKDIR/dataset deleted; default: %(default)s)")
    add("--steps", type=positive_int, default=24, help="train steps 0..STEPS-1 (a resumed run trains those left; default: %(default)s)")
    add("--batch-size", type=positive_int, default=8, help="samples per batch of each train worker (default: %(default)s)")
    add("--workers", type=positive_int, default=2, help="train workers (default: %(default)s)")
    add("--cpus", type=positive_int, default=2, help="CPUs of the private local Ray (ignored with RAY_ADDRESS; default: %(default)s)")
    add("--checkpoint-every", type=positive_int, default=4, metavar="N", help="a checkpoint after every N steps (default: %(default)s)")
    add("--fail-at", type=int, default=None, metavar="STEP", help="kill train worker 1 once at STEP (needs --workers 2 or more)")
    add("--log-dir", default=None, help="loss and keys per rank and step (default: WORKDIR/logs; a fresh run replaces the key logs)")
    return parser


def _checked(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.name in ("", ".", "..") or os.sep in args.name or "/" in args.name:
        parser.error(f"--name must be a folder name (no '/'), got {args.name!r}")
    if args.fail_at is not None:
        if args.workers < 2:
            parser.error(f"--fail-at {args.fail_at} kills train worker 1, so it needs --workers 2 or more, got --workers {args.workers}")
        if not 0 <= args.fail_at < args.steps:
            parser.error(f"--fail-at {args.fail_at} is never reached: --steps {args.steps} trains steps 0-{args.steps - 1}")
    return args


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The job's options; a bad one, or one that would do nothing, exits with a usage error (2)."""
    return _checked(_parser(), argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = _parser()
    args = _checked(parser, argv)
    workdir = Path(os.path.abspath(args.workdir))  # Ray Train takes an absolute storage path, and workers have other cwds
    run_dir, log_dir = workdir / "runs" / args.name, Path(os.path.abspath(args.log_dir or workdir / "logs"))
    options = {"samples": args.samples, "batch_size": args.batch_size, "workers": args.workers}
    try:  # before Ray starts: a run that must not go on stops at once
        plan = plan_run(run_dir, args.name, args.steps, options, resume=args.resume, fresh=args.fresh)
    except RunConflict as exc:
        parser.error(str(exc))
    try:  # the dataset, written once per --workdir: one of other --samples stops the job here
        path = synthetic_captioning(workdir / "dataset", args.samples, 40, (96, 72), split_ratio=(1, 0, 0), progress=False)
        log_dir.mkdir(parents=True, exist_ok=True)
        start_run(plan, run_dir, log_dir, options)
    except DatasetConfigError as exc:
        parser.error(str(exc))
    except OSError as exc:  # e.g. --workdir or --log-dir is a file
        parser.error(f"--workdir {args.workdir} / --log-dir {log_dir}: cannot write there: {exc}")
    print(plan.message, flush=True)

    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    try:
        start_ray(args.cpus, args.workers)
    except ConnectionError as exc:  # RAY_ADDRESS names a cluster nothing answers at (ray.init would wait without end)
        sys.exit(f"train_captioning: {exc}")
    except UnschedulableError as exc:  # TorchTrainer would wait without end for workers no node holds
        parser.error(str(exc))
    config = {"path": str(path), "steps": args.steps, "batch_size": args.batch_size, "checkpoint_every": args.checkpoint_every,
              "fail_at": args.fail_at, "log_dir": str(log_dir)}  # fmt: skip
    trainer = torch_trainer_class()(
        train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=torch.cuda.is_available(), resources_per_worker={"CPU": WORKER_CPUS}),
        run_config=RunConfig(
            name=args.name, storage_path=str(workdir / "runs"),
            failure_config=FailureConfig(max_failures=1), checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),  # fmt: skip
    )
    result = trainer.fit()
    trained = f"steps {plan.start}-{args.steps - 1} ({args.steps - plan.start} steps"
    trained += f", resumed from the checkpoint at step {plan.start - 1})" if plan.start else ")"
    print(f"trained {trained} on {args.workers} workers; final loss {result.metrics['loss']:.5f}")
    rank0 = log_dir / "keys_rank0.jsonl"
    if rank0.exists():  # on this machine (a local Ray; on a cluster rank 0 may run elsewhere)
        by_step = {e["step"]: e["loss"] for e in map(json.loads, rank0.read_text().splitlines())}
        losses = [by_step[s] for s in sorted(by_step)]
        print(f"loss: first 3 steps {sum(losses[:3]) / 3:.5f}, last 3 steps {sum(losses[-3:]) / 3:.5f}")
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else None}")


if __name__ == "__main__":
    main()
