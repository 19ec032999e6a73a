"""Blend throughput: a 3-source blend against the sources' own throughputs, in one run.

Sources (batch 32, 2 logical workers): small JPEG captions (320x240), large JPEG captions
(640x480) and text. Each source alone, then ``BlendDataset`` 0.5/0.3/0.2. The expected blend rate is
the weighted harmonic mean of the sources' rates (a blended batch costs what its source costs); the
arithmetic weighted mean is printed too.

    python benchmarks/bench_blend.py [--runs 3] [--batches 120]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")

import torch.nn.functional as F  # noqa: E402

import energon_ray as er  # noqa: E402
from energon_ray.format.info import meta_dir  # noqa: E402
from energon_ray.format.prepare import prepare_dataset  # noqa: E402
from energon_ray.synthetic import text_samples, write_captioning_dataset, write_shards  # noqa: E402
from energon_ray.tasks.tokenizer import HashTokenizer  # noqa: E402

BATCH = 32
WEIGHTS = {"small": 0.5, "large": 0.3, "text": 0.2}


class ImageEncoder(er.DefaultTaskEncoder):
    def __init__(self):
        super().__init__()
        self.tok = HashTokenizer(max_length=32)

    def encode_sample(self, sample):
        sample.image = F.interpolate(sample.image[None], size=(224, 224), mode="bilinear", align_corners=False)[0]
        return sample

    def encode_batch(self, batch):
        return {"keys": batch.__key__, "images": batch.image, **self.tok(batch.caption)}


class TextEncoder(er.DefaultTaskEncoder):
    def __init__(self):
        super().__init__()
        self.tok = HashTokenizer(max_length=32)

    def encode_batch(self, batch):
        return {"keys": batch.__key__, **self.tok(batch.text)}


def make(root: Path) -> dict:
    paths = {"small": root / "small", "large": root / "large", "text": root / "text"}
    if not (meta_dir(paths["small"]) / ".info.json").is_file():
        write_captioning_dataset(paths["small"], 1500, 250, image_size=(320, 240))
        write_captioning_dataset(paths["large"], 1500, 250, image_size=(640, 480))
        write_shards(paths["text"] / "shards", text_samples(3000), 500)
        for name in ("small", "large"):
            prepare_dataset(paths[name], split_ratio=(1, 0, 0), sample_type="CaptioningSample",
                            field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
        prepare_dataset(paths["text"], split_ratio=(1, 0, 0), sample_type="TextSample", field_map={"text": "txt"}, progress=False)
    return paths


def dataset(name: str, path: Path):
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    encoder = TextEncoder() if name == "text" else ImageEncoder()
    return er.get_train_dataset(path, worker_config=wc, batch_size=BATCH, shuffle_buffer_size=100, max_samples_per_sequence=100, task_encoder=encoder)


def rate(loader, batches: int) -> float:
    """Steady samples/s over ``batches`` batches after a warm-up of 5."""
    it = iter(loader)
    for _ in range(5):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - start
    loader.close()
    return batches * BATCH / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=120)
    parser.add_argument("--workdir", default="/tmp/energon_ray_bench/blend")
    args = parser.parse_args()
    paths = make(Path(args.workdir))
    from energon_ray.ray_env import ensure_ray

    ensure_ray()
    rates = {name: [] for name in [*WEIGHTS, "blend"]}
    for run in range(args.runs):
        for name, path in paths.items():
            rates[name].append(rate(er.get_loader(dataset(name, path)), args.batches))
        blend = er.BlendDataset(*[(dataset(name, path), WEIGHTS[name]) for name, path in paths.items()])
        rates["blend"].append(rate(er.get_loader(blend), args.batches))
        print(f"run {run}: " + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in rates.items()), flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    harmonic = 1 / sum(WEIGHTS[k] / med[k] for k in WEIGHTS)
    arithmetic = sum(WEIGHTS[k] * med[k] for k in WEIGHTS)
    print("\n| source | weight | samples/s (median) |\n|---|---|---|")
    for k in WEIGHTS:
        print(f"| {k} | {WEIGHTS[k]} | {med[k]:.0f} |")
    print(f"| blend | 1.0 | {med['blend']:.0f} |")
    print(f"\nexpected (weighted harmonic mean): {harmonic:.0f}/s → blend/expected = {med['blend'] / harmonic:.2f}")
    print(f"weighted arithmetic mean: {arithmetic:.0f}/s → blend/arithmetic = {med['blend'] / arithmetic:.2f}")
    print(f"medians of {args.runs} runs, {args.batches} batches of {BATCH} after 5 warm-up batches, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
