"""Seam tasks: Ray tasks that batch pooled samples (a sample blend's groups, samples that straddle
segments) or pack a chunk of them (a packed blend), so the trainer never runs a task-encoder hook.
Ray's own calls are ``pipeline.build``'s (the Ray boundary).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import pyarrow as pa

from energon_ray.pipeline import build
from energon_ray.pipeline.local_start import give_back_memory, local_pack, local_seam, local_start_mode, make_here
from energon_ray.pipeline.shipped import ship

if TYPE_CHECKING:
    from energon_ray.pipeline.stages import StageConfig

logger = logging.getLogger("energon_ray")


class _Waiting:
    """A group task's result (its table; a packing task's packs): calling waits for it; ``ready()``:
    whether that would wait for nothing."""

    __slots__ = ("ref",)

    def __init__(self, ref: Any):
        self.ref = ref

    def __call__(self) -> Any:
        return build.values(self.ref)

    def ready(self) -> bool:
        return build.finished(self.ref)


class _Made:
    """A group task's result made in this process (``_Waiting``'s interface)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __call__(self) -> Any:
        return self.value

    def ready(self) -> bool:
        return True


class SeamTasks:
    """Starts Ray tasks that batch pooled leftover samples (one ``config`` upload per source).

    ``before_first``: as for ``TaskStream``, a group the pass's first batch waits for is batched, and
    a chunk it waits for packed (a packed blend), in this process while Ray's workers still import
    torch (``local_seam``, ``local_pack``: the same batches and packs)."""

    def __init__(self, config: "StageConfig", source: int, remote_args: Optional[Dict[str, Any]] = None,
                 before_first: Optional[Callable[[], bool]] = None):  # fmt: skip
        self._config = config
        self._before_first = before_first
        #: groups batched and chunks packed in this process
        self.local_groups = 0
        self._config_ref = None
        self.source = source
        self._seam_task, self._pack_task = build.group_tasks(remote_args)

    def submit(self, worker: int, seed: int, groups: List[Tuple[int, List[Tuple[int, int, Any]]]]) -> Callable[[], pa.Table]:
        """Start one task for ``(batch size, group)`` pairs; the returned callable waits for its rows
        (a zero-copy table), its ``ready()`` says whether that would wait."""
        if self._here():
            try:
                table = local_seam(ship(self._config), worker, seed, groups, self.source, build.values)
                give_back_memory()
            except Exception:
                logger.debug("energon_ray: a group could not be batched in the loader's process; a Ray task does it", exc_info=True)
            else:
                self.local_groups += 1
                return _Made(table)
        return _Waiting(self._seam_task.remote(self._config_ref_once(), worker, seed, groups, self.source))

    def _config_ref_once(self) -> Any:
        """The config, uploaded once for all of this source's tasks."""
        if self._config_ref is None:
            self._config_ref = build.put(ship(self._config))
        return self._config_ref

    def submit_pack(self, worker: int, seed: int, samples: List[Tuple[int, int, Any]], buffer_size: int,
                    offsets: Optional[List[int]] = None, counts: Any = None) -> Tuple[Any, Callable[[], Any]]:  # fmt: skip
        """Start packing a chunk of samples in a Ray task: the reference of its packs' table (for
        ``Located`` packs) and a callable waiting for ``(packs' (position, sub), report, the packing
        hooks' counts after it)``, whose ``ready()`` says whether that would wait. ``offsets``: per
        sample, added to its position in the packing hooks' indices; ``counts``: the hooks' counts
        before the chunk, or the waiting callable of the worker's previous chunk, which the task
        waits for (``seam_stages.seam_packs``; ``None``: positions)."""
        if self._here():
            from energon_ray.pipeline.rows import parts

            try:
                known = counts() if isinstance(counts, (_Made, _Waiting)) else counts  # (waits for the previous chunk)
                table, packs, report, after = local_pack(ship(self._config), worker, seed, samples, buffer_size, self.source, build.values,
                                                         offsets, known)  # fmt: skip
                table_ref = build.put(parts(table))  # the batching task reads the packs from the store
                del table
                give_back_memory()
            except Exception:
                logger.debug("energon_ray: a chunk could not be packed in the loader's process; a Ray task does it", exc_info=True)
            else:
                self.local_groups += 1
                return table_ref, _Made((packs, report, after))
        if isinstance(counts, (_Made, _Waiting)):  # Ray passes the task the previous chunk's result once made
            counts = counts.value if isinstance(counts, _Made) else counts.ref
        table_ref, meta_ref = self._pack_task.remote(self._config_ref_once(), worker, seed, samples, buffer_size, self.source, offsets, counts)
        return table_ref, _Waiting(meta_ref)

    def _here(self) -> bool:
        """Whether the group or chunk asked for now is made in this process (a cold start, see above)."""
        return self._before_first is not None and self._before_first() and make_here(local_start_mode(), lambda: False)
