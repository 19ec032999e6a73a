"""Captioning on Ray: generate a small dataset, prepare it, run the documents' task encoder.

    python jobs/captioning_job.py [--config jobs/captioning.yaml] [--workdir DIR] [--max-batches N]

Runs on a private local Ray started by energon_ray, or on the cluster named by RAY_ADDRESS
(``ray job submit`` sets it). The config is checked before Ray starts: a file that cannot be read,
a missing section or key, an unknown (e.g. misspelt) key or a bad value is a usage error (exit 2), as
is an endless loader (``loader.repeat: true``) without a batch limit (``loader.max_batches`` or ``--max-batches``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import energon_ray as er
from energon_ray.errors import DatasetConfigError
from energon_ray.tasks.captioning import CaptioningTaskEncoder, default_train_transform
from energon_ray.tasks.job_args import (
    JobConfigError, boolean, non_negative, optional, positive, positive_int, positive_pair, read_config, text,
)  # fmt: skip
from energon_ray.tasks.run import drive, synthetic_captioning

#: Every key of the config (jobs/captioning.yaml holds them all), each with what its value must be.
SCHEMA = {
    "workdir": text,
    "dataset": {"num_samples": positive, "samples_per_shard": positive, "image_size": positive_pair},
    "loader": {
        "split_part": text, "batch_size": positive, "shuffle_buffer_size": optional(non_negative),
        "max_samples_per_sequence": optional(positive), "num_workers": positive, "repeat": boolean,
        "max_batches": optional(positive),
    },  # fmt: skip
    "task": {"image_size": positive, "max_length": positive},
}


def parse_args(argv: Optional[Sequence[str]] = None) -> Tuple[argparse.Namespace, Dict[str, Any]]:
    """The options and the checked config; a bad option or config exits with a usage error (2)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(Path(__file__).with_name("captioning.yaml")),
                        help="the job's YAML config (default: jobs/captioning.yaml, which shows every key)")  # fmt: skip
    parser.add_argument("--workdir", default=None, help="where the dataset goes (default: the config's workdir)")
    parser.add_argument("--max-batches", type=positive_int, default=None, metavar="N",
                        help="stop after N >= 1 batches (default: the config's loader.max_batches; null there: the whole epoch)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        cfg = read_config(args.config, SCHEMA)
    except JobConfigError as exc:
        parser.error(str(exc))
    if cfg["loader"]["repeat"] and cfg["loader"]["max_batches"] is None and args.max_batches is None:
        parser.error(f"{args.config}: loader.repeat is true and loader.max_batches is null: the job would never end; "
                     "set loader.max_batches or pass --max-batches N")  # fmt: skip
    return args, cfg


def main(argv: Optional[Sequence[str]] = None) -> None:
    args, cfg = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    workdir = Path(args.workdir or cfg["workdir"])
    d, lc, tc = cfg["dataset"], cfg["loader"], cfg["task"]
    try:
        path = synthetic_captioning(workdir / "dataset", d["num_samples"], d["samples_per_shard"], tuple(d["image_size"]))
    except DatasetConfigError as exc:  # e.g. the folder holds the dataset of another config's num_samples
        sys.exit(f"captioning_job: {exc}")
    except OSError as exc:  # e.g. the workdir is a file
        where = f"--workdir {args.workdir}" if args.workdir else f"{args.config}: workdir {cfg['workdir']!r}"
        sys.exit(f"captioning_job: {where}: cannot write the dataset there: {exc}")
    print(f"dataset: {path}")

    encoder = CaptioningTaskEncoder(image_transform=default_train_transform(tc["image_size"]), max_length=tc["max_length"])
    try:  # e.g. loader.split_part names no part of the dataset's split.yaml
        dataset = er.get_train_dataset(
            path,
            split_part=lc["split_part"],
            worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=lc["num_workers"]),
            batch_size=lc["batch_size"],
            shuffle_buffer_size=lc["shuffle_buffer_size"],
            max_samples_per_sequence=lc["max_samples_per_sequence"],
            repeat=lc["repeat"],
            task_encoder=encoder,
        )
    except DatasetConfigError as exc:
        sys.exit(f"captioning_job: {args.config}: the loader section does not fit the dataset: {exc}")
    asked_at = time.perf_counter()  # get_loader starts the first pass: the first batch's clock starts here
    try:
        loader = er.get_loader(dataset)
    except ConnectionError as exc:  # RAY_ADDRESS names a cluster nothing answers for
        sys.exit(f"captioning_job: {exc}")
    print(f"{dataset}: {len(loader)} batches per epoch")

    def show(index: int, batch) -> None:
        if index < 2:
            print(
                f"batch {index}: images {tuple(batch.images.shape)} {batch.images.dtype}, "
                f"text_tokens {tuple(batch.text_tokens.shape)}, keys {batch.__keys__[:3]}..."
            )

    stats = drive(
        loader,
        max_batches=args.max_batches if args.max_batches is not None else lc["max_batches"],
        batch_len=lambda b: len(b.__keys__),
        on_batch=show,
        total=len(loader),
        asked_at=asked_at,
    )
    print(
        f"{stats.samples} samples in {stats.batches} batches, {stats.seconds:.1f} s: "
        f"{stats.samples_per_second:.0f} samples/s overall, {stats.steady_samples_per_second:.0f} samples/s "
        f"after the first batch ({stats.first_batch_seconds:.1f} s to the first batch)"
    )
    print("loader stats:", json.dumps(loader.stats.as_dict()))
    print("execution stats:\n" + loader.ray_stats())


if __name__ == "__main__":
    main()
