"""Remote datasets: samples/s from local disk vs from an S3 server in one run, requests per segment
and bytes read per sample.

One captioning dataset (JPEG 320x240 + caption) is prepared on disk and copied to a bucket of an S3
server. Unless ``--endpoint``/``--url`` name a real store, the server is moto in server mode in its
own process on a free local port (so its request handling does not share the driver's GIL). Every
run reads both copies with the same loader, interleaved, on one private Ray:

* ``val``: a whole validation pass (samples in order: each segment's samples of a shard are one run);
* ``train``: ``--batches`` shuffled training batches (``max_samples_per_sequence=8``, shuffle buffer
  64: a segment's samples come from several slices, coalesced per shard into sorted runs); once more
  with ``ENERGON_RAY_STORAGE_MAX_GAP_BYTES=--gap`` (runs that close read as one request, gap included).

The task encoder only measures the payload (no JPEG decoding), so the columns show the read path.
The server's own ceiling is measured first: ranged GETs of one sample each, 8 in flight, from the
driver without Ray (a local moto server spends milliseconds of CPU per request on the same cores).
Columns: samples/s (median of runs), store requests per segment (``loader.stats.read_requests``:
local preads, or ranged GETs plus each worker's first read of a ``.tar.idx``), samples per segment,
bytes read per sample next to the mean sample size, and retries.

    python benchmarks/bench_remote.py [--samples 4000] [--runs 3] [--batches 60] [--cpus 2]
    python benchmarks/bench_remote.py --url s3://bucket/prefix   # an existing copy; AWS_* variables set
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402

import energon_ray as er  # noqa: E402
from energon_ray.format.info import meta_dir  # noqa: E402
from energon_ray.format.prepare import prepare_dataset  # noqa: E402
from energon_ray.format.tar_index import read_tar_index  # noqa: E402
from energon_ray.synthetic import write_captioning_dataset  # noqa: E402

BATCH = 32
BUCKET = "bench"


class PayloadOnly(er.DefaultTaskEncoder):
    """Keeps the raw JPEG bytes (no decoding) and returns the keys and payload sizes of each batch."""

    decoder = None

    def encode_batch(self, batch):
        return {"keys": batch.__key__, "bytes": [len(x) for x in batch.image]}


def make_local(root: Path, samples: int) -> Path:
    path = root / f"cap_{samples}"
    if not (meta_dir(path) / ".info.json").is_file():
        write_captioning_dataset(path, samples, 250, image_size=(320, 240))
        prepare_dataset(path, split_ratio=[1, 1, 0], sample_type="CaptioningSample",
                        field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
    return path


def start_moto() -> tuple:
    """moto's S3 server in a child process on a free port; returns ``(process, endpoint)``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


def upload(local: Path, endpoint: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        client.put_object(Bucket=BUCKET, Key=f"{local.name}/{path.relative_to(local).as_posix()}", Body=path.read_bytes())
    return f"s3://{BUCKET}/{local.name}"


def dataset(path, mode: str, wc):
    if mode == "val":
        return er.get_val_dataset(path, worker_config=wc, batch_size=BATCH, task_encoder=PayloadOnly())
    return er.get_train_dataset(path, worker_config=wc, batch_size=BATCH, shuffle_buffer_size=64,
                                max_samples_per_sequence=8, task_encoder=PayloadOnly())  # fmt: skip


def measure(path, mode: str, batches: int, wc) -> dict:
    """One pass (val) or ``batches`` batches (train) after 2 warm-up batches; rates and the loader's read stats."""
    loader = er.get_loader(dataset(path, mode, wc))
    it = iter(loader)
    for _ in range(2):
        next(it)
    count, start = 0, time.perf_counter()
    for batch in it:
        count += len(batch["keys"])
        if mode == "train" and count >= batches * BATCH:
            break
    elapsed = time.perf_counter() - start
    stats = loader.stats
    loader.close()
    segments = max(1, sum(stats.segments_per_node.values()))
    return {
        "rate": count / elapsed,
        "requests/segment": stats.read_requests / segments,
        "samples/segment": stats.samples_read / segments,
        "bytes/sample": stats.read_bytes / max(1, stats.samples_read),
        "retries": stats.read_retries,
    }


def server_ceiling(url: str, local: Path, requests: int = 400) -> float:
    """Ranged GETs per second the store serves (one sample each, 8 in flight)."""
    from concurrent.futures import ThreadPoolExecutor

    from energon_ray.storage import as_path

    shard = sorted(local.rglob("*.tar"))[0]
    offsets = read_tar_index(shard)
    remote = as_path(f"{url}/{shard.relative_to(local).as_posix()}")
    picks = np.random.default_rng(0).integers(0, len(offsets) - 1, requests)

    def get(i: int) -> int:
        return len(remote.read_range(int(offsets[i]), int(offsets[i + 1] - offsets[i])))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(get, picks[:20]))
        start = time.perf_counter()
        list(pool.map(get, picks))
    return requests / (time.perf_counter() - start)


