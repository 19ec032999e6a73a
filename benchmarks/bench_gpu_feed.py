"""GPU feed: a small conv net trained in bf16 on the captioning workload, fed by each loader, side by
side in one run (each contender a fresh process, the same CPU budget: N DataLoader workers vs an N-CPU
private Ray, the same task encoder as ``bench_captioning.py``). Needs CUDA; CI never runs it.

    python benchmarks/bench_gpu_feed.py [--samples 12000] [--runs 2] [--cpus 16] [--only loader_free,energon,energon_ray]

(``energon_ray_nice``: energon_ray with ``ENERGON_RAY_WORKER_NICE=10``, its Ray workers below the
trainer's CPU priority.)

A training step is: copy the batch's images and token ids to the GPU (``non_blocking``; both loaders
pin on CUDA), forward + backward of the net under ``torch.autocast(bfloat16)``, an SGD step. Reported
per contender (medians of the runs):

- end-to-end samples/s over the full pass (``iter()`` to the last step finished on the GPU) and over
  the middle 80 % of steps;
- step ms: the GPU time of one step, CUDA events around it (a trainer process busy with loader work
  launches kernels late, and the GPU waits: that shows here), median over the pass;
- trainer CPU ms per batch (``time.process_time()`` after the first batch: the loader's share plus
  the step's own launches, which are the same for all) and the peak PSS of the process tree.

``loader_free`` runs the same steps on one pinned batch, copied every step: the step time and rate
without any loader, the bound the others are held to.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict

import torch
from torch import nn

import bench_captioning as cap

CLASSES = 100


class SmallNet(nn.Module):
    """Four conv stages (stride 2) + a caption-token embedding, pooled into one linear classifier."""

    def __init__(self, vocab: int = 32000, width: int = 32):
        super().__init__()
        layers, c_in = [], 3
        for c_out in (width, 2 * width, 4 * width, 8 * width):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                       nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]  # fmt: skip
            c_in = c_out
        self.convs = nn.Sequential(*layers)
        self.tokens = nn.EmbeddingBag(vocab, c_in, mode="mean")
        self.head = nn.Linear(c_in, CLASSES)

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        features = self.convs(images).mean(dim=(2, 3))
        return self.head(features + self.tokens(input_ids))


def unpack(name: str, batch):
    """(images, input_ids) of one batch, as the loader made them."""
    if name == "webloader":
        return batch[0], batch[1]["input_ids"]
    return batch["images"], batch["input_ids"]


def trainer(device: torch.device):
    model = SmallNet().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(images: torch.Tensor, input_ids: torch.Tensor) -> None:
        images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        input_ids = input_ids.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(images, input_ids)
            loss = nn.functional.cross_entropy(logits.float(), input_ids[:, 1] % CLASSES)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class Clock:
    """A CUDA event on CUDA (the GPU's time); the host clock elsewhere (the harness's smoke test)."""

    def __init__(self, device: torch.device):
        self.event = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        self.t = 0.0

    def record(self) -> None:
        if self.event is not None:
            self.event.record()
        else:
            self.t = time.perf_counter()

    def elapsed_time(self, end: "Clock") -> float:
        return self.event.elapsed_time(end.event) if self.event is not None else 1000 * (end.t - self.t)


def child(name: str, args) -> None:
    if name == "energon_ray_nice":  # its Ray workers below the trainer's CPU priority (ENERGON_RAY_WORKER_NICE)
        os.environ["ENERGON_RAY_WORKER_NICE"] = "10"
        name = "energon_ray"
    torch.set_num_threads(1)
    torch.backends.cudnn.benchmark = True
    device = torch.device(args.device)
    root, shards = cap.dataset(args.workdir, args.samples, write=False)
    step = trainer(device)
    pinned = (torch.rand(cap.BATCH, 3, cap.SIZE, cap.SIZE), torch.randint(3, 32000, (cap.BATCH, 64)))
    if device.type == "cuda":
        pinned = tuple(t.pin_memory() for t in pinned)
    for _ in range(20 if device.type == "cuda" else 1):  # cuDNN's algorithm search and the allocator, before any clock starts
        step(*pinned)
    sync(device)
    if name == "energon_ray":
        from energon_ray.ray_env import ensure_ray

        ensure_ray(num_cpus=args.cpus, logging_level="ERROR")
        cap._ER_OPTIONS["num_workers"] = args.cpus
        cap._energon_ray_loader(str(root))  # built before the clock, like a trainer builds its loader
    make = {
        "loader_free": lambda: iter([pinned] * (args.samples // cap.BATCH)),
        "energon": lambda: cap.energon_iter(str(root), args.cpus),
        "energon_ray": lambda: cap.energon_ray_iter(str(root)),
        "webloader": lambda: cap.webloader_iter(shards, args.cpus),
    }[name]
    events, sizes, stamps = [], [], []
    trainer_cpu0, first = None, 0.0
    start = time.perf_counter()
    for batch in make():
        images, input_ids = batch if name == "loader_free" else unpack(name, batch)
        if trainer_cpu0 is None:
            trainer_cpu0, first = time.process_time(), time.perf_counter() - start
        begin, end = Clock(device), Clock(device)
        begin.record()
        step(images, input_ids)
        end.record()
        events.append((begin, end))
        sizes.append(images.shape[0])
        stamps.append(time.perf_counter())
    sync(device)
    finish = time.perf_counter()
    trainer_cpu = time.process_time() - (trainer_cpu0 or 0.0)
    step_ms = [b.elapsed_time(e) for b, e in events]
    n = sum(sizes)
    lo, hi = len(stamps) // 10, len(stamps) - 1 - len(stamps) // 10
    steady = sum(sizes[lo + 1 : hi + 1]) / (stamps[hi] - stamps[lo]) if hi > lo + 1 else 0.0
    print(json.dumps({
        "sps": n / (finish - start), "steady": steady, "first": first, "step_ms": statistics.median(step_ms),
        "step_p90": sorted(step_ms)[int(0.9 * len(step_ms))], "trainer_ms": 1000 * trainer_cpu / max(1, len(stamps) - 1),
        "samples": n,
    }), flush=True)  # fmt: skip


def run_child(name: str, args) -> Dict[str, float]:
    cmd = [sys.executable, __file__, "--child", name, "--cpus", str(args.cpus), "--samples", str(args.samples), "--workdir", args.workdir,
           "--device", args.device]  # fmt: skip
    return cap.measure(name, cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="DataLoader workers = Ray CPUs")
    parser.add_argument("--workdir", default="/tmp/energon_ray_bench")
    parser.add_argument("--only", default="loader_free,energon,energon_ray")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a smoke test of the harness
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu_feed needs a CUDA device")
    cap.dataset(args.workdir, args.samples)
    med = cap.interleaved(args.only.split(","), args.runs, lambda name: run_child(name, args), lambda r: (
        f"{r['sps']:6.0f}/s end to end, {r['steady']:6.0f}/s steady, first {r['first']:5.2f}s, "
        f"step {r['step_ms']:5.2f} ms (p90 {r['step_p90']:5.2f}), trainer {r['trainer_ms']:5.1f} ms/batch, PSS {r['pss']:6.0f} MiB "
        f"(trainer {r['pss_trainer']:.0f}, {r['pss_nworkers']:.0f} workers {r['pss_workers']:.0f}, largest {r['pss_worker_max']:.0f})"))  # fmt: skip
    free = med.get("loader_free")
    base = med.get("energon")
    cap.print_table(
        ["contender", "end-to-end samples/s", "steady samples/s", "first batch s", "step ms (p90)", "step vs loader-free",
         "trainer CPU ms/batch", "peak PSS MiB", "vs Energon"],
        [[name, f"{m['sps']:.0f}", f"{m['steady']:.0f}", f"{m['first']:.2f}", f"{m['step_ms']:.2f} ({m['step_p90']:.2f})",
          f"{m['step_ms'] / free['step_ms']:.2f}x" if free else "n/a", f"{m['trainer_ms']:.1f}", f"{m['pss']:.0f}",
          f"{m['sps'] / base['sps']:.2f}x" if base else "n/a"] for name, m in med.items()],
    )  # fmt: skip
    print(f"\nmedians of {args.runs} runs, {args.samples} samples, batch {cap.BATCH}, {args.cpus} workers/CPUs, "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}, {os.cpu_count()} CPUs on the machine")  # fmt: skip


if __name__ == "__main__":
    main()
