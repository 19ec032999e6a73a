"""Captioning throughput, side by side in one run, each contender a fresh process with the same
CPU budget (N DataLoader workers vs an N-CPU private Ray): megatron-energon, webdataset's WebLoader,
plain Ray ``read_webdataset`` + ``map_batches``, energon_ray (plain Ray tasks, its default), energon_ray_data
(energon_ray with ``executor="ray_data"``), energon_ray_no_local (``ENERGON_RAY_LOCAL_START=off``: a cold
start's first block made by Ray, not the trainer), energon_ray_nice (``ENERGON_RAY_WORKER_NICE=10``:
its Ray workers below the trainer's CPU priority), and the one-process decode floor. ``energon_gen`` and
``energon_ray_gen``: the same with ``encode_sample`` written as a generator (energon_ray then chains
each worker stream's segments).

Workload (the same for all): 6000 JPEGs 320x240 + captions in tar shards, batch 32,
decode → resize to 224x224 → float → tokenize the batch's captions.

    python benchmarks/bench_captioning.py [--samples 6000] [--runs 3] [--cpus 2] [--setup-delay 0]

Prints, per contender (medians of the runs, contenders interleaved run by run): samples/s over the
full pass and over the middle 80 % of batches, time from ``iter()`` to the first batch, CPU time of
the training process per batch after the first (``time.process_time()``, all its threads; each
run's line also gives the training thread's own share, ``time.thread_time()``: the rest is Ray's C++
threads, the pin thread, DataLoader's threads), machine-wide CPU-seconds per pass, and the peak PSS
of the contender's whole process tree.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List

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


# -- contenders --------------------------------------------------------------------------------


def floor_iter(shards: List[str]):
    """Decode floor: one process, tarfile + PIL, the same decode and transforms, no loader."""
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
                        # C×H×W contiguous, as webdataset's (and every loader's) "torchrgb" gives it: a
                        # permuted view of the H×W×C pixels would make the resize ~30 % cheaper (the
                        # interpolation's channels-last kernel), a floor no loader here runs on
                        t = torch.from_numpy(img.transpose(2, 0, 1).astype(np.float32, order="C") / np.float32(255))
                        images.append(resize(t))
                        captions.append(parts["txt"].decode())
                        parts = {}
                        if len(images) == BATCH:
                            yield torch.stack(images), tok(captions)
                            images, captions = [], []
        if images:
            yield torch.stack(images), tok(captions)

    return gen()


#: ``*_gen`` contenders: ``encode_sample`` written as a generator (one output per sample), which
#: energon_ray runs as chained segments (each worker stream's segments one after another)
_GENERATOR = {"on": False}
#: ``--blend``: the loaders repeat (Energon blends only repeating datasets) and the pass stops after
#: ``--blend`` times ``--samples`` samples
_REPEAT = {"on": False}


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

    class GeneratorEncoder(Encoder):
        def encode_sample(self, sample):
            sample.image = resize(sample.image)
            yield sample

    return GeneratorEncoder if _GENERATOR["on"] else Encoder


#: ``--blend-batches N``: Energon's and energon_ray's ``BlendDataset`` of N batched copies of the
#: dataset at equal weights (each batch from one copy), instead of one dataset
_BATCH_BLEND = {"leaves": 0}


def _batch_blend(module, build, wc):
    """``build()`` once, or, with ``--blend-batches N``, ``module.BlendDataset`` of N such datasets."""
    leaves = _BATCH_BLEND["leaves"]
    if not leaves:
        return build()
    pairs = [(build(), 1.0) for _ in range(leaves)]
    return module.BlendDataset(*pairs, worker_config=wc) if module.__name__ != "energon_ray" else module.BlendDataset(*pairs)


def energon_iter(path: str, workers: int):
    import megatron.energon as me

    Encoder = make_energon_encoder(me)
    wc = me.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = _batch_blend(me, lambda: me.get_train_dataset(
        path, split_part="train", worker_config=wc, batch_size=BATCH, shuffle_buffer_size=100,
        max_samples_per_sequence=100, repeat=_REPEAT["on"], task_encoder=Encoder(),
    ), wc)  # fmt: skip
    return iter(me.get_loader(ds))


_ER_LOADER = {}
_ER_OPTIONS = {}
#: energon_ray's object_store_limit in bytes (None: the loader's default)
_ER_LIMIT = None
#: ``--emulate-pin``: energon_ray pins (a CPU stand-in for torch's copy into pinned memory); the
#: bytes copied by the training thread (True) and by the loader's pin thread (False)
_ER_EMULATE_PIN = False
_PINNED_BY = {True: 0, False: 0}


def emulated_pinning_loader(ds, **options):
    """energon_ray's loader of ``ds`` pinning from its first pass, as on CUDA, each copy a clone in
    pageable memory (a CPU stand-in for torch's copy into pinned memory), the bytes counted by the
    thread that copied them in ``_PINNED_BY`` (``pinned_on_trainer``)."""
    import energon_ray as er
    import energon_ray.loader.pinning as pinning

    def pin_memory(self, device=None):
        _PINNED_BY[threading.current_thread() is threading.main_thread()] += self.nbytes
        return self.clone()

    torch.Tensor.pin_memory = pin_memory
    pinning._cuda_device = lambda: None
    available, torch.cuda.is_available = torch.cuda.is_available, lambda: True
    try:
        return er.get_loader(ds, **options)
    finally:
        torch.cuda.is_available = available


def pinned_on_trainer() -> float:
    """The share of the bytes ``emulated_pinning_loader`` copied on the training thread."""
    return _PINNED_BY[True] / max(1, _PINNED_BY[True] + _PINNED_BY[False])


def _energon_ray_loader(path: str):
    import energon_ray as er

    if "loader" not in _ER_LOADER:
        Encoder = make_energon_encoder(er)
        options = dict(_ER_OPTIONS)
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=options.pop("num_workers", 2))
        ds = _batch_blend(er, lambda: er.get_train_dataset(
            path, split_part="train", worker_config=wc, batch_size=BATCH, shuffle_buffer_size=100,
            max_samples_per_sequence=100, repeat=_REPEAT["on"], task_encoder=Encoder(), **options,
        ), wc)  # fmt: skip
        loader_options = {} if _ER_LIMIT is None else {"object_store_limit": _ER_LIMIT}
        _ER_LOADER["loader"] = (emulated_pinning_loader if _ER_EMULATE_PIN else er.get_loader)(ds, **loader_options)
    return _ER_LOADER["loader"]


def energon_ray_iter(path: str):
    return iter(_energon_ray_loader(path))


def webloader_iter(shards: List[str], workers: int):
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
    return iter(wds.WebLoader(dataset, batch_size=None, num_workers=workers))


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

    def collate(batch):  # numpy columns to tensors (an object column, as a newer numpy may give, stacked)
        return {k: torch.from_numpy(np.stack(list(v)) if v.dtype == object else v) for k, v in batch.items()}

    ds = ray.data.read_webdataset(shards, decoder=None, file_extensions=["tar"])
    ds = ds.map_batches(
        lambda b: transform({"jpg": b["jpg"], "txt": [t.decode() if isinstance(t, bytes) else t for t in b["txt"]]}),
        batch_size=BATCH,
        batch_format="numpy",
    )
    return iter(ds.iter_torch_batches(batch_size=BATCH, prefetch_batches=4, collate_fn=collate))


def dataset(workdir: str, samples: int, write: bool = True):
    """The benchmark's prepared dataset (written once per size, in all CPUs): its root and shards."""
    from energon_ray.format.info import meta_dir
    from energon_ray.format.prepare import prepare_dataset
    from energon_ray.synthetic import write_captioning_dataset

    root = Path(workdir) / f"captioning_{samples}"
    if write and not (meta_dir(root) / ".info.json").is_file():
        print(f"writing {samples} samples to {root} ...", flush=True)
        write_captioning_dataset(root, samples, 500, image_size=(320, 240), processes=os.cpu_count() or 1)
        prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="CaptioningSample",
                        field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
    return root, sorted(glob.glob(str(root / "shards" / "*.tar")))


def blend_yaml(root: Path, leaves: int) -> Path:
    """A metadataset blending ``leaves`` copies of ``root``'s train split at equal weights (both
    Energon and energon_ray load it): a blend's memory and trainer CPU against one dataset's."""
    path = root.parent / f"{root.name}_blend{leaves}.yaml"
    entries = "".join(f"        - weight: 1\n          path: {root}\n" for _ in range(leaves))
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n" + entries
    )
    return path


