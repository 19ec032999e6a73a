"""A train metadataset's blend, sample by sample (Energon's semantics) vs whole per-source batches.

    python benchmarks/bench_sample_blend.py [--samples 3000] [--runs 2]

Contenders, each a fresh process on a 2-CPU budget, the captioning task encoder of
``bench_captioning.py``, two datasets of ``--samples`` each, weights 1:1, ``--samples`` samples taken (Energon refuses
a weighted blend with ``repeat=False``, so the datasets repeat):

- ``energon``: megatron-energon's ``get_train_dataset`` of the YAML (blends samples, then batches);
- ``samples``: energon_ray's ``get_train_dataset`` of the same YAML (its default since stop 30, here
  ``blend_samples=True``; ``SampleBlendDataset``: samples
  drawn in the trainer, still serialized, batched by one Ray task per group of 4 batches);
- ``batches``: energon_ray's ``BlendDataset`` of the two datasets (each batch one dataset's, made in
  the segment tasks; what the YAML gives with ``blend_samples=False``).

Reported per contender: full-pass samples/s, steady samples/s (the middle 80 % of batches), first
batch (s after ``iter()``), trainer CPU ms per batch after the first. ``--take N`` takes N samples per
pass (default ``--samples``): a longer pass weighs the start less. Nothing here runs in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_captioning as bc  # noqa: E402

BATCH = bc.BATCH
YAML = "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - {weight: 1, path: a}\n      - {weight: 1, path: b}\n"


def _data(workdir: Path, samples: int) -> Path:
    """Two prepared captioning datasets (symlinks to one) and the YAML blending them."""
    from energon_ray.format.info import meta_dir
    from energon_ray.format.prepare import prepare_dataset
    from energon_ray.synthetic import write_captioning_dataset

    source = workdir / f"captioning_{samples}"  # bench_captioning's dataset
    if not (meta_dir(source) / ".info.json").is_file():
        write_captioning_dataset(source, samples, 500, image_size=(320, 240))
        prepare_dataset(source, split_ratio=(1, 0, 0), sample_type="CaptioningSample",
                        field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
    root = workdir / f"blend_{samples}"
    root.mkdir(parents=True, exist_ok=True)
    for name in ("a", "b"):
        if not (root / name).exists():
            (root / name).symlink_to(source, target_is_directory=True)
    (root / "mix.yaml").write_text(YAML)
    return root


#: energon_ray's ``samples_per_segment`` (None: its default)
_SEGMENTS = None


def _segments(text: str):
    """``--samples-per-segment``: ``N`` or ``FIRST,LATER``."""
    parts = [int(p) for p in text.split(",")]
    return parts[0] if len(parts) == 1 else tuple(parts)


def _iter(kind: str, root: Path):
    if kind == "energon":
        import megatron.energon as me

        wc = me.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = me.get_train_dataset(str(root / "mix.yaml"), split_part="train", worker_config=wc, batch_size=BATCH,
                                  shuffle_buffer_size=100, max_samples_per_sequence=100,
                                  task_encoder=bc.make_energon_encoder(me)())  # fmt: skip
        return iter(me.get_loader(ds))
    import energon_ray as er

    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    common = dict(split_part="train", worker_config=wc, batch_size=BATCH, shuffle_buffer_size=100,
                  max_samples_per_sequence=100)  # fmt: skip
    if _SEGMENTS is not None:
        common["samples_per_segment"] = _SEGMENTS
    encoder = bc.make_energon_encoder(er)
    if kind == "samples":
        ds = er.get_train_dataset(root / "mix.yaml", task_encoder=encoder(), blend_samples=True, **common)
    else:
        ds = er.BlendDataset(*((er.get_train_dataset(root / name, task_encoder=encoder(), **common), 1) for name in ("a", "b")))
    return iter((bc.emulated_pinning_loader if _EMULATE_PIN else er.get_loader)(ds))


#: ``--emulate-pin``: pin as on CUDA, a clone standing in for each copy (``bench_captioning``)
_EMULATE_PIN = False
#: ``--sleep-ms``: the trainer sleeps this long per batch (a GPU step)
_SLEEP_S = 0.0


def child(kind: str, root: Path, batches_wanted: int) -> dict:
    if kind != "energon":
        from energon_ray.ray_env import ensure_ray

        ensure_ray(num_cpus=2)
    start = time.perf_counter()
    it = _iter(kind, root)
    spy = bc._profile_trainer() if kind != "energon" else None  # $BENCH_PYSPY: the trainer's profile
    batches = samples = 0
    first = None
    cpu0 = 0.0
    stamps, sizes = [], []
    for batch in it:
        if batches >= batches_wanted:
            break
        if first is None:
            first = time.perf_counter() - start
            cpu0 = time.process_time()
        batches += 1
        samples += len(batch["keys"])
        stamps.append(time.perf_counter())
        sizes.append(len(batch["keys"]))
        if _SLEEP_S:
            time.sleep(_SLEEP_S)
    elapsed = time.perf_counter() - start
    if spy is not None:
        import signal

        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    lo, hi = len(stamps) // 10, len(stamps) - 1 - len(stamps) // 10  # the middle 80 % of batches
    steady = sum(sizes[lo + 1 : hi + 1]) / (stamps[hi] - stamps[lo]) if hi > lo + 1 else 0.0
    return {"pass": samples / elapsed, "steady": steady, "first": first, "samples": samples,
            "trainer_ms": 1000 * (time.process_time() - cpu0) / max(1, batches - 1),
            "pinned_on_trainer": bc.pinned_on_trainer()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--take", type=int, default=None, help="samples taken per pass (default: --samples)")
    parser.add_argument("--workdir", default="/tmp/energon_ray_bench")
    parser.add_argument("--only", default="energon,samples,batches")
    parser.add_argument("--samples-per-segment", default=None, help="energon_ray: N or FIRST,LATER")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="the trainer sleeps this long per batch (a GPU step)")
    parser.add_argument("--emulate-pin", action="store_true", help="energon_ray pins as on CUDA, each copy a clone (a CPU stand-in)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global _SLEEP_S, _EMULATE_PIN
    _SLEEP_S, _EMULATE_PIN = args.sleep_ms / 1000, args.emulate_pin
    if args.samples_per_segment:
        global _SEGMENTS
        _SEGMENTS = _segments(args.samples_per_segment)
    root = _data(Path(args.workdir), args.samples)
    if args.child:
        print(json.dumps(child(args.child, root, (args.take or args.samples) // BATCH)))
        return
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}
    results: dict = {}
    for run in range(args.runs):
        for kind in args.only.split(","):
            cmd = [sys.executable, __file__, "--child", kind, "--samples", str(args.samples), "--workdir", args.workdir]
            if args.samples_per_segment:
                cmd += ["--samples-per-segment", args.samples_per_segment]
            cmd += (["--sleep-ms", str(args.sleep_ms)] if args.sleep_ms else []) + (["--emulate-pin"] if args.emulate_pin else [])
            out = subprocess.run(cmd + (["--take", str(args.take)] if args.take else []),
                                 capture_output=True, text=True, env=env)  # fmt: skip
            line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None
            if line is None:
                print(f"{kind} run {run} failed:\n{out.stderr[-2000:]}")
                continue
            r = json.loads(line)
            results.setdefault(kind, []).append(r)
            print(f"{kind:8s} run {run}: {r['pass']:7.0f}/s pass, {r['steady']:7.0f}/s steady, first {r['first']:5.2f}s, trainer {r['trainer_ms']:5.1f} ms/batch, {r['samples']} samples"
                  + (f", {100 * r['pinned_on_trainer']:.0f} % of the pinned bytes copied by the training thread" if args.emulate_pin else ""))  # fmt: skip
    print("\n| contender | pass samples/s | steady samples/s | first batch s | trainer CPU ms/batch |\n|---|---|---|---|---|")
    for kind, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("pass", "steady", "first", "trainer_ms")}
        print(f"| {kind} | {med['pass']:.0f} | {med['steady']:.0f} | {med['first']:.2f} | {med['trainer_ms']:.1f} |")


if __name__ == "__main__":
    main()
