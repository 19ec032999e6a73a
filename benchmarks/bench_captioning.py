"""Captioning throughput, side by side in one run: decode floor, megatron-energon, webdataset's
WebLoader, plain Ray ``read_webdataset`` + ``map_batches``, and energon_ray.

Workload (the same for all): 6000 JPEGs 320x240 + captions in tar shards, batch 32,
decode → resize to 224x224 → float → tokenize the batch's captions.

    python benchmarks/bench_captioning.py [--samples 6000] [--runs 3] [--workdir /tmp/er_bench]

Prints, per contender: samples/s over the pass and after the first batch (medians of the runs),
time to first batch, machine-wide CPU-seconds per pass, peak memory growth, and ratios to Energon.
"""

from __future__ import annotations

import argparse
import gc
import glob
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List

import numpy as np
import torch
import torch.nn.functional as F

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")

BATCH = 32
SIZE = 224


def resize(image: torch.Tensor) -> torch.Tensor:
    """(C,H,W) float in [0,1] → (C,224,224)."""
    return F.interpolate(image[None], size=(SIZE, SIZE), mode="bilinear", align_corners=False)[0]


def tokenizer():
    from energon_ray.tasks.tokenizer import HashTokenizer

    return HashTokenizer(max_length=64)


# -- measurement -----------------------------------------------------------------------------


def _cpu_busy_seconds() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def _used_memory() -> int:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


class MemoryPeak:
    """Peak of machine-wide used memory above the starting level, sampled every 50 ms."""

    def __enter__(self):
        self.base = self.peak = _used_memory()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, _used_memory())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.base


def measure(make_iter: Callable[[], Iterable], count: Callable[[object], int], expected: int) -> Dict[str, float]:
    """One pass: wall time, first batch, steady samples/s, CPU seconds, memory growth."""
    gc.collect()
    cpu0 = _cpu_busy_seconds()
    with MemoryPeak() as mem:
        start = time.perf_counter()
        first = None
        samples = 0
        for batch in make_iter():
            samples += count(batch)
            if first is None:
                first = time.perf_counter()
                first_samples = samples
        end = time.perf_counter()
    if samples != expected:
        raise RuntimeError(f"pass yielded {samples} samples, expected {expected}")
    return {
        "sps": samples / (end - start),
        "steady": (samples - first_samples) / (end - first),
        "first": first - start,
        "cpu": _cpu_busy_seconds() - cpu0,
        "mem": mem.growth / 2**20,
    }


# -- contenders --------------------------------------------------------------------------------


