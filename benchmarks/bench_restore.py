"""Restore cost: time from ``restore_state_rank`` to the first batch, beside a cold first batch, and
the state's size per composition. Each measurement is a fresh process with its own private Ray.

Workload: ``bench_blend``'s sources (JPEG captions 320x240 resized to 224², text), batch 32, 2
logical workers, shuffle buffer 100. States are taken early (batch 5), late in the first epoch
(batch 40 of 47) and in the second epoch (batch 60) of the small-image source.

    python benchmarks/bench_restore.py [--runs 3] [--cpus 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

sys.path.insert(0, str(Path(__file__).parent))

CHECKPOINTS = {"early": 5, "late": 40, "epoch 2": 60}


def build(kind: str, paths: dict):
    import energon_ray as er
    from bench_blend import dataset

    if kind == "single":
        return dataset("small", paths["small"])
    if kind == "blend":
        return er.BlendDataset((dataset("small", paths["small"]), 0.6), (dataset("text", paths["text"]), 0.4))
    raise ValueError(kind)


def child(args) -> None:
    import ray

    import energon_ray as er

    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    paths = {k: Path(v) for k, v in json.loads(args.paths).items()}
    out: dict = {}
    if args.mode == "save":
        for kind in ("single", "blend"):
            loader = er.get_savable_loader(build(kind, paths))
            it = iter(loader)
            for i in range(1, max(CHECKPOINTS.values()) + 1):
                next(it)
                for name, at in CHECKPOINTS.items():
                    if at == i:
                        out[f"{kind}/{name}"] = loader.save_state_rank().to_json()
            loader.close()
    else:
        started = time.perf_counter()
        loader = er.get_savable_loader(build("single", paths))
        built = time.perf_counter()
        if args.mode != "cold":
            loader.restore_state_rank(Path(args.state).read_text())
        next(iter(loader))
        done = time.perf_counter()
        out = {"build_s": built - started, "first_s": done - built}
        loader.close()
    ray.shutdown()
    print("RESULT " + json.dumps(out))


def run(mode: str, args, paths: dict, state: str = "") -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--paths", json.dumps({k: str(v) for k, v in paths.items()}),
           "--cpus", str(args.cpus), "--state", state]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--child", dest="mode")
    parser.add_argument("--paths")
    parser.add_argument("--state", default="")
    args = parser.parse_args()
    if args.mode:
        child(args)
        return
    from bench_blend import make

    root = Path(tempfile.gettempdir()) / "energon_ray_bench_blend"
    paths = make(root)
    states = run("save", args, paths)
    folder = Path(tempfile.mkdtemp())
    print("state sizes (JSON bytes):")
    for key, text in states.items():
        print(f"  {key:<16} {len(text):>6}")
    results: dict = {"cold": []}
    for name in CHECKPOINTS:
        results[f"restore {name}"] = []
        (folder / f"{name}.json").write_text(states[f"single/{name}"])
    for _ in range(args.runs):  # interleaved, run by run
        results["cold"].append(run("cold", args, paths))
        for name in CHECKPOINTS:
            results[f"restore {name}"].append(run("restore", args, paths, str(folder / f"{name}.json")))
    print(f"\nfirst batch, medians of {args.runs} fresh processes ({args.cpus} CPUs):")
    print(f"  {'':<18} {'build loader s':>14} {'to 1st batch s':>15}")
    for name, rows in results.items():
        build_s = statistics.median(r["build_s"] for r in rows)
        first_s = statistics.median(r["first_s"] for r in rows)
        print(f"  {name:<18} {build_s:>14.2f} {first_s:>15.2f}")


if __name__ == "__main__":
    main()