# -- fresh-process harness ---------------------------------------------------------------------


def _children(pid: int) -> List[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
    except OSError:
        pass
    return out


def tree_pids(root: int) -> Iterator[int]:
    """A process and its live descendants (each once)."""
    stack, seen = [root], set()
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            yield pid
            stack.extend(_children(pid))


def _pss(pid: int) -> int:
    """PSS in bytes of one process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _kind(pid: int, root: int) -> str:
    """``trainer`` (the root), ``ray worker`` (``ray::IDLE`` and task names), ``loader worker`` (a
    fork of the trainer: DataLoader's), ``raylet``/``gcs_server``/``DashboardAgent``/``RuntimeEnvAgent``
    (Ray's own processes, not counted as workers), else the command name ('' if the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        argv = _cmdline(pid)
        forked = pid != root and argv == _cmdline(root)
    except OSError:
        return ""
    head = argv.split(b"\0")[0].decode(errors="replace")
    if pid == root:
        return "trainer"
    if head.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent")):  # Ray's per-node agents
        return head[len("ray::"):].split()[0]
    if head.startswith("ray::"):
        return "ray worker"
    if forked:
        return "loader worker"
    if "raylet" in head or "gcs_server" in head:
        return os.path.basename(head.split()[0])
    return stat[stat.index("(") + 1 : stat.rindex(")")]


def tree_pss(root: int) -> Dict[str, float]:
    """PSS of a process and all its descendants (Ray's raylet and workers, DataLoader workers): ``total``
    in bytes, ``trainer`` (the root's), ``workers`` (Ray workers or DataLoader workers together),
    ``worker_max`` (the largest one) and ``nworkers``."""
    out = {"total": 0.0, "trainer": 0.0, "workers": 0.0, "worker_max": 0.0, "nworkers": 0.0}
    for pid in tree_pids(root):
        size, kind = _pss(pid), _kind(pid, root)
        out["total"] += size
        if kind == "trainer":
            out["trainer"] = size
        elif kind in ("ray worker", "loader worker"):
            out["workers"] += size
            out["worker_max"] = max(out["worker_max"], size)
            out["nworkers"] += 1
    return out


def tree_cpu(root: int) -> Dict[str, float]:
    """CPU seconds (user + system) so far of a process and its live descendants, summed by kind
    (``_kind``: the trainer, Ray's raylet/gcs_server/workers, DataLoader workers, the rest by name)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: Dict[str, float] = {}
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        kind = _kind(pid, root)
        if not kind:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def run_child(name: str, args) -> Dict[str, float]:
    """Run one contender in a fresh process; sample the PSS of its process tree while it runs."""
    import sys

    cmd = [sys.executable, __file__, "--child", name, "--cpus", str(args.cpus), "--samples", str(args.samples),
           "--workdir", args.workdir, "--setup-delay", str(args.setup_delay)]  # fmt: skip
    if args.samples_per_segment:
        cmd += ["--samples-per-segment", str(args.samples_per_segment)]
    if args.object_store_mib:
        cmd += ["--object-store-mib", str(args.object_store_mib)]
    if args.step_ms:
        cmd += ["--step-ms", str(args.step_ms)]
    if args.sleep_ms:
        cmd += ["--sleep-ms", str(args.sleep_ms)]
    if args.emulate_pin:
        cmd += ["--emulate-pin"]
    if args.blend:
        cmd += ["--blend", str(args.blend)]
    if args.blend_batches:
        cmd += ["--blend-batches", str(args.blend_batches)]
    return measure(name, cmd)


def interleaved(names: List[str], runs: int, run_one, describe) -> Dict[str, Dict[str, float]]:
    """Each contender once per run, interleaved (each run sees the machine in the same state for
    all), a line per result (``describe(result)``); the medians of each contender's figures."""
    results: Dict[str, List[Dict[str, float]]] = {name: [] for name in names}
    failed = set()
    for run in range(runs):
        for name in names:
            if name in failed:
                continue
            try:
                results[name].append(run_one(name))
            except RuntimeError as exc:  # one contender's failure (printed) leaves the others' figures
                failed.add(name)
                print(f"{name:12s} run {run}: FAILED, left out of the comparison: {exc}"[:4000], flush=True)
                continue
            print(f"{name:12s} run {run}: {describe(results[name][-1])}", flush=True)
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in results.items() if rs}


def print_table(header: List[str], rows: List[List[str]]) -> None:
    """A Markdown table, after a blank line."""
    print()
    for cells in (header, ["---"] * len(header), *rows):
        print("| " + " | ".join(cells) + " |")


#: seconds between two PSS samples of a contender's process tree (``--pss-every``)
PSS_EVERY = 0.5


def measure(name: str, cmd: List[str]) -> Dict[str, float]:
    """Run ``cmd`` (a contender's child), sampling its process tree's PSS every ``PSS_EVERY`` s: the
    figures of its last stdout line (JSON) plus ``pss``, the peak in MiB, and ``sampler_cpu``, the
    CPU seconds the sampling took in this process (reading ``smaps_rollup`` costs more the more
    processes and mapped memory a contender has: at 0.1 s, 2.1 CPU-s of a 2-core pass for the
    WebLoader, 2.8 for Energon, 6.5 for energon_ray (the object store is mapped in every Ray process),
    which took that much more from energon_ray's own 2 cores; at 0.5 s about a fifth of that)."""
    import json
    import subprocess

    import tempfile

    # stdout to a file, not a pipe: a child that prints more than a pipe holds (say, a log line per
    # failed sample) would block on it while this loop only samples
    with tempfile.TemporaryFile(mode="w+") as stdout:
        proc = subprocess.Popen(cmd, stdout=stdout, text=True)
        peak, sampling = {"total": 0.0}, time.process_time()
        while proc.poll() is None:
            sample = tree_pss(proc.pid)
            if sample["total"] > peak["total"]:
                peak = sample
            time.sleep(PSS_EVERY)
        stdout.seek(0)
        out = stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{out}")
    result = json.loads(out.strip().splitlines()[-1])
    result["pss"] = peak["total"] / 2**20
    # where the peak lay: the trainer, the workers (Ray's or DataLoader's) together and the largest one
    for part in ("trainer", "workers", "worker_max"):
        result[f"pss_{part}"] = peak.get(part, 0.0) / 2**20
    result["pss_nworkers"] = peak.get("nworkers", 0.0)
    result["sampler_cpu"] = time.process_time() - sampling
    return result


def _profile_trainer():
    """With ``$BENCH_PYSPY`` set (a path): py-spy samples this trainer process's CPU until the pass
    ends, written there as collapsed stacks (``--format raw``)."""
    import shutil
    import subprocess

    path, exe = os.environ.get("BENCH_PYSPY"), shutil.which("py-spy")
    if not path or not exe:
        return None
    cmd = [exe, "record", "--pid", str(os.getpid()), "--rate", "250", "--nonblocking", "--format", "raw", "--output", path]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def child(name: str, args, root: Path, shards: List[str]) -> None:
    """One contender, one pass, in this (fresh) process: prints one JSON line of figures."""
    import json
    import sys

    torch.set_num_threads(1)
    if name == "energon_ray_data":  # energon_ray with the Ray Data executor (the feeder's executions)
        os.environ["ENERGON_RAY_EXECUTOR"] = "ray_data"
        name = "energon_ray"
    if name.endswith("_gen"):  # the same task encoder with a generator encode_sample
        _GENERATOR["on"] = True
        name = name[: -len("_gen")]
    if name == "energon_ray_no_local":  # energon_ray without its first block made in the trainer on a cold start
        os.environ["ENERGON_RAY_LOCAL_START"] = "off"
        name = "energon_ray"
    if name == "energon_ray_nice":  # energon_ray with its Ray workers at a lower CPU priority than the trainer
        os.environ["ENERGON_RAY_WORKER_NICE"] = "10"
        name = "energon_ray"
    if name == "ray_data":
        import ray

        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
    if name == "energon_ray":  # the private Ray energon_ray starts for a user who has none
        from energon_ray.ray_env import ensure_ray

        ensure_ray(num_cpus=args.cpus, logging_level="ERROR")
    if name == "energon_ray":
        _ER_OPTIONS["num_workers"] = args.cpus
    make = {
        "floor": lambda: floor_iter(shards),
        "energon": lambda: energon_iter(str(root), args.cpus),
        "webloader": lambda: webloader_iter(shards, args.cpus),
        "ray_data": lambda: ray_iter(shards),
        "energon_ray": lambda: energon_ray_iter(str(root)),
    }[name]
    count = {"floor": lambda b: b[0].shape[0], "webloader": lambda b: b[0].shape[0],
             "ray_data": lambda b: b["image"].shape[0]}.get(name, lambda b: len(b["keys"]))  # fmt: skip
    if name == "energon_ray":
        _energon_ray_loader(str(root))  # built before the timer, like a trainer builds its loader
        time.sleep(args.setup_delay)  # the user's model set-up, overlapping our warm-up
    spy = _profile_trainer() if name == "energon_ray" else None
    by_process = os.environ.get("BENCH_PROC_CPU", "0") not in ("", "0")
    procs0 = tree_cpu(os.getpid()) if by_process else {}
    cpu0 = _cpu_busy_seconds()
    start = time.perf_counter()
    it = make()
    stamps, sizes = [], []
    trainer_cpu0 = None
    steps = []  # wall ms of each --step-ms step (CPU work of the training thread standing in for a model's step)
    waits = []  # ms the trainer waited in next() for each batch
    blended = args.blend or args.blend_batches
    limit = args.samples * blended if blended else None
    while limit is None or sum(sizes) < limit:
        asked = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        stamps.append(time.perf_counter())
        waits.append(1000 * (stamps[-1] - asked))
        sizes.append(count(batch))
        if trainer_cpu0 is None:
            trainer_cpu0, main0 = time.process_time(), time.thread_time()
        if args.step_ms:
            steps.append(_step(args.step_ms))
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)  # a GPU step: the training thread waits, its CPU idle
    trainer_cpu = time.process_time() - (trainer_cpu0 or 0.0)
    main_cpu = time.thread_time() - (main0 if trainer_cpu0 is not None else 0.0)
    end = time.perf_counter()
    cpu = _cpu_busy_seconds() - cpu0
    if by_process:  # CPU-s of the pass per kind of process (processes that ended meanwhile are missed)
        procs = tree_cpu(os.getpid())
        spent = {k: round(v - procs0.get(k, 0.0), 2) for k, v in sorted(procs.items())}
        print(f"{name} CPU-s of the pass by process: {spent}", file=sys.stderr, flush=True)
    if spy is not None:
        import signal

        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    if by_process:  # the ramp: when the first batches came, seconds from iter()
        print(f"{name} first batches at: {[round(t - start, 2) for t in stamps[:40:3]]}", file=sys.stderr, flush=True)
    n = sum(sizes)
    if (n != args.samples) if limit is None else not limit <= n < limit + BATCH:
        raise RuntimeError(f"{name}: pass yielded {n} samples, expected {limit or args.samples}")
    lo, hi = len(stamps) // 10, len(stamps) - len(stamps) // 10
    steady = sum(sizes[lo + 1 : hi + 1]) / (stamps[hi] - stamps[lo]) if hi > lo + 1 else 0.0
    print(json.dumps({
        "sps": n / (end - start), "steady": steady, "first": stamps[0] - start, "cpu": cpu,
        "trainer_ms": 1000 * trainer_cpu / max(1, len(stamps) - 1), "batches": len(stamps),
        # of which the training thread's own (the rest: Ray's C++ threads, the pin thread, ...)
        "main_ms": 1000 * main_cpu / max(1, len(stamps) - 1),
        **({"step_wall": statistics.median(steps), "step_p90": sorted(steps)[int(0.9 * len(steps))]} if steps else {}),
        **({"pinned_on_trainer": pinned_on_trainer()} if _ER_EMULATE_PIN else {}),
        # after the first batch: the trainer's waits in next() (median, p90, mean ms)
        **({"wait_ms": statistics.median(waits[1:]), "wait_p90": sorted(waits[1:])[int(0.9 * (len(waits) - 1))],
            "wait_mean": statistics.fmean(waits[1:])} if len(waits) > 1 else {}),
    }), flush=True)  # fmt: skip


def _step(ms: float) -> float:
    """Spin the calling thread for ``ms`` of its own CPU time (a training step's CPU-bound part: the
    kernel launches a GPU step needs); its wall time in ms. Loader work competing for the cores (the
    trainer's other threads, Ray's or DataLoader's workers) stretches the wall time: a GPU waits."""
    start, cpu_end = time.perf_counter(), time.thread_time() + ms / 1000
    while time.thread_time() < cpu_end:
        pass
    return 1000 * (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2, help="DataLoader workers = Ray CPUs")
    parser.add_argument("--workdir", default="/tmp/energon_ray_bench")
    parser.add_argument("--only", default="energon,webloader,ray_data,energon_ray")
    parser.add_argument("--setup-delay", type=float, default=0.0, help="seconds between building energon_ray's loader and iter()")
    parser.add_argument("--samples-per-segment", type=int, default=None, help="energon_ray: samples per Ray task")
    parser.add_argument("--object-store-mib", type=int, default=None, help="energon_ray: object_store_limit in MiB")
    parser.add_argument("--step-ms", type=float, default=0.0, help="after each batch, spin the training thread for this many ms of its CPU time and report the wall time it took")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="after each batch, sleep this many ms (a GPU step: the CPU idle); see the waits in next()")
    parser.add_argument("--emulate-pin", action="store_true", help="energon_ray: pin as on CUDA, each copy a clone in pageable memory (a CPU stand-in)")
    parser.add_argument("--pss-every", type=float, default=PSS_EVERY, help="seconds between PSS samples of a contender's process tree")
    parser.add_argument("--blend", type=int, default=0, help="energon, energon_ray: a metadataset blending this many copies of the dataset (equal weights); a pass is that many times --samples")
    parser.add_argument("--blend-batches", type=int, default=0, help="energon, energon_ray: a BlendDataset of this many batched copies of the dataset (each batch from one copy); a pass is that many times --samples")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    globals()["PSS_EVERY"] = args.pss_every
    if args.samples_per_segment:
        _ER_OPTIONS["samples_per_segment"] = args.samples_per_segment
    if args.object_store_mib:
        global _ER_LIMIT
        _ER_LIMIT = args.object_store_mib << 20
    if args.emulate_pin:
        globals()["_ER_EMULATE_PIN"] = True

    if args.child:
        root, shards = dataset(args.workdir, args.samples, write=False)
        if args.blend and args.blend_batches:
            raise SystemExit("--blend and --blend-batches: one or the other")
        if (args.blend or args.blend_batches) and args.child not in ("energon", "energon_ray"):
            raise SystemExit(f"--blend, --blend-batches: only energon and energon_ray, not {args.child}")
        if args.blend:
            root = blend_yaml(root, args.blend)
            _REPEAT["on"] = True
        if args.blend_batches:
            _BATCH_BLEND["leaves"] = args.blend_batches
            _REPEAT["on"] = True
        child(args.child, args, root, shards)
        return
    dataset(args.workdir, args.samples)
    med = interleaved(args.only.split(","), args.runs, lambda name: run_child(name, args), lambda r: (
        f"{r['sps']:6.0f}/s pass, {r['steady']:6.0f}/s steady, first {r['first']:5.2f}s, "
        f"trainer {r['trainer_ms']:5.1f} ms/batch ({r['main_ms']:4.1f} in its main thread), cpu {r['cpu']:6.1f}s, "
        f"PSS {r['pss']:6.0f} MiB (trainer {r['pss_trainer']:.0f}, {r['pss_nworkers']:.0f} workers {r['pss_workers']:.0f}, "
        f"largest {r['pss_worker_max']:.0f}; the rest {r['pss'] - r['pss_trainer'] - r['pss_workers']:.0f}: Ray's own processes; "
        f"sampler {r['sampler_cpu']:.1f} CPU-s)"
        + (f", step {r['step_wall']:.2f} ms wall (p90 {r['step_p90']:.2f}) for {args.step_ms} ms CPU" if "step_wall" in r else "")
        + (f", waits in next() {r['wait_ms']:.2f} ms median, p90 {r['wait_p90']:.2f}, mean {r['wait_mean']:.2f}" if "wait_ms" in r else "")
        + (f", {100 * r['pinned_on_trainer']:.0f} % of the pinned bytes copied by the training thread" if "pinned_on_trainer" in r else "")))  # fmt: skip
    base = med.get("energon")
    print_table(
        ["contender", "pass samples/s", "steady samples/s", "first batch s", "trainer CPU ms/batch", "CPU-s/pass", "peak PSS MiB", "pass vs Energon"],
        [[name, f"{m['sps']:.0f}", f"{m['steady']:.0f}", f"{m['first']:.2f}", f"{m['trainer_ms']:.1f}", f"{m['cpu']:.1f}", f"{m['pss']:.0f}",
          f"{m['sps'] / base['sps']:.2f}x" if base else "n/a"] for name, m in med.items()],
    )  # fmt: skip
    print(f"\nmedians of {args.runs} runs, {args.samples} samples, batch {BATCH}, {args.cpus} workers/CPUs, "
          f"each contender a fresh process, {os.cpu_count()} CPUs on the machine")  # fmt: skip


if __name__ == "__main__":
    main()
