"""A packed train blend (samples blended, then packed, then batched): does the trainer wait for Ray?

    python benchmarks/bench_packed_blend.py [--docs 6000] [--runs 3] [--sleep-ms 40]

Two JSONL corpora (``--docs`` and half as many log-normal documents, mean ~300 words) blended 2:1 by
a metadataset YAML, ``get_train_dataset(yaml, blend_samples=True, packing_buffer_size=256)`` with the
ready ``TextPackingTaskEncoder`` (2048-token rows, batch 8), ``--cpus`` (2) logical workers on a private
Ray of as many CPUs.
Contenders, each a fresh process, interleaved run by run:

- ``ahead``: energon_ray as it is (``packed_blend.LOOK_AHEAD``: the next chunks' packing and the next
  group's batching start while the trainer trains on the current group);
- ``plain``: ``LOOK_AHEAD = False`` (each packing and batching task starts when the trainer reaches it);
- ``energon``: megatron-energon on the same YAML and options, ``--cpus`` DataLoader workers, the same task
  encoder's hooks (its functions on Energon's ``DefaultTaskEncoder`` and ``Cooker``).

The trainer sleeps ``--sleep-ms`` per batch (a GPU step, its CPU idle). ``--batches`` per run (the
blend repeats: Energon blends by weight only when repeating). Reported: tokens/s over the pass and
after the first 20 batches, the first batch's wait, CPU-s of the whole process tree from ``iter()``
to the last batch, its peak PSS (``bench_captioning.measure``), the seconds the trainer waited in
``next()`` after its first 20 batches (the cold start left out) and their p90 in ms, trainer CPU ms
per batch after the first. Nothing here runs in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

SKIP = 20  # batches of the cold start left out of the waits


def _data(workdir: Path, docs: int) -> Path:
    from energon_ray.format.jsonl import prepare_jsonl
    from energon_ray.tasks.text_packing import lognormal_corpus

    workdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, n in enumerate((docs, docs // 2)):
        path = workdir / f"corpus_{i}_{n}.jsonl"
        if not Path(str(path) + ".idx").is_file():
            path.write_text("\n".join(json.dumps({"text": d}) for d in lognormal_corpus(n, mean_words=300, sigma=1.0, seed=i)) + "\n")
            prepare_jsonl(path, progress=False)
        paths.append(path)
    yaml = workdir / f"blend_{docs}.yaml"
    yaml.write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
                    f"      - {{weight: 2, path: {paths[0].name}}}\n      - {{weight: 1, path: {paths[1].name}}}\n")  # fmt: skip
    return yaml


def energon_encoder(max_length: int):
    """The ready ``TextPackingTaskEncoder``'s own functions on megatron-energon's classes."""
    import megatron.energon as me

    from energon_ray.tasks.text_packing import TextPackingTaskEncoder, cook_text

    ours = TextPackingTaskEncoder(max_length=max_length)
    hooks = ("encode_sample", "select_samples_to_pack", "pack_selected_samples", "batch", "encode_batch")

    @me.stateless
    def cook(sample):
        return cook_text(sample)

    class EnergonTextPacking(me.DefaultTaskEncoder):
        cookers = [me.Cooker(cook)]

        def __init__(self):
            super().__init__()
            self.max_length, self.tokenizer, self.pad_id = ours.max_length, ours.tokenizer, ours.pad_id

    for hook in hooks:
        setattr(EnergonTextPacking, hook, getattr(TextPackingTaskEncoder, hook))
    return EnergonTextPacking()


def _loader(name: str, yaml: Path, cpus: int):
    options = dict(batch_size=8, repeat=True, packing_buffer_size=256, shuffle_buffer_size=100, max_samples_per_sequence=100)
    if name == "energon":
        import megatron.energon as me

        wc = me.WorkerConfig(rank=0, world_size=1, num_workers=cpus)
        return me.get_loader(me.get_train_dataset(yaml, worker_config=wc, task_encoder=energon_encoder(2048), **options))
    import energon_ray as er
    import energon_ray.blend.packed_blend as packed_blend
    from energon_ray.ray_env import ensure_ray
    from energon_ray.tasks.text_packing import TextPackingTaskEncoder

    packed_blend.LOOK_AHEAD = name == "ahead"
    ensure_ray(num_cpus=cpus)
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=cpus)
    return er.get_loader(er.get_train_dataset(yaml, worker_config=wc, task_encoder=TextPackingTaskEncoder(max_length=2048), blend_samples=True, **options))


def child(name: str, yaml: Path, sleep_ms: float, batches: int, cpus: int) -> None:
    from bench_captioning import tree_cpu

    loader = _loader(name, yaml, cpus)
    waits, tokens, cpu0, at_skip = [], 0, None, None
    tree0 = sum(tree_cpu(os.getpid()).values())
    start = time.perf_counter()
    it = iter(loader)
    while len(waits) < batches:
        asked = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        waits.append(time.perf_counter() - asked)
        tokens += int(batch.num_tokens.sum())
        if len(waits) == SKIP:
            at_skip = (time.perf_counter(), tokens)
        if cpu0 is None:
            cpu0 = time.process_time()
        time.sleep(sleep_ms / 1000)
    elapsed = time.perf_counter() - start
    tree_s = sum(tree_cpu(os.getpid()).values()) - tree0
    late = sorted(waits[SKIP:]) or [0.0]
    print(json.dumps({
        "tokens_s": tokens / elapsed, "steady_s": (tokens - at_skip[1]) / (start + elapsed - at_skip[0]), "first_s": waits[0], "cpu_s": tree_s, "batches": len(waits), "wait_s": sum(waits[SKIP:]),
        "wait_p90": 1000 * late[int(0.9 * (len(late) - 1))], "trainer_ms": 1000 * (time.process_time() - cpu0) / max(1, len(waits) - 1),
    }), flush=True)  # fmt: skip
    getattr(loader, "close", lambda: None)()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=6000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sleep-ms", type=float, default=40.0)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--cpus", type=int, default=2, help="DataLoader workers = logical workers = Ray CPUs")
    parser.add_argument("--workdir", default="/tmp/energon_ray_bench/packed_blend")
    parser.add_argument("--only", default="ahead,plain")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    yaml = _data(Path(args.workdir), args.docs)
    if args.child:
        child(args.child, yaml, args.sleep_ms, args.batches, args.cpus)
        return
    from bench_captioning import measure

    names = args.only.split(",")
    results = {name: [] for name in names}
    for run in range(args.runs):
        for name in names:
            cmd = [sys.executable, __file__, "--child", name, "--docs", str(args.docs), "--sleep-ms", str(args.sleep_ms), "--batches", str(args.batches), "--cpus", str(args.cpus), "--workdir", args.workdir]
            result = measure(name, cmd)  # its last stdout line, plus the peak PSS of its process tree
            results[name].append(result)
            print(f"{name:7s} run {run}: {result['tokens_s']:,.0f} tokens/s, after batch {SKIP} {result['steady_s']:,.0f}, first batch {result['first_s']:.2f} s, {result['batches']} batches, {result['cpu_s']:.1f} CPU-s, peak PSS {result['pss']:.0f} MiB, waited {result['wait_s']:.2f} s "
                  f"after batch {SKIP} (p90 {result['wait_p90']:.1f} ms), trainer {result['trainer_ms']:.1f} ms/batch", flush=True)  # fmt: skip
    print("\n| contender | tokens/s | after batch 20 | first batch, s | CPU-s | peak PSS, MiB | waits after batch 20, s | their p90, ms | trainer CPU ms/batch |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| {name} | {med['tokens_s']:,.0f} | {med['steady_s']:,.0f} | {med['first_s']:.2f} | {med['cpu_s']:.1f} | {med['pss']:.0f} | {med['wait_s']:.2f} | {med['wait_p90']:.1f} | {med['trainer_ms']:.1f} |")
    print(f"\nmedians of {args.runs} runs, {args.docs} + {args.docs // 2} documents, a {args.sleep_ms:g} ms step per batch, {args.cpus} CPUs")


if __name__ == "__main__":
    main()
