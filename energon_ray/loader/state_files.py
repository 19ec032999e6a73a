"""Where loader states travel: gathered and broadcast over ``torch.distributed`` for
``save_state_global`` / ``restore_state_global``, and one JSON file per rank in a checkpoint
folder (``save_loader_state`` / ``restore_loader_state``, the files ``energon-ray checkpoint`` reads).
"""

from __future__ import annotations

import os
import re
from typing import Any, List, Optional

from energon_ray.loader.state import LoaderState, StateError

#: One file per rank in a checkpoint folder, so every rank of a ``ray.train`` run reports into one checkpoint.
STATE_FILE = "energon_ray_loader_rank{rank}.json"
_RANK_FILE = re.compile(re.escape(STATE_FILE).replace(re.escape("{rank}"), r"(\d+)") + "$")


def state_file_names(names: List[str]) -> List[str]:
    """The rank state files among the file ``names`` of a folder, in rank order (rank 10 after 2)."""
    found = [(int(m.group(1)), name) for name in names if (m := _RANK_FILE.match(name))]
    return [name for _, name in sorted(found)]


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it (a reader never sees half)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _distributed() -> Any:
    """``torch.distributed`` when a process group is up, else None (imported here: states travel
    without torch)."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def gather_states(state: Optional[LoaderState], dst_rank: int, world_size: int = 1) -> Optional[List[Optional[LoaderState]]]:
    """Every rank's ``state`` gathered on ``dst_rank`` (``torch.distributed``; a list of one without
    it, for a world size of 1); ``None`` on the other ranks.

    Raises:
        StateError: ``world_size`` above 1 without a process group (each rank would get a list of its
            own state alone, which ``restore_state_global`` refuses).
    """
    dist = _distributed()
    if dist is None:
        if world_size > 1:
            raise StateError(
                f"save_state_global gathers the states of all {world_size} ranks with torch.distributed, and no process "
                "group is initialized; call save_state_rank() on every rank and keep each rank's state (or "
                "save_loader_state(loader, folder): one file per rank, read back by restore_loader_state)"
            )
        return [state]
    out: Optional[List[Any]] = [None] * dist.get_world_size() if dist.get_rank() == dst_rank else None
    dist.gather_object(state, out, dst=dst_rank)
    return out


def broadcast_states(states: Any, src_rank: Optional[int], world_size: int = 1) -> Any:
    """``states`` as rank ``src_rank`` passed them, on every rank (``None``: each rank's own).

    Raises:
        StateError: ``src_rank`` on a world size above 1 without a process group, where this rank
            passed no states (it cannot receive them).
    """
    dist = _distributed()
    if src_rank is not None and dist is None and world_size > 1 and states is None:
        raise StateError(
            f"restore_state_global(src_rank={src_rank}) broadcasts the states with torch.distributed, and no process "
            f"group is initialized (world size {world_size}); pass the list of states on every rank, src_rank=None"
        )
    if src_rank is None or dist is None:
        return states
    box: List[Any] = [states if dist.get_rank() == src_rank else None]
    dist.broadcast_object_list(box, src=src_rank)
    return box[0]


def save_loader_state(loader: Any, directory: str) -> Optional[str]:
    """Write ``loader.save_state_rank()`` into ``directory`` as ``energon_ray_loader_rank{rank}.json``
    (nothing before the first iteration); returns the file's path. ``directory`` is created if it
    does not exist yet.

    Example:
        >>> with tempfile.TemporaryDirectory() as d:                       # doctest: +SKIP
        ...     save_loader_state(loader, d)
        ...     ray.train.report(metrics, checkpoint=Checkpoint.from_directory(d))
    """
    state = loader.save_state_rank()
    if state is None:
        return None
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, STATE_FILE.format(rank=state.rank))
    write_atomically(path, state.to_json())
    return path


def restore_loader_state(loader: Any, directory: str) -> bool:
    """Restore ``loader`` from its rank's file in ``directory`` (see ``save_loader_state``); ``False``
    if the folder has none (a checkpoint taken before the loader first iterated, here or on every
    rank: the loader starts afresh). When the files were
    saved by another world size or worker count, every rank's file is read and the rest of the epoch
    is shared out anew (``restore_state_global``).

    Example:
        >>> checkpoint = ray.train.get_checkpoint()                          # doctest: +SKIP
        >>> if checkpoint:                                                   # doctest: +SKIP
        ...     with checkpoint.as_directory() as d:
        ...         restore_loader_state(loader, d)
    """
    wc = loader.dataset.worker_config
    path = os.path.join(directory, STATE_FILE.format(rank=wc.rank))
    if os.path.isfile(path):
        state = _read_state(path)
        if (state.world_size, state.num_workers) == (wc.world_size, max(1, wc.num_workers)):
            loader.restore_state_rank(state)
            return True
    names = state_file_names(os.listdir(directory))
    if not names:
        return False
    states = [_read_state(os.path.join(directory, name)) for name in names]
    if all((s.world_size, s.num_workers) == (wc.world_size, max(1, wc.num_workers)) for s in states):
        return False  # this rank saved before its first batch, the others after theirs: it starts afresh
    loader.restore_state_global(states)
    return True


def _read_state(path: str) -> LoaderState:
    """The state in the file ``path``.

    Raises:
        StateError: naming the file, where it holds no loader state (cut off, edited, another file).
    """
    with open(path) as f:
        text = f.read()
    try:
        return LoaderState.coerce(text)
    except StateError as exc:
        raise StateError(f"{path}: {exc}") from None
