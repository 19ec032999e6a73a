"""Restoring into a smaller batch size: each worker stream goes on with the samples it had not given.

Energon's ``restore_state_rank`` takes a state saved with micro batch size ``B`` into a loader of
batch size ``b`` when ``B`` is a multiple of ``b`` (same world size and workers): every worker resumes
after the samples it had given, so the samples come in the order the saved loader would have given
them, in batches of ``b``. A larger ``b``, or one that does not divide ``B``, is refused. Here the rest
of each worker stream becomes that stream's *prefix* (``loader.elastic`` in its same-shape mode):
nothing is lost or repeated, each stream's sample order is the saved one's and the round-robin goes
on at the worker that was next; the hook seeds are the new stream positions' (``restore_seeds``
hooks see indices counted from the restore).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, List, Optional, Tuple

from energon_ray.loader.config_summary import differences, explain, summarize
from energon_ray.loader.elastic import Redistribution, stream_prefixes, check_movable, check_order
from energon_ray.loader.savable import check_seed, describe, fingerprints, new_state, unrecorded, what_differs
from energon_ray.loader.state import LoaderState, StateError

#: ``(path in the configuration summary, saved batch size, this loader's)``
Change = Tuple[str, Any, Any]


def batch_size_changes(state: LoaderState, dataset: Any) -> List[Change]:
    """The batch sizes that differ between the configuration ``state`` was saved for and
    ``dataset``'s; empty when the state fits as it is, or was saved before configuration summaries."""
    if not state.config_summary or state.fingerprint in fingerprints(dataset):
        return []
    current = summarize(describe(dataset), max_chars=None)
    saved = state.config_summary
    return [
        (path, saved[path], value)
        for path, value in current.items()
        if _last_name(path) == "batch_size" and path in saved and saved[path] != value
    ]


def rebatch(dataset: Any, state: LoaderState, changes: List[Change]) -> Tuple[LoaderState, Optional[Redistribution]]:
    """This loader's state and stream prefixes from ``state``, saved with larger batch sizes.

    Raises:
        StateError: a batch size larger than the saved one, one that does not divide it, batching
            turned on or off, anything else that differs, or what ``loader.elastic`` cannot cut into
            prefixes (packing, ``repeats``, batches across a validation metadataset's datasets, a
            counted ``LimitDataset``, a wrapper holding pulled items).
    """
    refused = [why for why in (_refusal(*change) for change in changes) if why]
    if refused:
        raise StateError(
            f"the state was saved for another dataset configuration: {what_differs(state, dataset)}; build the loader "
            f"with the arguments it was saved with ({'; '.join(refused)})"
        )
    wc = dataset.worker_config
    if state.rank != wc.rank:
        raise StateError(f"the state was saved by rank {state.rank}, this loader is rank {wc.rank}; restore each rank's own state")
    check_seed(state.seed_offset, dataset)
    _check_nothing_else(state, dataset)
    what = f"restoring into batch size {changes[0][2]} (saved with {changes[0][1]})"
    check_movable(dataset, [state], what)  # before check_order, as elastic.check_states
    check_order(dataset, [state])
    mine = new_state(dataset, state.passes, state.epoch_items)
    if state.pass_index is None:  # saved between passes: the next pass starts afresh anyway
        return mine, None
    redist = stream_prefixes(dataset, [state], wc)
    mine = dataclasses.replace(
        mine, pass_index=state.pass_index, round_robin=state.round_robin,
        elastic={"pass_index": state.pass_index, "states": redist.origin},
    )  # fmt: skip
    return mine, redist


def _refusal(path: str, saved: Any, current: Any) -> Optional[str]:
    """Why Energon's rule refuses ``saved`` -> ``current`` (the saved micro batch size must be a
    multiple of the new one), or ``None``."""
    if not isinstance(saved, int) or not isinstance(current, int):
        return f"{path}: restoring cannot turn batching on or off, as in Energon"
    if current > saved:
        return (
            f"{path}: batch size {current} is larger than the saved {saved}; a state restores only into the saved "
            "batch size or a smaller one that divides it, as in Energon"
        )
    if saved % current:
        return (
            f"{path}: batch size {current} does not divide the saved {saved}; a state restores only into the saved "
            "batch size or a smaller one that divides it, as in Energon"
        )
    return None


def _check_nothing_else(state: LoaderState, dataset: Any) -> None:
    """Raises ``StateError`` naming what differs besides batch sizes (the worker count's and world
    size's differences are checked before)."""
    ignore = ("batch_size",) + unrecorded(state)
    named = explain(differences(state.config_summary, summarize(describe(dataset), max_chars=None), ignore=ignore))
    if named:
        raise StateError(
            f"the state was saved for another dataset configuration: {named}; only the batch size may become smaller "
            "(a divisor of the saved one); build the loader with the other arguments it was saved with"
        )


def _last_name(path: str) -> str:
    return re.split(r"[.\[]", path)[-1]