def contenders(local: Path, url: str, gap: int) -> list:
    """``(pass, source label, path, extra environment)`` in the order they run."""
    gap_env = {"ENERGON_RAY_STORAGE_MAX_GAP_BYTES": str(gap)}
    return [("val", "local", local, {}), ("val", "s3", url, {}), ("train", "local", local, {}),
            ("train", "s3", url, {}), ("train", f"s3, max gap {gap // 1024} KiB", url, gap_env)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=60, help="train batches per run")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="logical worker streams")
    parser.add_argument("--gap", type=int, default=256 * 1024, help="ENERGON_RAY_STORAGE_MAX_GAP_BYTES of the last row")
    parser.add_argument("--endpoint", help="an S3 endpoint to upload to (default: a local moto server)")
    parser.add_argument("--url", help="an already uploaded copy of the dataset (skips the upload)")
    parser.add_argument("--workdir", default="/tmp/energon_ray_bench/remote")
    args = parser.parse_args()
    local = make_local(Path(args.workdir), args.samples)
    proc = None
    if args.url is None:
        endpoint = args.endpoint
        if endpoint is None:
            proc, endpoint = start_moto()
            os.environ.update(AWS_ACCESS_KEY_ID="bench-access-key", AWS_SECRET_ACCESS_KEY="bench-secret-key",
                              AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        url = upload(local, endpoint)
    else:
        url = args.url
    sizes = np.concatenate([np.diff(read_tar_index(p)) for p in local.rglob("*.tar")])
    ceiling = server_ceiling(url, local)
    from energon_ray.ray_env import ensure_ray

    ensure_ray(num_cpus=args.cpus)
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=args.workers)
    runs_of = contenders(local, url, args.gap)
    results = {(mode, where): [] for mode, where, _, _ in runs_of}
    try:
        for run in range(args.runs):
            for mode, where, path, env in runs_of:
                os.environ.update(env)
                try:
                    results[(mode, where)].append(measure(path, mode, args.batches, wc))
                finally:
                    for name in env:
                        del os.environ[name]
            print(f"run {run}: " + ", ".join(f"{m}/{w} {v[-1]['rate']:.0f}/s" for (m, w), v in results.items()), flush=True)
    finally:
        import ray

        ray.shutdown()  # before the server goes: no task of a closed loader still reads from it
        if proc is not None:
            proc.terminate()
    print(f"\n{url} ({args.samples} samples, mean sample {sizes.mean():.0f} B), batch {BATCH}, "
          f"{args.workers} workers, {args.cpus} CPUs; medians of {args.runs} runs; the server alone: "
          f"{ceiling:.0f} ranged GETs/s\n")  # fmt: skip
    print("| pass | source | samples/s | requests/segment | samples/segment | bytes read/sample | retries |")
    print("|---|---|---|---|---|---|---|")
    for (mode, where), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {mode} | {where} | {med['rate']:.0f} | {med['requests/segment']:.1f} | {med['samples/segment']:.0f} "
              f"| {med['bytes/sample']:.0f} | {med['retries']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
