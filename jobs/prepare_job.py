"""Prepare a dataset on Ray: one task per tar shard, the same files ``energon-ray prepare`` writes.

    python jobs/prepare_job.py PATH --split-ratio 8,1,1 --sample-type CaptioningSample \\
        --field-map '{"image": "jpg", "caption": "txt"}' [--address ADDR] [--num-cpus N]

Each shard is indexed by a Ray task (``index_shard``: it writes the shard's ``.tar.idx`` and returns
its keys and part locations), so PATH must be on storage that every node sees at the same path. The
driver takes the results in shard order and writes ``.nv-meta`` (``.info.json``, ``split.yaml``,
``index.sqlite``, ``dataset.yaml``) with ``prepare_dataset``, the code ``energon-ray prepare`` runs:
the files are byte for byte the CLI's (``index.uuid`` is fresh on every prepare, as in Energon).
The options are the CLI's; it never prompts (``--non-interactive`` is implied). A bad shard stops
the job with the shard's name.

Ray: ``--address``, else ``RAY_ADDRESS`` (``ray job submit`` sets it), else a private local Ray
(``--num-cpus`` CPUs, every core by default); a Ray already initialized in the process is used as is.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import ray
from tqdm import tqdm

from energon_ray.cli.params import field_map_value, raising, ratio_numbers, sample_type_value, split_part_value
from energon_ray.cli.prepare import option_conflict, ratio_ignored
from energon_ray.errors import DatasetConfigError, unwrap_error
from energon_ray.format.indexer import ShardIndex, index_shard
from energon_ray.format.prepare import CRUDE, PrepareResult, already_prepared, prepare_dataset
from energon_ray.ray_env import ensure_ray

#: Results held ahead of the next shard in order (they wait for a slow earlier shard), per running task.
_BUFFER_PER_TASK = 8


class ShardTaskError(RuntimeError):
    """Ray lost a shard's task (its worker or node died) beyond Ray's own retries."""


@ray.remote(num_cpus=1)
def _index_shard_task(root: str, name: str) -> ShardIndex:
    return index_shard(root, name)


def _result(ref: ray.ObjectRef, path: Path) -> ShardIndex:
    """The task's ShardIndex, or the shard's own error (naming the shard) instead of Ray's wrapper."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as exc:
        ours = unwrap_error(exc)
        if ours is not None:  # index_shard's errors start with the shard's path
            raise ours from None
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):  # the task raised (e.g. an OSError): keep its type and text
            raise DatasetConfigError(f"{path}: cannot index the shard: {type(cause).__name__}: {cause}") from None
        raise ShardTaskError(f"{path}: Ray lost the task indexing this shard: {exc}") from None


def _drain(refs: Sequence[ray.ObjectRef]) -> None:
    """Cancel unfinished tasks and collect their outcomes, so Ray logs no 'unhandled error' for them."""
    for ref in refs:
        ray.cancel(ref)
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=5)
    for ref in ready:
        try:
            ray.get(ref)
        except Exception:  # cancelled or failed: the job already reports the first failure
            pass


class RayShardIndexer:
    """A :data:`~energon_ray.format.indexer.ShardIndexer` that runs ``index_shard`` as Ray tasks.

    Args:
        parallel: tasks running at once (None: the cluster's CPUs when called).
        progress: a tqdm bar over shards (stderr), with the samples indexed so far.
        start: called before the first task (connects to Ray): the dataset's checks come first.
    """

    def __init__(self, parallel: Optional[int] = None, progress: bool = True, start: Optional[Callable[[], None]] = None) -> None:
        self.parallel = parallel
        self.progress = progress
        self.start = start

    def __call__(self, root: Path, names: List[str]) -> Iterator[ShardIndex]:
        if self.start is not None:
            self.start()
        parallel = self.parallel or max(1, int(ray.cluster_resources().get("CPU", 1)))
        window = parallel * _BUFFER_PER_TASK
        # absolute: a task's worker runs in its own directory (on a cluster, not the job's)
        folder = os.path.abspath(root)
        running: Dict[ray.ObjectRef, int] = {}
        done: Dict[int, ShardIndex] = {}
        submitted = yielded = samples = 0
        bar = tqdm(total=len(names), desc="Indexing shards", unit="shard", disable=not self.progress)
        try:
            while yielded < len(names):
                while submitted < len(names) and len(running) < parallel and submitted - yielded < window:
                    running[_index_shard_task.remote(folder, names[submitted])] = submitted
                    submitted += 1
                if yielded in done:
                    yield done.pop(yielded)
                    yielded += 1
                    continue
                ready, _ = ray.wait(list(running), num_returns=1)
                index = running.pop(ready[0])
                done[index] = _result(ready[0], Path(root) / names[index])
                samples += done[index].count
                bar.set_postfix(samples=samples, refresh=False)
                bar.update()
        finally:
            bar.close()
            if running:
                _drain(list(running))


