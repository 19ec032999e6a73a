"""``energon-ray checkpoint info|redist``: what saved loader states hold, and a checked set for another world size.

States are read from what users save: ``save_loader_state``'s folder of rank files, one rank's
``to_json()`` file per path, or one global file holding ``save_state_global``'s list (JSON, or a
``torch.save`` file of ``to_dict()`` values, read with ``torch.load(weights_only=True)`` only: no
pickled object is ever loaded). Nothing here needs the dataset or Ray.

``redist`` writes no per-rank shares: a restore on another world size or worker count computes each
new rank's share from *every* old rank's state and the dataset's sample order
(``restore_state_global``, ``loader/elastic.py``). It checks that the states are such a set
(``elastic.check_complete``, ``elastic.check_saved_nodes``) and writes it where each new rank reads it.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from typing import Any, List, Optional, Sequence, Tuple

import click

from energon_ray.loader.elastic import check_complete, check_saved_nodes, common_pass
from energon_ray.loader.state import LoaderState, StateError
from energon_ray.loader.state_files import STATE_FILE, state_file_names, write_atomically
from energon_ray.plan.stream import SegmentLayout

#: config summary entries ``info`` shows per dataset
_DATASET_KEYS = re.compile(r"(^|\.)dataset\.(split_part|total|shards)$")

Entry = Tuple[str, Optional[LoaderState]]  # where it came from, the state (None: saved before its first batch)


def read_states(paths: Sequence[str]) -> Tuple[str, List[Entry]]:
    """``("global" | "per-rank", entries)`` of the states in ``paths``.

    Raises:
        click.ClickException: naming the file that is no energon_ray state (or not readable safely).
    """
    files: List[str] = []
    for path in paths:
        files += _rank_files(path) if os.path.isdir(path) else [path]
    contents = [(f, _load(f)) for f in files]
    if len(contents) == 1 and isinstance(contents[0][1], list):
        name, items = contents[0]
        return "global", [(f"{name}[{i}]", _state(f"{name}[{i}]", item)) for i, item in enumerate(items)]
    for name, content in contents:
        if isinstance(content, list):
            raise click.ClickException(
                f"{name}: holds a list of states (a global file); pass it alone, not with other files"
            )
    return "per-rank", [(name, _state(name, content)) for name, content in contents]


def _rank_files(folder: str) -> List[str]:
    try:
        names = os.listdir(folder)
    except OSError as exc:
        raise click.ClickException(f"{folder}: cannot be listed ({exc.strerror or exc})") from None
    found = state_file_names(names)
    if not found:
        raise click.ClickException(
            f"{folder}: no loader state files ({STATE_FILE.format(rank='N')}, as save_loader_state writes) in this folder"
        )
    return [os.path.join(folder, name) for name in found]


def _load(path: str) -> Any:
    """A file's content: JSON, or a ``torch.save`` zip read with ``weights_only=True``."""
    if zipfile.is_zipfile(path):
        return _torch_load(path)
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except OSError as exc:
        raise click.ClickException(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise click.ClickException(
            f"{path}: not an energon_ray loader state: neither JSON ({exc}) nor a torch.save file"
        ) from None


def _torch_load(path: str) -> Any:
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "megatron.energon" in text:
            raise click.ClickException(
                f"{path}: a Megatron-Energon loader checkpoint (it pickles megatron.energon objects); energon_ray "
                "cannot read Energon's states: use `energon checkpoint info`, or save the loader with energon_ray"
            ) from None
        hint = (
            "it pickles energon_ray LoaderState objects: save [s.to_dict() for s in states] (or to_json()) instead"
            if "energon_ray" in text else "it holds pickled objects"
        )  # fmt: skip
        raise click.ClickException(
            f"{path}: cannot be read with torch.load(weights_only=True), the only way this command loads a .pt "
            f"file (it never unpickles objects): {hint}"
        ) from None
    except Exception as exc:  # a zip that is no torch.save file, a cut-off one
        raise click.ClickException(
            f"{path}: not an energon_ray loader state: a zip file that torch.load cannot read ({type(exc).__name__}: {exc})"[:400]
        ) from None


def _state(name: str, content: Any) -> Optional[LoaderState]:
    if content is None:
        return None
    try:
        return LoaderState.coerce(content)
    except StateError as exc:
        raise click.ClickException(f"{name}: {exc}") from None


def _common(values: Sequence[Tuple[int, Any]]) -> str:
    """One value, or each rank's where they differ."""
    distinct = {json.dumps(v, default=str) for _, v in values}
    if len(distinct) == 1:
        return str(values[0][1])
    return "differs: " + ", ".join(f"rank {rank} {value}" for rank, value in values)


def _batch_sizes(state: LoaderState) -> List[Any]:
    return [v for k, v in state.config_summary.items() if k == "options.batch_size" or k.endswith(".options.batch_size")]


def info_lines(kind: str, entries: Sequence[Entry]) -> List[str]:
    """``checkpoint info``'s output."""
    states = [(name, s) for name, s in entries if s is not None]
    what = f"global file ({len(entries)} entries)" if kind == "global" else f"per-rank files ({len(entries)} files)"
    if not states:
        return [f"checkpoint: {what}, every rank saved before its first batch (all start afresh)"]
    per = [(s.rank, s) for _, s in states]
    lines = [
        f"checkpoint: {what}",
        f"ranks: {len(entries)} (world size {_common([(r, s.world_size) for r, s in per])})",
        f"workers per rank: {_common([(r, s.num_workers) for r, s in per])}",
        f"batch size: {_common([(r, ', '.join(map(str, _batch_sizes(s))) or 'none') for r, s in per])}",
        f"state version: {_common([(r, s.version) for r, s in per])}",
        f"seed offset: {_common([(r, s.seed_offset) for r, s in per])}",
        f"fingerprint: {_common([(r, s.fingerprint) for r, s in per])}",
        f"order fingerprint: {_common([(r, s.order_fingerprint or 'none') for r, s in per])}",
        f"task encoders: {_common([(r, ', '.join(s.task_encoders) or 'not recorded') for r, s in per])}",
    ]
    summary = states[0][1].config_summary
    shown = [f"  {k}: {v}" for k, v in summary.items() if _DATASET_KEYS.search(k)]
    lines.append("datasets (a state names no paths; rank 0's summary):" if shown else "datasets: not recorded")
    lines += shown
    for name, state in entries:
        lines += _rank_lines(name, state)
    return lines


def _rank_lines(name: str, s: Optional[LoaderState]) -> List[str]:
    if s is None:
        return [f"{name}: saved before its first batch (starts afresh)"]
    head = f"rank {s.rank} ({os.path.basename(name)}): {_where(s)} (passes started {s.passes})"
    if s.epoch_items:  # counted by an epochized loader only (0 in any other)
        head += f", items this epoch {s.epoch_items} (epochized loader)"
    if s.round_robin is not None:
        head += f", next worker {s.round_robin.next_worker}, items per worker {s.round_robin.emitted}"
    out = [head]
    if s.elastic is not None:
        out.append(f"  redistributed pass {s.elastic.get('pass_index')} from {len(s.elastic.get('states', []))} older states")
    for leaf, workers in enumerate(s.streams):
        layout = SegmentLayout.from_list(s.segment_lengths[leaf]) if leaf < len(s.segment_lengths) else None
        for w, stream in enumerate(workers):
            cp = stream.checkpoint
            at = f"segment {cp.segment}" + (f" from position {layout.start(cp.segment)}" if layout is not None else "")
            out.append(
                f"  dataset {leaf} worker {w}: {at} ({cp.event}{', done' if cp.done else ''}), items given since "
                f"{stream.consumed}, samples pooled {len(cp.refs())}"
            )
    return out


@click.group("checkpoint", invoke_without_command=True)
@click.pass_context
def checkpoint_command(ctx: click.Context) -> None:
    """Saved loader states (save_loader_state's folder, to_json files, a global list): describe them, or
    check them for a restore on another world size."""
    if ctx.invoked_subcommand is None:  # as `energon checkpoint` alone: the help, exit code 0
        click.echo(ctx.get_help())


@checkpoint_command.command("info")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
def checkpoint_info_command(paths: Tuple[str, ...]) -> None:
    """What the saved states in PATHS hold: ranks, workers, batch size, where each worker stream stood."""
    kind, entries = read_states(paths)
    for line in info_lines(kind, entries):
        click.echo(line)


@checkpoint_command.command("redist")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.argument("out", type=click.Path())
@click.option("--new-world-size", type=click.IntRange(min=1),
              help="Ranks that will restore (asked for, as Energon's, when not given).")  # fmt: skip
@click.option("--new-num-workers", type=click.IntRange(min=1), default=None, help="Workers per new rank (default: as saved).")
def checkpoint_redist_command(
    paths: Tuple[str, ...], out: str, new_world_size: Optional[int], new_num_workers: Optional[int]
) -> None:
    """Check that PATHS hold every rank's state of one run at one step, and write them to OUT for
    NEW_WORLD_SIZE ranks: a folder of rank files (each new rank calls restore_loader_state(loader, OUT))
    or, OUT ending in .json, one global file (each new rank passes its list to restore_state_global).
    Each new rank's share is computed at restore, from all the states and the dataset."""
    kind, entries = read_states(paths)
    if any(s is None for _, s in entries):
        missing = [name for name, s in entries if s is None]
        raise click.ClickException(
            f"{', '.join(missing)}: saved before its first batch; restoring on another world size needs every "
            "rank's state (restore with the world size it was saved with, or save again after a batch)"
        )
    if new_world_size is None:  # as Energon's: show the saved shape, then ask
        saved = entries[0][1]
        click.echo(f"Current DP world size: {saved.world_size}")
        click.echo(f"Current number of workers per DP rank: {saved.num_workers}")
        new_world_size = click.prompt("Please enter the new DP world size", type=click.IntRange(min=1))
    what = f"restoring on world size {new_world_size}"
    try:
        states = check_complete([s for _, s in entries])
        check_saved_nodes(states, what)
        _check_one_run(states)
    except StateError as exc:
        raise click.ClickException(f"{', '.join(paths)}: {exc}") from None
    old_world, old_workers = states[0].world_size, states[0].num_workers
    workers = new_num_workers or old_workers
    written = _write(out, states)
    running = common_pass(states)  # a rank saved after finishing the pass the others are in counts as in it
    where = f"pass {running}" if running is not None else "between passes"
    click.echo(f"read {len(states)} states ({kind}): world size {old_world}, {old_workers} workers per rank, {where}")
    click.echo(f"new shape: world size {new_world_size}, {workers} workers per rank")
    if (new_world_size, workers) == (old_world, old_workers):
        click.echo("same shape as saved: each rank restores its own state exactly")
    click.echo(f"wrote {written}")
    click.echo(
        "each new rank: " + ("restore_state_global(json.load(open(OUT)))" if out.endswith(".json") else
                             "restore_loader_state(loader, OUT)")
        + "; the restore checks the dataset (sample order, no packing or counted repeats) and computes its share"
    )  # fmt: skip


def _where(state: LoaderState) -> str:
    return f"pass {state.pass_index}" if state.pass_index is not None else "between passes"


def _check_one_run(states: Sequence[LoaderState]) -> None:
    """Raises ``StateError`` where ranks' states name different datasets or batch sizes."""
    for what, get in (("order fingerprint", lambda s: s.order_fingerprint), ("batch size", _batch_sizes)):
        values = [get(s) for s in states]
        if any(v != values[0] for v in values):
            raise StateError(
                f"the ranks' states are of different runs ({what}: "
                + ", ".join(f"rank {s.rank} {v}" for s, v in zip(states, values)) + ")"
            )


def _write(out: str, states: Sequence[LoaderState]) -> str:
    """Write ``states`` to ``out`` (a ``.json`` global file, or a folder of rank files); what was written."""
    if out.endswith(".json"):
        if os.path.exists(out):  # as a folder's rank files: a state (one of PATHS, too) is never overwritten
            raise click.ClickException(f"{out}: already exists; pick a new file name")
        write_atomically(out, json.dumps([s.to_dict() for s in states], separators=(",", ":")))
        return f"a global file of {len(states)} states: {out}"
    os.makedirs(out, exist_ok=True)
    taken = state_file_names(os.listdir(out))
    if taken:
        raise click.ClickException(f"{out}: already holds loader state files ({', '.join(sorted(taken))}); pick an empty folder")
    for s in states:
        write_atomically(os.path.join(out, STATE_FILE.format(rank=s.rank)), s.to_json())
    return f"{len(states)} rank files to {out}"

