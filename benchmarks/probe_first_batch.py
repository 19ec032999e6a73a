"""Where the cold first batch goes: a timeline from building the loader to its first batch.

    python benchmarks/probe_first_batch.py [--samples 600] [--cpus 2] [--delay 0]

Starts a private ``--cpus``-CPU Ray (not timed), builds bench_captioning's energon_ray loader, waits
``--delay`` seconds, iterates to the first batch and prints, relative to the moment the loader build
started: the build, the first batch, and every Ray task/actor event of Ray's timeline (task name,
start, duration, worker process) up to the first batch, so the critical path is visible (actor
creation, imports, segment tasks, the feeder's first ``take``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "energon_ray_probe_first"))
    args = parser.parse_args()

    import bench_captioning as bench
    import ray
    import torch

    torch.set_num_threads(1)
    from energon_ray.format.prepare import prepare_dataset
    from energon_ray.synthetic import write_captioning_dataset

    root = Path(args.workdir) / f"captioning_{args.samples}"
    if not (root / ".nv-meta" / ".info.json").is_file():
        write_captioning_dataset(root, args.samples, 500, image_size=(320, 240))
        prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="CaptioningSample",
                        field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
    bench._ER_OPTIONS["num_workers"] = args.cpus
    t0 = time.time()
    loader = bench._energon_ray_loader(str(root))
    built = time.time() - t0
    time.sleep(args.delay)
    t_iter = time.time() - t0
    next(iter(loader))
    first = time.time() - t0
    print(f"loader built {built:.2f}s; iter() at {t_iter:.2f}s; first batch at {first:.2f}s ({first - t_iter:.2f}s after iter())")
    rows = []
    for ev in ray.timeline():
        if "ts" not in ev:
            continue
        start = ev["ts"] / 1e6 - t0
        if start > first:
            continue
        rows.append((start, ev.get("dur", 0) / 1e6, ev.get("name", ""), ev.get("cat", ""), ev.get("pid", "")))
    by_worker = defaultdict(list)
    for row in sorted(rows):
        by_worker[row[4]].append(row)
    for worker, events in by_worker.items():
        print(f"-- worker {worker}")
        for start, dur, name, cat, _ in events:
            print(f"   {start:6.2f}s +{dur:5.2f}s  {cat:10s} {name}")
    loader.close()


if __name__ == "__main__":
    main()
