"""Save and restore of ``EnergonLoader``: ``save_state_rank``/``restore_state_rank``, the global
variants over all ranks (another world size or worker count shared out anew: ``loader.elastic``; a
smaller batch size: ``loader.rebatch``), and ``restore_sample``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, List, Optional

from energon_ray.loader.elastic import Redistribution, from_origin, needs_redistribution, own_state, redistribute
from energon_ray.loader.rebatch import batch_size_changes, rebatch
from energon_ray.loader.remake import blocker
from energon_ray.loader.restore_keys import restore_sample
from energon_ray.loader.savable import adopt_layouts, adopt_pack_batching, adopt_val_packing, check_fits, new_state
from energon_ray.loader.state import LoaderState, StateError
from energon_ray.loader.state_files import broadcast_states, gather_states

logger = logging.getLogger("energon_ray")


class LoaderSaving:
    """``EnergonLoader``'s save and restore methods (a mixin: it reads the loader's pass, counters
    and live run, and starts the restored pass with its ``close`` and ``_multi_feed``)."""

    def save_state_rank(self) -> Optional[LoaderState]:
        """This rank's state: positions, counters and flags (no sample data), or ``None`` before the
        first iteration. Restoring it into a loader built with the same arguments continues with
        exactly the batches this loader yields next."""
        if self._restore is not None:
            return self._restore
        if not self._started:
            return None
        state = new_state(self.dataset, self._passes, self._epoch_items if self.dataset.virtual_epoch_length() else 0)
        live = self._live
        if live is None:
            return state
        state = live.save(state)
        if self._redist is not None and self._redist.pass_index == live.pass_index:
            state.elastic = {"pass_index": live.pass_index, "states": self._redist.origin}
        return state

    def restore_state_rank(self, state: Any) -> None:
        """Continue from a state of ``save_state_rank`` (the object, its ``to_dict()`` or ``to_json()``);
        ``None`` does nothing. The next ``iter()`` yields what the saved loader would have yielded next;
        an iterator opened before the restore raises ``RuntimeError`` on its next ``next()``.

        Raises:
            StateError: another state version, dataset configuration or WorkerConfig (for another world
                size or worker count, pass every rank's state to ``restore_state_global``); a batch size
                that is larger than the saved one or does not divide it (a divisor is restored as in
                Energon: each worker stream goes on with the samples it had not given, ``loader.rebatch``).
        """
        if state is None:
            return
        state = LoaderState.coerce(state)
        wc = self.dataset.worker_config
        if (state.world_size, state.num_workers) != (wc.world_size, self.dataset.num_workers):
            raise StateError(
                f"the state was saved with world_size={state.world_size}, num_workers={state.num_workers}; this loader "
                f"has world_size={wc.world_size}, num_workers={self.dataset.num_workers}. To continue on another world size or "
                "worker count, pass the states of all saved ranks to restore_state_global(states) (or use "
                "restore_loader_state(loader, folder) on a folder holding every rank's file)"
            )
        changes = batch_size_changes(state, self.dataset)
        if changes:  # a smaller batch size: each worker stream goes on with its own rest (loader.rebatch)
            self._start_restore(*rebatch(self.dataset, state, changes))
            return
        check_fits(state, self.dataset)
        adopt_val_packing(state, self.dataset)  # (first: it may replace the leaves the others set)
        adopt_layouts(state, self.dataset)
        adopt_pack_batching(state, self.dataset)
        redist = None
        if state.elastic is not None and state.pass_index == state.elastic["pass_index"]:
            redist = from_origin(self.dataset, state.elastic)
        self._start_restore(state, redist)

    def _start_restore(self, state: LoaderState, redist: Optional[Redistribution]) -> None:
        self.close()
        self._restores += 1
        self._passes = state.passes
        self._epoch_items = state.epoch_items
        self._restore = state
        self._redist = redist
        self._started = True
        if state.pass_index is not None:  # start Ray's work now, as for a new loader
            self._early = self._multi_feed(state.pass_index, state)
            self._early.start()

    def restore_sample(self, restore_key: Any) -> Any:
        """The batch whose ``__restore_key__`` this is (or the sample, without batching), made again:
        its samples re-read at their positions, encoded and batched with the same hook seeds.

        Raises:
            StateError: a key of another loader or version, of several datasets (but a train
                metadataset's sample blend or a validation metadataset's concatenation), or of items
                a wrapper made that it cannot make again (see ``can_restore_sample``).
        """
        return restore_sample(self.dataset, restore_key, self.ray_remote_args)

    def can_restore_sample(self) -> bool:
        """Whether ``restore_sample`` can rebuild this loader's batches: not through a wrapper it
        cannot apply again (``loader.remake``: a ``MapDataset`` without ``stateless_map_fn=True``, a
        ``MixBatchDataset``, ``GroupBatchDataset`` or ``IterMapDataset``)."""
        return blocker(self.dataset) is None

    def save_state_global(self, global_dst_rank: int) -> Optional[List[Optional[LoaderState]]]:
        """Every rank's state, gathered on ``global_dst_rank`` (``torch.distributed``; a list of one
        on a world size of 1 without it); ``None`` on the other ranks.

        Raises:
            StateError: a world size above 1 without a ``torch.distributed`` process group.
        """
        return gather_states(self.save_state_rank(), global_dst_rank, self.dataset.worker_config.world_size)

    def restore_state_global(self, state: Optional[List[Any]], src_rank: Optional[int] = None) -> None:
        """Restore from ``save_state_global``'s list (with ``src_rank``, only that rank passes it and it is
        broadcast). Each rank takes its own entry; states of another world size or worker count are
        shared out anew (``loader.elastic``: the rest of the epoch, nothing lost or repeated)."""
        state = broadcast_states(state, src_rank, self.dataset.worker_config.world_size)
        if state is None:
            raise StateError("restore_state_global needs the list of states (or src_rank to broadcast it from)")
        if not isinstance(state, (list, tuple)):
            raise StateError(
                f"restore_state_global wants one state per rank (a list, as save_state_global returns), got a "
                f"{type(state).__name__}; for one rank's state alone use restore_state_rank(state)"
            )
        states = [LoaderState.coerce(s) for s in state if s is not None]
        if not states:  # saved before any iteration
            return
        wc = self.dataset.worker_config
        if not needs_redistribution(states, wc, len(state)):
            mine = own_state(state, states, wc.rank)
            if mine is not None:
                self.restore_state_rank(mine)
            return
        mine, redist = redistribute(self.dataset, states)
        self._start_restore(mine, redist)

    def _state_at_failure(self) -> Optional[LoaderState]:
        """The state after the last item handed out, as an exception ends the pass, for the next
        ``iter()`` (a new epoch of an epochized loader, as after a ``break``); ``None``, logged, if it
        cannot be taken: the next ``iter()`` then starts the next pass."""
        try:
            return dataclasses.replace(self.save_state_rank(), epoch_items=0)
        except Exception:
            logger.warning("energon_ray: the interrupted pass cannot be continued; the next iter() starts a new one", exc_info=True)
            return None
