"""``energon-ray lint PATH``: decode every sample the way the loader does and list the bad ones.

``.nv-meta/index.sqlite`` must open and count the samples ``.info.json`` counts. Each shard's
``.tar.idx`` is checked against ``.info.json`` and against the tar (no sample before its
first offset or after its end, each offset on a sample's first header); then every sample is read
through the index, each part decoded by the loader's ``SampleDecoder`` and each field built into the
sample type. One line per problem (``shard  key  field  reason``), then ``N samples checked, K bad``;
the exit code is 1 when anything is bad.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import sys
import tarfile
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import click
from tqdm import tqdm

from energon_ray.cli.local_read import (
    ALL_PARTS, LocalDataset, LocalShard, Problem, SampleChecker, ShardSamples, check_path_options, config_file_options,
    open_local, split_parts_option,
)  # fmt: skip
from energon_ray.cli.params import LocalDatasetPath, user_errors
from energon_ray.format.pool import process_pool
from energon_ray.decode.part_limits import DEFAULT_MAX_PART_BYTES
from energon_ray.decode.sample_decoder import SampleDecoder
from energon_ray.errors import DatasetConfigError, IndexMismatchError, ShardReadError, resolve_trust
from energon_ray.format.info import META_DIR, read_info
from energon_ray.format.tar_index import check_tar_index, index_path, read_tar_index
from energon_ray.format.tar_reader import SKIP_META_RE, TAR_ENCODING, parse_sample, split_member_name

#: Samples per unit of work (a progress step; a task of the process pool with ``--jobs``).
RUN_LENGTH = 64
_BLOCK = 512


@dataclasses.dataclass(frozen=True)
class Run:
    """Samples ``first..stop-1`` of one shard to check (picklable)."""

    shard: LocalShard
    first: int
    stop: int

    @property
    def size(self) -> int:
        return sum(1 for i in range(self.first, self.stop) if i not in self.shard.excluded)


@dataclasses.dataclass
class ShardPlan:
    """A shard's index problems and the runs of its samples to check."""

    shard: LocalShard
    problems: List[Problem]
    runs: List[Run]


def _reprepare(dataset: LocalDataset) -> str:
    if dataset.format == "jsonl":
        return f"re-run `energon-ray prepare {dataset.root}`"
    return f"re-run `energon-ray prepare --tar-index-only {dataset.root}`"


#: The sample index ``prepare`` writes beside ``.info.json`` (joins, file stores and media metadata read it).
INDEX_DB = "index.sqlite"


