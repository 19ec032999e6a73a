"""Where a Ray worker's memory lies: PSS by mapping of the trainer and of each Ray worker during a pass.

    python benchmarks/probe_worker_memory.py [--samples 3000] [--cpus 2]

Runs bench_captioning's energon_ray pass on a private ``--cpus``-CPU Ray (the dataset of
``bench_captioning.py --samples N``, written if missing) and reads ``/proc/PID/smaps`` of the trainer
and of every Ray worker every 20th batch. Prints, for the trainer and the largest worker, its peak
PSS split into: the heap (glibc's main arena), anonymous mappings (other malloc arenas, Arrow's
allocator, torch's large buffers), the object store (shared memory, divided among the processes that
touched a page) and the five largest shared libraries (relocated pages of torch's libraries are
private to each process that imports torch; a DataLoader worker forked from the trainer shares them);
then the whole process tree (Ray's own processes too) at its largest sample: private memory, the
object store and mapped files.
Memory, not time: it may run beside anything.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path
from typing import Counter

sys.path.insert(0, str(Path(__file__).resolve().parent))


def by_mapping(pid: int) -> Counter[str]:
    """PSS in KiB of one process by mapping: ``[heap]``, ``[anon]``, ``[shm]`` (the object store), a
    shared library's file name, ``file:NAME`` for other mapped files."""
    out: Counter[str] = collections.Counter()
    name = "[anon]"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                fields = line.split()
                if not fields[0].endswith(":"):  # a mapping's header: address perms offset dev inode [path]
                    path = fields[5] if len(fields) > 5 else "[anon]"
                    if path.startswith("/dev/shm") or "plasma" in path:
                        name = "[shm]"
                    elif ".so" in path:
                        name = path.rsplit("/", 1)[-1]
                    elif path.startswith("/"):
                        name = "file:" + path.rsplit("/", 1)[-1]
                    else:
                        name = path
                elif fields[0] == "Pss:":
                    out[name] += int(fields[1])
    except OSError:
        pass
    return out


def describe(what: str, usage: Counter[str]) -> str:
    libs = sorted(((v, k) for k, v in usage.items() if not k.startswith(("[", "file:"))), reverse=True)[:5]
    main = ", ".join(f"{k} {usage.get(k, 0) >> 10}" for k in ("[heap]", "[anon]", "[shm]"))
    return f"{what}: {sum(usage.values()) >> 10} MiB ({main}; libraries: " + ", ".join(f"{k} {v >> 10}" for v, k in libs) + ")"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--workdir", default="/tmp/energon_ray_bench")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import bench_captioning as cap
    from energon_ray.ray_env import ensure_ray

    root, _ = cap.dataset(args.workdir, args.samples)
    ensure_ray(num_cpus=args.cpus, logging_level="ERROR")
    cap._ER_OPTIONS["num_workers"] = args.cpus
    me = os.getpid()
    peaks: dict = {}
    tree_peak: Counter[str] = collections.Counter()  # the whole tree's largest sample, by kind of mapping
    batches = 0
    for batches, _batch in enumerate(cap.energon_ray_iter(str(root)), 1):
        if batches % 20 != 5:
            continue
        tree: Counter[str] = collections.Counter()
        for pid in cap.tree_pids(me):
            kind = cap._kind(pid, me)
            usage = by_mapping(pid)
            for name, kib in usage.items():
                tree["object store" if name == "[shm]" else "private" if name.startswith("[") else "files"] += kib
            if kind in ("trainer", "ray worker"):
                if sum(usage.values()) > sum(peaks.get(pid, (None, {}))[1].values()):
                    peaks[pid] = (kind, usage)
        if sum(tree.values()) > sum(tree_peak.values()):
            tree_peak = tree
    workers = sorted((sum(u.values()), pid) for pid, (kind, u) in peaks.items() if kind == "ray worker")
    print(f"{batches} batches, {args.cpus} CPUs; Ray workers' peak PSS, MiB: {[size >> 10 for size, _ in workers]}")
    print(f"whole tree at its largest sample: {sum(tree_peak.values()) >> 10} MiB (" + ", ".join(f"{k} {v >> 10}" for k, v in sorted(tree_peak.items())) + ")")
    print(describe("trainer", peaks[me][1]))
    if workers:
        print(describe(f"largest Ray worker (pid {workers[-1][1]})", peaks[workers[-1][1]][1]))


if __name__ == "__main__":
    main()
