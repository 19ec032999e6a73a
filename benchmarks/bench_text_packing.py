"""Text packing: efficiency (real tokens / slots) and throughput (tokens/s) of the ready text task.

A JSONL corpus with log-normal document lengths (mean ~300 words, sigma 1.0, like web text) is
tokenized, packed first-fit-decreasing into 2048-token rows on Ray, and batched by 8.

    python benchmarks/bench_text_packing.py [--docs 20000] [--runs 3] [--buffer 512] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")

import energon_ray as er  # noqa: E402
from energon_ray.format.jsonl import prepare_jsonl  # noqa: E402
from energon_ray.tasks.text_packing import TextPackingTaskEncoder, lognormal_corpus  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--buffer", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2, help="logical worker streams (WorkerConfig.num_workers)")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--workdir", default="/tmp/energon_ray_bench/text")
    args = parser.parse_args()
    path = Path(args.workdir) / f"corpus_{args.docs}.jsonl"
    if not Path(str(path) + ".idx").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        docs = lognormal_corpus(args.docs, mean_words=300, sigma=1.0, seed=0)
        path.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
        prepare_jsonl(path, progress=False)
    from energon_ray.ray_env import ensure_ray

    ensure_ray()
    results = []
    for run in range(args.runs):
        encoder = TextPackingTaskEncoder(max_length=args.max_length)
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=args.workers)
        ds = er.get_val_dataset(path, batch_size=8, worker_config=wc, packing_buffer_size=args.buffer, task_encoder=encoder)
        start = time.perf_counter()
        tokens = rows = docs_seen = 0
        for batch in er.get_loader(ds):
            tokens += int(batch.num_tokens.sum())
            rows += batch.input_ids.shape[0]
            docs_seen += sum(len(d) for d in batch.documents)
        elapsed = time.perf_counter() - start
        if docs_seen != args.docs:
            raise RuntimeError(f"packed {docs_seen} documents, expected {args.docs}")
        results.append((tokens / elapsed, tokens / (rows * args.max_length)))
        print(f"run {run}: {tokens} tokens in {rows} rows, {tokens / elapsed:,.0f} tokens/s, efficiency {results[-1][1]:.4f}", flush=True)
    print(
        f"\nmedian of {args.runs}: {statistics.median(r[0] for r in results):,.0f} tokens/s, packing efficiency "
        f"{statistics.median(r[1] for r in results):.2%} ({args.docs} docs, buffer {args.buffer}, rows of {args.max_length})"
    )


if __name__ == "__main__":
    main()