def floor_iter(shards: List[str]):
    """Decode floor: one process, tarfile + PIL, the same transforms, no loader."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    tok = tokenizer()

    def gen():
        images, captions = [], []
        for shard in shards:
            with tarfile.open(shard) as tar:
                parts = {}
                for member in tar:
                    key, ext = member.name.split(".", 1)
                    parts[ext] = tar.extractfile(member).read()
                    if "jpg" in parts and "txt" in parts and "json" in parts:
                        img = np.asarray(Image.open(io.BytesIO(parts["jpg"])).convert("RGB"))
                        t = torch.from_numpy(img).permute(2, 0, 1).float() / 255
                        images.append(resize(t))
                        captions.append(parts["txt"].decode())
                        parts = {}
                        if len(images) == BATCH:
                            yield torch.stack(images), tok(captions)
                            images, captions = [], []
        if images:
            yield torch.stack(images), tok(captions)

    return gen()


def make_energon_encoder(module):
    from dataclasses import dataclass

    @dataclass
    class RawBatch:
        __key__: list
        image: torch.Tensor
        caption: list

    class Encoder(module.DefaultTaskEncoder):
        def __init__(self):
            super().__init__(batch_type=RawBatch)
            self.tok = tokenizer()

        def encode_sample(self, sample):
            sample.image = resize(sample.image)
            return sample

        def batch(self, samples):
            return self._batch(samples, result_type=RawBatch, actions={"image": module.batch_stack, "caption": module.batch_list}) if module.__name__ == "energon_ray" else RawBatch(
                __key__=[s.__key__ for s in samples], image=module.batch_stack([s.image for s in samples]), caption=[s.caption for s in samples]
            )

        def encode_batch(self, batch):
            return {"keys": batch.__key__, "images": batch.image, **self.tok(batch.caption)}

    return Encoder


def energon_iter(path: str):
    import megatron.energon as me

    Encoder = make_energon_encoder(me)
    wc = me.WorkerConfig(rank=0, world_size=1, num_workers=2)
    ds = me.get_train_dataset(
        path, split_part="train", worker_config=wc, batch_size=BATCH, shuffle_buffer_size=100,
        max_samples_per_sequence=100, repeat=False, task_encoder=Encoder(),
    )  # fmt: skip
    return iter(me.get_loader(ds))


_ER_LOADER = {}
_ER_OPTIONS = {}


def energon_ray_iter(path: str):
    import energon_ray as er

    if "loader" not in _ER_LOADER:
        Encoder = make_energon_encoder(er)
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = er.get_train_dataset(
            path, split_part="train", worker_config=wc, batch_size=BATCH, shuffle_buffer_size=100,
            max_samples_per_sequence=100, repeat=False, task_encoder=Encoder(), **_ER_OPTIONS,
        )  # fmt: skip
        _ER_LOADER["loader"] = er.get_loader(ds)
    return iter(_ER_LOADER["loader"])


def webloader_iter(shards: List[str]):
    import webdataset as wds

    tok = tokenizer()

    def to_batch(samples):
        images, captions = samples
        return torch.stack(images), tok(list(captions))

    dataset = (
        wds.WebDataset(shards, shardshuffle=False, empty_check=False)
        .decode("torchrgb")
        .map(lambda s: (resize(s["jpg"]), s["txt"]))
        .batched(BATCH, collation_fn=lambda xs: tuple(zip(*xs)))
        .map(to_batch)
    )
    return iter(wds.WebLoader(dataset, batch_size=None, num_workers=2))


def ray_iter(shards: List[str]):
    import ray.data

    tok = tokenizer()

    def transform(batch):
        import io

        import numpy as np
        from PIL import Image

        images = []
        for data in batch["jpg"]:
            img = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            t = torch.from_numpy(img).permute(2, 0, 1).float() / 255
            images.append(resize(t).numpy())
        out = tok(list(batch["txt"]))
        return {"image": np.stack(images), "input_ids": out["input_ids"].numpy(), "attention_mask": out["attention_mask"].numpy()}

    ds = ray.data.read_webdataset(shards, decoder=None, file_extensions=["tar"])
    ds = ds.map_batches(
        lambda b: {"jpg": b["jpg"], "txt": np.asarray([t.decode() for t in b["txt"]], dtype=object)}, batch_size=BATCH
    ) if False else ds
    ds = ds.map_batches(
        lambda b: transform({"jpg": b["jpg"], "txt": [t.decode() if isinstance(t, bytes) else t for t in b["txt"]]}),
        batch_size=BATCH,
        batch_format="numpy",
    )
    return iter(ds.iter_torch_batches(batch_size=BATCH, prefetch_batches=4))


# -- main ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/energon_ray_bench")
    parser.add_argument("--only", default="floor,energon,webloader,ray_data,energon_ray")
    parser.add_argument("--samples-per-segment", type=int, default=None, help="energon_ray: samples per Ray task")
    args = parser.parse_args()
    if args.samples_per_segment:
        _ER_OPTIONS["samples_per_segment"] = args.samples_per_segment

    from energon_ray.format.prepare import prepare_dataset
    from energon_ray.format.info import meta_dir
    from energon_ray.synthetic import write_captioning_dataset

    root = Path(args.workdir) / f"captioning_{args.samples}"
    if not (meta_dir(root) / ".info.json").is_file():
        print(f"writing {args.samples} samples to {root} ...")
        write_captioning_dataset(root, args.samples, 500, image_size=(320, 240))
        prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="CaptioningSample",
                        field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
    shards = sorted(glob.glob(str(root / "shards" / "*.tar")))
    n = args.samples

    def count_tuple(b):
        return b[0].shape[0]

    def count_dict(b):
        return len(b["keys"]) if "keys" in b else b["image"].shape[0]

    contenders = {
        "floor": (lambda: floor_iter(shards), count_tuple),
        "energon": (lambda: energon_iter(str(root)), count_dict),
        "webloader": (lambda: webloader_iter(shards), count_tuple),
        "ray_data": (lambda: ray_iter(shards), lambda b: b["image"].shape[0]),
        "energon_ray": (lambda: energon_ray_iter(str(root)), count_dict),
    }
    wanted = args.only.split(",")
    if "ray_data" in wanted or "energon_ray" in wanted:
        from energon_ray.loader.ray_env import ensure_ray

        ensure_ray()
    results: Dict[str, List[Dict[str, float]]] = {}
    for name in wanted:
        make, count = contenders[name]
        results[name] = []
        for run in range(args.runs):
            r = measure(make, count, n)
            results[name].append(r)
            print(f"{name:12s} run {run}: {r['sps']:7.0f}/s pass, {r['steady']:7.0f}/s steady, first {r['first']:5.2f}s, cpu {r['cpu']:6.1f}s, mem +{r['mem']:.0f} MiB", flush=True)

    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    base = med.get("energon")
    print()
    print(f"| contender | pass samples/s | steady samples/s | first batch s | CPU-s/pass | peak mem MiB | steady vs Energon |")
    print("|---|---|---|---|---|---|---|")
    for name, m in med.items():
        ratio = f"{m['steady'] / base['steady']:.2f}x" if base else "n/a"
        print(f"| {name} | {m['sps']:.0f} | {m['steady']:.0f} | {m['first']:.2f} | {m['cpu']:.1f} | {m['mem']:.0f} | {ratio} |")
    print(f"\nmedians of {args.runs} runs, {n} samples, batch {BATCH}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