def index_db_problems(dataset: LocalDataset) -> List[Problem]:
    """``.nv-meta/index.sqlite`` opens and holds what ``prepare`` writes: its ``samples`` and
    ``sample_parts`` tables, and one ``samples`` row per sample that ``.info.json`` counts. Cheap: two
    queries, no scan of the file. None for a .jsonl, or a dataset without the file (the loader reads
    the ``.tar.idx`` files, and a dataset from an old Energon has no index.sqlite)."""
    if dataset.format != "tar":
        return []
    root = Path(dataset.root)
    file = root / META_DIR / INDEX_DB
    if not file.is_file():
        return []
    expected = sum(read_info(root).values())
    try:
        with contextlib.closing(sqlite3.connect(f"{file.absolute().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            missing = [table for table in ("samples", "sample_parts") if table not in tables]
            if missing:
                what = f"has no table {' or '.join(missing)}"
            else:
                rows = db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
                what = None if rows == expected else f"holds {rows} samples, .info.json counts {expected}"
    except sqlite3.Error as exc:
        what = f"cannot be read as SQLite ({exc})"
    if what is None:
        return []
    return [Problem(f"{META_DIR}/{INDEX_DB}", "-", "index", f"{file}: {what}; {_reprepare(dataset)}")]


def _outside_index(dataset: LocalDataset, shard: LocalShard, offsets) -> List[Problem]:
    """Samples the tar holds before the first or after the last offset of its index (a stale index)."""
    name, path = shard.info.name, shard.info.path
    problems = []
    first, end = int(offsets[0]), int(offsets[-1])
    with open(path, "rb") as file:
        head = os.pread(file.fileno(), first, 0) if first else b""
        tail = os.pread(file.fileno(), _BLOCK, end)
    if dataset.format == "jsonl":
        if head.strip() or tail.strip():
            where = "before the first" if head.strip() else "after the last"
            problems.append(Problem(name, "-", "index", f"{index_path(path)}: lines {where} indexed line; {_reprepare(dataset)}"))
        return problems
    if head:
        try:
            key = parse_sample(head, path, 0)[0]
        except (IndexMismatchError, ShardReadError):
            key = None  # no sample there (a misaligned first offset is reported with sample 0)
        if key is not None:
            problems.append(Problem(name, "-", "index", f"{index_path(path)}: sample {key!r} lies before the first "
                                    f"indexed sample (byte {first}); {_reprepare(dataset)}"))  # fmt: skip
    if tail.strip(b"\0"):
        try:
            member = tarfile.TarInfo.frombuf(tail.ljust(_BLOCK, b"\0"), **TAR_ENCODING).name
        except tarfile.TarError:
            member = None
        what = f"tar member {member!r}" if member is not None else "data that is no tar end marker"
        split = split_member_name(member) if member is not None and not SKIP_META_RE.match(member) else None
        if member is None or split is not None:
            problems.append(Problem(name, "-", "index", f"{index_path(path)}: {what} follows the index's end "
                                    f"(byte {end}); {_reprepare(dataset)}"))  # fmt: skip
    return problems


def plan_shard(dataset: LocalDataset, shard: LocalShard) -> Tuple[List[Problem], int]:
    """The shard's index problems and how many samples can be read through its index (0: none).

    Raises:
        OSError: the shard cannot be read at all.
    """
    name = shard.info.name
    try:
        offsets = read_tar_index(shard.info.path)
    except DatasetConfigError as exc:
        return [Problem(name, "-", "index", str(exc))], 0
    problems = []
    try:
        check_tar_index(shard.info.path, offsets, shard.info.count)
    except DatasetConfigError as exc:
        problems.append(Problem(name, "-", "index", str(exc)))
        if not os.path.isfile(shard.info.path) or (len(offsets) > 1 and (offsets[1:] <= offsets[:-1]).any()):
            return problems, 0
    problems += _outside_index(dataset, shard, offsets)
    return problems, len(offsets) - 1


def plan(dataset: LocalDataset, limit: Optional[int]) -> List[ShardPlan]:
    """Every shard's index problems and runs of samples, up to ``limit`` samples to check in all."""
    left = limit if limit is not None else float("inf")
    plans = []
    for shard in dataset.shards:
        problems, count = plan_shard(dataset, shard) if left > 0 else ([], 0)
        runs = []
        for first in range(0, count, RUN_LENGTH):
            if left <= 0:
                break
            run = Run(shard, first, min(first + RUN_LENGTH, count))
            if run.size > left:
                keep = [i for i in range(run.first, run.stop) if i not in shard.excluded][: int(left)]
                run = Run(shard, first, keep[-1] + 1)
            left -= run.size
            runs.append(run)
        plans.append(ShardPlan(shard, problems, runs))
    return plans


def check_run(dataset: LocalDataset, checker: SampleChecker, run: Run) -> List[Problem]:
    """Read and load every sample of the run that ``split.yaml`` does not exclude; their problems."""
    name = run.shard.info.name
    samples = ShardSamples(dataset, run.shard)
    problems: List[Problem] = []
    try:
        for index in range(run.first, run.stop):
            if index in run.shard.excluded:
                continue
            try:
                raw = samples.raw(index)
            except IndexMismatchError as exc:
                problems.append(Problem(name, samples.key(index), "index", str(exc)))
                continue
            except ShardReadError as exc:
                problems.append(Problem(name, samples.key(index), "-", str(exc)))
                continue
            problems += checker.load(raw)[1]
    finally:
        samples.close()
    return problems


_WORKER: Optional[Tuple[LocalDataset, SampleChecker]] = None


def _init_worker(dataset: LocalDataset, decoder: SampleDecoder) -> None:
    global _WORKER
    _WORKER = (dataset, SampleChecker(dataset.spec, decoder))


def _check_in_worker(run: Run) -> List[Problem]:
    assert _WORKER is not None, "the pool's initializer did not run"
    return check_run(_WORKER[0], _WORKER[1], run)


def _results(dataset: LocalDataset, decoder: SampleDecoder, runs: List[Run], jobs: int) -> Iterator[List[Problem]]:
    """Each run's problems, in run order (in this process, or in a pool of ``jobs`` processes)."""
    if jobs <= 1 or len(runs) <= 1:
        checker = SampleChecker(dataset.spec, decoder)
        return (check_run(dataset, checker, run) for run in runs)
    # made now, before the progress bar starts its monitor thread: as `prepare --num-workers`, the
    # workers are forked (they start at once) unless this process runs other threads
    return _pooled(process_pool(min(jobs, len(runs)), initializer=_init_worker, initargs=(dataset, decoder)), runs)


def _pooled(pool, runs: List[Run]) -> Iterator[List[Problem]]:
    with pool:
        try:
            yield from pool.map(_check_in_worker, runs)
        finally:
            pool.shutdown(cancel_futures=True)


def _emit(bar: tqdm, line: str) -> None:
    if bar.disable:
        click.echo(line)
    else:
        bar.write(line, file=sys.stdout)


def lint(dataset: LocalDataset, decoder: SampleDecoder, limit: Optional[int], jobs: int) -> Tuple[int, int, int]:
    """Check the dataset, printing each problem as it is found.

    Returns:
        ``(samples checked, bad samples, index problems)``.
    """
    plans = plan(dataset, limit)
    runs = [run for p in plans for run in p.runs]
    checked, bad, index_problems = 0, set(), 0
    results = _results(dataset, decoder, runs, jobs)
    with tqdm(total=sum(r.size for r in runs), unit="sample", desc="Linting", file=sys.stderr,
              disable=not sys.stderr.isatty()) as bar:  # fmt: skip
        for problem in index_db_problems(dataset):
            index_problems += 1
            _emit(bar, problem.line())
        try:
            for shard_plan in plans:  # shard by shard: its index problems, then its samples'
                index_problems += len(shard_plan.problems)
                for problem in shard_plan.problems:
                    _emit(bar, problem.line())
                for run in shard_plan.runs:
                    for problem in next(results):
                        bad.add((problem.shard, problem.key))
                        _emit(bar, problem.line())
                    checked += run.size
                    bar.update(run.size)
        finally:
            results.close()
    return checked, len(bad), index_problems


@click.command(name="lint")
@click.argument("path", type=LocalDatasetPath("lint"))
@click.option("--split-part", "--split-parts", "split_parts", default=ALL_PARTS, show_default=True,
              callback=split_parts_option,
              help="Split parts to check (train, val, test, …; a comma list, as Energon's --split-parts), or all "
              "of them; ignored for .jsonl. A part with no shards is skipped (all: an error if none has any).")  # fmt: skip
@config_file_options
@click.option("--limit", type=click.IntRange(min=1), help="Check only the first N samples.")
@click.option("-j", "--jobs", "--parallel", type=click.IntRange(min=0), default=1, show_default=True,
              help="Processes decoding in parallel (0 or 1: in this process; --parallel is Energon's name).")
@click.option("--max-image-pixels", type=click.IntRange(min=1),
              help="Refuse images with more pixels (default: PIL.Image.MAX_IMAGE_PIXELS, as the loader).")
@click.option("--max-part-bytes", type=click.IntRange(min=1), default=DEFAULT_MAX_PART_BYTES, show_default=True,
              help="Refuse a part over this many bytes (a .gz part: inflated; json, txt, npy, …), as the loader.")
@click.option("--trust-dataset-code", is_flag=True,
              help="Run the code the dataset brings (sample_loader.py, part_filter, pickled parts).")
def lint_command(
    path: Path, split_parts: Tuple[str, ...], split_config: str, dataset_config: str, limit: Optional[int], jobs: int,
    max_image_pixels: Optional[int], max_part_bytes: int, trust_dataset_code: bool,
) -> None:  # fmt: skip
    """Decode every sample of the prepared dataset (or .jsonl file) at PATH as the loader does; list each
    bad sample as `shard  key  field  reason`, then `N samples checked, K bad`. Exit code 1 if any is bad.

    Also checks each shard's .tar.idx against the tar, and .nv-meta/index.sqlite against .info.json. Samples that split.yaml excludes are not checked.
    The dataset runs no code unless --trust-dataset-code (or ENERGON_RAY_TRUST_DATASET_CODE=1).
    """
    check_path_options(path, split_config, dataset_config)
    trusted = resolve_trust(True if trust_dataset_code else None)
    decoder = SampleDecoder(trust_dataset_code=trusted, max_image_pixels=max_image_pixels, max_part_bytes=max_part_bytes)
    with user_errors():
        dataset = open_local(path, split_parts, trusted, split_config=split_config, dataset_config=dataset_config)
        for part in dataset.empty_parts:
            click.echo(f"Skipping empty split part {part}")
        checked, bad, index_problems = lint(dataset, decoder, limit, jobs)
    excluded = dataset.excluded
    if excluded and limit is None:
        click.echo(f"{excluded} samples excluded by {split_config} (not checked)")
    summary = f"{checked} samples checked, {bad} bad"
    if index_problems:
        summary += f", {index_problems} index problems"
    click.echo(summary)
    if bad or index_problems:
        click.get_current_context().exit(1)
