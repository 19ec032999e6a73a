"""Captioning on Ray: generate a small dataset, prepare it, run the documents' task encoder.

    python jobs/captioning_job.py [--config jobs/captioning.yaml] [--workdir DIR] [--max-batches N]

Runs on a private local Ray started by energon_ray, or on the cluster named by RAY_ADDRESS
(``ray job submit`` sets it).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import yaml

import energon_ray as er
from energon_ray.tasks.captioning import CaptioningTaskEncoder, default_train_transform
from energon_ray.tasks.run import drive, synthetic_captioning


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(Path(__file__).with_name("captioning.yaml")))
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--max-batches", type=int, default=None)
    args = parser.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    workdir = Path(args.workdir or cfg["workdir"])
    d, lc, tc = cfg["dataset"], cfg["loader"], cfg["task"]
    path = synthetic_captioning(workdir / "dataset", d["num_samples"], d["samples_per_shard"], tuple(d["image_size"]))
    print(f"dataset: {path}")

    encoder = CaptioningTaskEncoder(image_transform=default_train_transform(tc["image_size"]), max_length=tc["max_length"])
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
    loader = er.get_loader(dataset)
    print(f"{dataset}: {len(loader)} batches per epoch")

    def show(index: int, batch) -> None:
        if index < 2:
            print(
                f"batch {index}: images {tuple(batch.images.shape)} {batch.images.dtype}, "
                f"text_tokens {tuple(batch.text_tokens.shape)}, keys {batch.__keys__[:3]}..."
            )

    stats = drive(
        loader,
        max_batches=args.max_batches or lc["max_batches"],
        batch_len=lambda b: len(b.__keys__),
        on_batch=show,
        total=len(loader),
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