def _checked(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` from one of ``cli.params``' checks."""
    return raising(check, argparse.ArgumentTypeError)


#: options whose value may start with a minus sign (``--split-ratio -1,1,1``, ``--exclude -tmp``):
#: argparse takes such a value for an option of its own and says only "expected one argument"
_SIGNED_VALUE_OPTIONS = ("--split-ratio", "--exclude")


def _attach_signed_values(argv: Sequence[str]) -> List[str]:
    """``argv`` with ``--split-ratio -1,1,1`` written ``--split-ratio=-1,1,1``, so the ratio's own check
    names the bad value (and ``--exclude -tmp`` excludes ``-tmp``); a long option after one of them
    (``--split-ratio --shuffle-tars``) stays an option."""
    out: List[str] = []
    for arg in argv:
        if out and out[-1] in _SIGNED_VALUE_OPTIONS and arg.startswith("-") and not arg.startswith("--"):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The options of ``energon-ray prepare`` (never interactive) plus ``--address`` and ``--num-cpus``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("path", type=Path, help="The dataset folder (its **/*.tar and **/*.tgz are the shards).")
    add("--split-ratio", type=_checked(ratio_numbers), help="train,val,test shard ratio, e.g. '8,1,1'.")
    add("--split-parts", type=_checked(split_part_value), action="append", default=[],
        help="'name:regex' (brace-expanded, matched on shard paths); repeatable. Wins over --split-ratio.")  # fmt: skip
    add("--exclude", action="append", default=[], help="Regex of shard paths to leave out (searched anywhere); repeatable.")
    add("--shuffle-tars", action="store_true", help="Shuffle shards (seed 42) before the ratio split.")
    add("--sample-type", type=_checked(sample_type_value), help=f"Sample class name, e.g. CaptioningSample, or {CRUDE}.")
    add("--field-map", type=_checked(field_map_value), help='JSON, e.g. \'{"image": "jpg", "caption": "txt"}\'.')
    add("--dataset-yaml-name", default="dataset.yaml", help="Dataset config file name (default: dataset.yaml).")
    add("--skip-dataset-yaml", action="store_true", help="Write no dataset.yaml.")
    add("--tar-index-only", action="store_true", help="Only rebuild .tar.idx and index.sqlite of the listed shards.")
    add("--non-interactive", action="store_true", help="Accepted for the CLI's command lines; the job never prompts.")
    add("--force-overwrite", action="store_true", help="Re-prepare a dataset that already has .nv-meta.")
    add("--progress", action=argparse.BooleanOptionalAction, default=True, help="A progress bar over shards.")
    add("--address", default=None, help="Ray cluster to attach to (default: RAY_ADDRESS, else a private local Ray).")
    add("--num-cpus", type=int, default=None,
        help="Shard tasks running at once, and the CPUs of a private local Ray (default: the cluster's CPUs).")  # fmt: skip
    args = parser.parse_args(_attach_signed_values(sys.argv[1:] if argv is None else argv))
    if args.num_cpus is not None and args.num_cpus < 1:
        parser.error(f"--num-cpus must be >= 1, got {args.num_cpus}")
    if not args.path.is_dir():
        parser.error(f"{args.path}: PATH must be an existing dataset folder")
    conflict = option_conflict(args.tar_index_only, args.split_ratio, args.split_parts, args.exclude, args.shuffle_tars,
                               args.sample_type, args.field_map)  # fmt: skip
    if conflict is not None:
        parser.error(conflict)
    ignored = ratio_ignored(args.split_ratio, args.split_parts)
    if ignored is not None:
        print(f"Warning: {ignored}", file=sys.stderr)
        args.split_ratio = None
    if not args.tar_index_only and args.split_ratio is None and not args.split_parts:
        parser.error("--split-ratio or --split-parts is required")
    return args


def _prepare(args: argparse.Namespace, start: Callable[[], None]) -> PrepareResult:
    existing = already_prepared(args.path)
    if existing is not None and not (args.force_overwrite or args.tar_index_only):
        raise DatasetConfigError(f"{existing} exists: the dataset is already prepared; use --force-overwrite")
    split_parts: Optional[Dict[str, List[str]]] = None
    for name, pattern in args.split_parts:
        split_parts = split_parts or {}
        split_parts.setdefault(name, []).append(pattern)
    write_yaml = not args.skip_dataset_yaml
    return prepare_dataset(
        args.path, split_ratio=args.split_ratio, split_parts=split_parts, exclude=args.exclude,
        shuffle_tars=args.shuffle_tars, sample_type=args.sample_type if write_yaml else None,
        field_map=args.field_map if write_yaml else None, tar_index_only=args.tar_index_only,
        force_overwrite=args.force_overwrite, dataset_config=args.dataset_yaml_name,
        shard_indexer=RayShardIndexer(args.num_cpus, args.progress, start),
    )  # fmt: skip


def _report(result: PrepareResult) -> None:
    names = list(result.shard_counts)
    print(f"Indexed {result.total_samples:,} samples in {len(names)} shards ({names[0]} … {names[-1]}).")
    print(f"Parts found: {', '.join(result.part_types)}")
    for part, shards in result.split_parts.items():
        print(f"  {part}: {len(shards)} shards, {sum(result.shard_counts[s] for s in shards):,} samples")
    for path in (result.dataset_config, result.sample_loader):
        if path is not None:
            print(f"Wrote {path}")
    for warning in result.warnings:
        print(f"Warning: {warning}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the job; returns the exit code (1 with ``Error: …`` on stderr for a bad dataset or argument)."""
    args = parse_args(argv)
    started = not ray.is_initialized()
    local = not (args.address or os.environ.get("RAY_ADDRESS"))

    def start() -> None:  # Ray starts once the dataset's checks passed (they take no Ray)
        ensure_ray(args.address, **({"num_cpus": args.num_cpus} if local and args.num_cpus else {}))

    try:
        result = _prepare(args, start)
    except (DatasetConfigError, ValueError, OSError, ShardTaskError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        if started and ray.is_initialized():
            ray.shutdown()
    _report(result)
    if args.sample_type is None and not args.tar_index_only and not args.skip_dataset_yaml:
        print("No dataset.yaml written (pass --sample-type to create it).")
    print("Done.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
