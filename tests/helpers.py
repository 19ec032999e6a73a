"""Builders of tiny prepared datasets for tests (real tar shards, real JPEGs)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from energon_ray.format.prepare import prepare_dataset
from energon_ray.synthetic import captioning_samples, text_samples, write_shards

Samples = List[Tuple[str, Dict[str, bytes]]]

#: ``--num-workers 1`` of ``energon-ray prepare``/``prepare-media``, for tests not about workers: the
#: default starts a pool (one process per CPU), which costs more than indexing a tiny fixture.
ONE_PROCESS = ("--num-workers", "1")


def prepared(
    root: Path,
    samples: Samples,
    samples_per_shard: int,
    *,
    sample_type: str = "CaptioningSample",
    field_map: Optional[Dict[str, str]] = None,
    split_ratio: Sequence[float] = (1, 0, 0),
    split_parts: Optional[Dict[str, List[str]]] = None,
) -> Path:
    """Write ``samples`` into shards under ``root/shards`` and prepare the dataset."""
    write_shards(root / "shards", samples, samples_per_shard)
    prepare_dataset(
        root,
        split_ratio=None if split_parts else split_ratio,
        split_parts=split_parts,
        sample_type=sample_type,
        field_map=field_map or {"image": "jpg", "caption": "txt"},
        progress=False,
    )
    return root


def captioning_dataset(root: Path, n: int = 50, per_shard: int = 7, **kwargs) -> Path:
    """``n`` captioning samples (keys ``sample_000000``…) in shards of ``per_shard``."""
    return prepared(root, captioning_samples(n), per_shard, **kwargs)


def text_dataset(root: Path, counts: Sequence[int], **kwargs) -> Path:
    """Text samples whose ``txt`` is their index, in shards of the given sizes."""
    samples = text_samples(sum(counts))
    shards_dir = root / "shards"
    start = 0
    for i, count in enumerate(counts):
        write_shards(shards_dir, samples[start : start + count], max(count, 1), prefix=f"part{i:02d}")
        start += count
    prepare_dataset(
        root,
        split_ratio=kwargs.pop("split_ratio", (1, 0, 0)),
        sample_type="TextSample",
        field_map={"text": "txt"},
        progress=False,
        **kwargs,
    )
    return root


def keys_of(batches) -> List[List[str]]:
    """The ``__key__`` list of each batch."""
    return [list(b.__key__) if isinstance(b.__key__, (list, tuple)) else [b.__key__] for b in batches]


def batch_key(batch) -> Tuple[int, tuple]:
    """A loader batch's ``__restore_key__`` ``("Batch", index, *rest)`` split: ``(index, rest)``, rest
    being the samples' (or packs') keys, or ``("Batched", i, j, *their keys)``."""
    key = batch.__restore_key__
    if not (isinstance(key, tuple) and len(key) > 2 and key[0] == "Batch" and isinstance(key[1], int)):
        raise AssertionError(f"not a batch key: {key!r}")
    return key[1], tuple(key[2:])


def dump_json(path: Path, value) -> None:
    path.write_text(json.dumps(value))


def prefixed_text_dataset(root: Path, prefix: str, n: int, per_shard: int = 10, subflavors: Optional[dict] = None) -> Path:
    """Text samples keyed ``{prefix}_{index:06d}`` (so a blend's output tells its sources apart)."""
    samples = [(f"{prefix}_{key}", parts) for key, parts in text_samples(n)]
    write_shards(root / "shards", samples, per_shard)
    prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="TextSample", field_map={"text": "txt"}, progress=False)
    if subflavors:
        import yaml

        spec = root / ".nv-meta" / "dataset.yaml"
        data = yaml.safe_load(spec.read_text())
        data["subflavors"] = subflavors
        spec.write_text(yaml.safe_dump(data))
    return root


def val_metadataset(root: Path, parts: Sequence[Tuple[str, int, int]]) -> Path:
    """``root/val.yaml``: a validation metadataset (split ``val``) of text datasets ``(prefix, samples,
    per shard)`` made under ``root``, in that order."""
    for prefix, n, per_shard in parts:
        prefixed_text_dataset(root / prefix, prefix, n, per_shard=per_shard)
    entries = "".join(f"      - {{path: {prefix}, split_part: train}}\n" for prefix, _, _ in parts)
    (root / "val.yaml").write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  val:\n    blend:\n" + entries)
    return root / "val.yaml"


def classification_dataset(root: Path, prefix: str, n: int, per_shard: int = 10) -> Path:
    """ImageClassificationSample data: a JPEG and an integer class per sample."""
    from energon_ray.synthetic import encode_image, sample_image

    samples = [
        (f"{prefix}_{i:06d}", {"jpg": encode_image(sample_image(i, (16, 12))), "cls": str(i % 5).encode()})
        for i in range(n)
    ]
    write_shards(root / "shards", samples, per_shard)
    prepare_dataset(
        root, split_ratio=(1, 0, 0), sample_type="ImageClassificationSample", field_map={"image": "jpg", "label": "cls"}, progress=False
    )
    return root


def tiny_job_config(folder: Path) -> Path:
    """``jobs/captioning.yaml`` shrunk for tests (60 small images, batch 8, 32x32 crops), written to ``folder``."""
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "jobs" / "captioning.yaml").read_text())
    config["dataset"].update(num_samples=60, samples_per_shard=10, image_size=[64, 48])
    config["loader"].update(batch_size=8)
    config["task"].update(image_size=32)
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def kill_batch_makers(iterator, count: int) -> Tuple[list, set]:
    """Take ``count`` items (dicts with the ``"pid"`` of the process that batched them) and SIGKILL
    those processes (Ray workers; never this one): the items and the pids killed."""
    import os
    import signal

    got = [next(iterator) for _ in range(count)]
    killed = {item["pid"] for item in got} - {os.getpid()}
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    return got, killed


def killing_the_feeder(build, describe, counted: Sequence[str], caplog=None) -> Tuple[list, list, dict, dict]:
    """Run ``build()`` (a loader) undisturbed, then again killing the feeder actor after its first
    item (Ray loses the execution; the loader restarts it from the worker streams' checkpoints):
    ``(items, undisturbed items, loader.stats counters, undisturbed counters)``, items as
    ``describe`` shows them, counters the ``counted`` keys of ``loader.stats``. With ``caplog``, the
    restart's warning must be logged."""
    import logging

    import ray

    from energon_ray.pipeline.build import feeder

    reference = build()
    expected = [describe(item) for item in reference]
    want = {key: reference.stats.as_dict()[key] for key in counted}
    reference.close()
    loader = build()
    it = iter(loader)
    got = [describe(next(it))]
    ray.kill(feeder())
    if caplog is None:
        got += [describe(item) for item in it]
    else:
        with caplog.at_level(logging.WARNING, logger="energon_ray"):
            got += [describe(item) for item in it]
        if "restarting it from the worker streams' checkpoints (1/3)" not in caplog.text:
            raise AssertionError(f"the lost execution was not restarted: {caplog.text!r}")
    counts = {key: loader.stats.as_dict()[key] for key in counted}
    loader.close()
    return got, expected, counts, want


def load_job(name: str):
    """The module of ``jobs/<name>.py`` (the jobs are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "jobs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def usage_error(capsys, call, *args) -> str:
    """``call(*args)`` exits with status 2 (argparse's usage error); its message after ``error: ``."""
    import pytest

    with pytest.raises(SystemExit) as caught:
        call(*args)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    return err[err.index(": error: ") + len(": error: "):].strip()


def stop_abandoned_loader_workers() -> int:
    """Stop the worker processes of torch DataLoaders (Energon's) that an exception left mid-pass, and
    say how many there were. Collecting such a loader later waits 5 s per worker for them (torch's
    shutdown joins each with a 5 s timeout; they do not exit), in whatever test collects it."""
    import multiprocessing

    # a DataLoader's workers: daemon processes of their own (a pool's are "…PoolWorker-n")
    workers = [p for p in multiprocessing.active_children() if p.daemon and "PoolWorker" not in p.name]
    for process in workers:
        process.terminate()
    for process in workers:
        process.join(5)
    return len(workers)


#: what each entry point says when RAY_ADDRESS names a host:port nothing answers at, after its own name
NO_CLUSTER_AT_PORT_1 = (
    "energon_ray: no Ray cluster at 127.0.0.1:1 (Connection refused): start one there (`ray start --head`), "
    "or give another address (--address / RAY_ADDRESS); without one a private local Ray is started"
)


def last_error_line_without_a_cluster(*argv: str) -> str:
    """Run ``python *argv`` in a process of its own (one already connected to Ray keeps using it) with
    RAY_ADDRESS at a port nothing answers at; check it exits 1 without a traceback and return the last
    line it wrote to stderr."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, RAY_ADDRESS="127.0.0.1:1", PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=300, cwd=root)
    if proc.returncode != 1 or "Traceback" in proc.stderr:
        raise AssertionError(f"exit {proc.returncode}, expected 1 without a traceback:\n{proc.stderr[-3000:]}")
    return proc.stderr.splitlines()[-1]
