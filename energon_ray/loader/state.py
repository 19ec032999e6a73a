"""The loader's saved state: positions, counters and flags, never sample data.

A state says, per logical worker stream, where consumption stood; restoring rebuilds the same
plan (it is a pure function of seeds and positions) and starts Ray's work right there. Every
piece is a small dataclass of ints, bools and lists; ``LoaderState.to_dict()`` is plain JSON and
``LoaderState.from_dict()`` checks the version. How states travel between ranks and into
checkpoint folders is ``loader.state_files``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Dict, List, Optional, Tuple

#: Bump when the meaning of a field changes; ``from_dict`` refuses other versions.
STATE_VERSION = 2  # 2: segment_lengths hold SegmentLayout lists (short first segments)

#: ``(leaf index, stream position, sub-index)`` of a pooled sample (or pack).
SampleRef = Tuple[int, int, int]


class StateError(ValueError):
    """A saved state that does not fit this loader (version, dataset, ranks, workers)."""


@dataclasses.dataclass
class QueueCheckpoint:
    """One worker stream's queue just before an event that queues items.

    ``event``: ``"feed"`` (segment ``segment`` is fed next), ``"carry"`` (the previous dataset's
    remainder ``carried`` arrives) or ``"close"`` (the stream ends: pools are flushed).
    ``pools``: bucket key, bucket batch size and the pooled samples of each bucket, in the buckets'
    order (empty buckets included: their order decides the order of the final short batches).
    """

    event: str
    segment: int
    pools: List[Tuple[Any, int, List[SampleRef]]]
    held: List[Tuple[Any, int, SampleRef]]
    waiting: bool
    done: bool
    carried: List[Tuple[Any, int, List[SampleRef]]] = dataclasses.field(default_factory=list)
    #: a chained stream (a generator ``encode_sample``): ``[segment, outputs before it, first position
    #: of the batch open at ``segment`` or None]``: where the carry into ``segment`` is rebuilt from
    #: (``WorkerQueues.chain_point``); ``None``: from the stream's start. Chained batches add the
    #: stream's ``outputs of batch, batches given`` before the segment the restore resumes at
    #: (``Carry.counts``; states saved before have three items: one each per whole batch of outputs)
    chain: Optional[List[Optional[int]]] = None
    #: grouped batching: the groups the worker's stream made before the event (the next group's
    #: batch index)
    groups_made: int = 0

    def refs(self) -> List[SampleRef]:
        """Every sample this checkpoint needs re-read."""
        out = [ref for _, _, refs in self.pools for ref in refs]
        out += [ref for _, _, ref in self.held]
        out += [ref for _, _, refs in self.carried for ref in refs]
        return out


@dataclasses.dataclass
class StreamState:
    """A leaf's worker stream: replay from ``checkpoint``, then drop the first ``consumed`` items.

    ``positions``: the stream positions of those consumed items' samples, as ``[start, stop)``
    ranges (what a restore with another world size needs to know was seen).
    """

    checkpoint: QueueCheckpoint
    consumed: int
    positions: List[List[int]] = dataclasses.field(default_factory=list)


def to_ranges(positions: List[int]) -> List[List[int]]:
    """Sorted ``[start, stop)`` runs of a list of positions.

    Example:
        >>> to_ranges([5, 1, 2, 3, 7, 6])
        [[1, 4], [5, 8]]
    """
    out: List[List[int]] = []
    for p in sorted(set(int(p) for p in positions)):
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return out


def expand_ranges(ranges: List[List[int]]) -> List[int]:
    """The positions of ``to_ranges``' runs."""
    return [p for start, stop in ranges for p in range(start, stop)]


@dataclasses.dataclass
class RoundRobinState:
    """Which worker gives the next item, items per worker so far, and which workers are still active."""

    next_worker: int
    emitted: List[int]
    active: List[bool]


@dataclasses.dataclass
class LoaderState:
    """What ``save_state_rank`` returns.

    ``passes``: passes started so far; ``pass_index``: the pass in progress (``None`` between
    passes); ``epoch_items``: items of the current ``iter()`` of an epochized loader; ``nodes``: per
    composition node (blend, concatenation, map), per worker; ``streams``: per leaf, per worker.
    """

    version: int
    rank: int
    world_size: int
    num_workers: int
    fingerprint: str
    passes: int
    pass_index: Optional[int] = None
    epoch_items: int = 0
    round_robin: Optional[RoundRobinState] = None
    nodes: List[List[Any]] = dataclasses.field(default_factory=list)
    streams: List[List[StreamState]] = dataclasses.field(default_factory=list)
    #: each leaf's ``SegmentLayout.to_list()`` (a restore with another world size maps segments to positions)
    segment_lengths: List[List[int]] = dataclasses.field(default_factory=list)
    #: digest of what decides the sample order, batch sizes and worker counts left out
    order_fingerprint: str = ""
    #: the pass ``pass_index`` runs on streams redistributed from ``states`` (another world size's
    #: states, as dicts): ``{"pass_index": int, "states": [...]}``; see ``loader.elastic``
    elastic: Optional[Dict[str, Any]] = None
    #: each leaf's task encoder class (a restore under other ones is allowed, and logged)
    task_encoders: List[str] = dataclasses.field(default_factory=list)
    #: ``config_summary.summarize`` of what ``fingerprint`` digests: names what differs when a
    #: restore is refused (empty in states saved before it was recorded)
    config_summary: Dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``WorkerConfig.seed_offset`` (it decides the sample order; ``None`` in states saved before it
    #: was recorded, which are not checked)
    seed_offset: Optional[int] = None
    #: packed datasets' batches are made from the trainer's pool of each worker stream's packs
    #: (``StageConfig.pool_packs``); ``False`` in states saved before, whose segments batched their
    #: own packs (``savable.adopt_pack_batching`` restores them so)
    packs_pooled: bool = False
    #: packing buffers run across each worker stream's segments (``chained.chains_outputs``);
    #: ``False`` in states saved before, whose segments packed their own samples (restored so)
    packs_chained: bool = False
    #: batched streams' batches run across their segments (``chained.chains_outputs``'s
    #: ``chain_batches``); ``False`` in states saved before, or by a loader whose segments batched
    #: their own samples (restored so)
    batches_chained: bool = False
    #: a validation metadataset's batches, made from the trainer's pool across its datasets, count
    #: their batch index (``current_batch_index``) as batches made, as Energon's; ``False`` in states
    #: saved before, which counted it from the first sample's position (restored so)
    pool_batches_counted: bool = False
    #: a chained packed stream's packing hooks read Energon's indices (``packing.Packer.counts``),
    #: carried across its segments and recorded in ``QueueCheckpoint.chain``; ``False`` in states
    #: saved before, whose packing hooks read their first sample's position (restored so)
    pack_hooks_counted: bool = False
    #: an unbatched generator ``encode_sample``'s worker streams are chained, their hooks reading
    #: Energon's outputs given (``chained.chains_outputs``); ``False`` in states saved before, whose
    #: segments encoded on their own, the hooks reading positions (restored so)
    unbatched_chained: bool = False
    #: a stream whose sample hooks read indices that skipped samples shift is chained
    #: (``chained.reads_shifted_indices``); ``False`` in states saved before, whose segments encoded
    #: side by side, the hooks reading positions (restored so)
    sample_hooks_counted: bool = False

    # -- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON types only (bucket keys must be str, int, float, bool, None or tuples of them)."""
        return _jsonable(dataclasses.asdict(self), "state")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "LoaderState":
        """Rebuild a state from ``to_dict()``'s output.

        Raises:
            StateError: not a loader state, or saved by another state version.
        """
        if isinstance(data, (list, tuple)):
            raise StateError(
                f"not one rank's loader state: a {type(data).__name__} of {len(data)} (save_state_global's states?); "
                "pass such a list to restore_state_global(states)"
            )
        if not isinstance(data, dict) or "version" not in data:
            raise StateError(f"not an energon_ray loader state: {type(data).__name__} without a 'version'")
        if data["version"] != STATE_VERSION:
            raise StateError(
                f"loader state version {data['version']!r} is not supported (this energon_ray reads version "
                f"{STATE_VERSION}); save the state again with the energon_ray version that restores it"
            )
        _check_fields(data)
        data = _unjson(data)
        rr = data["round_robin"]
        return cls(
            version=data["version"],
            rank=data["rank"],
            world_size=data["world_size"],
            num_workers=data["num_workers"],
            fingerprint=data["fingerprint"],
            passes=data["passes"],
            pass_index=data["pass_index"],
            epoch_items=data["epoch_items"],
            round_robin=None if rr is None else _part("round_robin", lambda: RoundRobinState(**rr)),
            nodes=data["nodes"],
            streams=_part("streams", lambda: [
                [StreamState(QueueCheckpoint(**s["checkpoint"]), s["consumed"], s.get("positions", [])) for s in workers]
                for workers in data["streams"]
            ]),
            segment_lengths=list(data.get("segment_lengths", [])),
            order_fingerprint=data.get("order_fingerprint", ""),
            elastic=data.get("elastic"),
            task_encoders=list(data.get("task_encoders", [])),
            config_summary=dict(data.get("config_summary", {})),
            seed_offset=data.get("seed_offset"),
            packs_pooled=bool(data.get("packs_pooled", False)),
            packs_chained=bool(data.get("packs_chained", False)),
            batches_chained=bool(data.get("batches_chained", False)),
            pool_batches_counted=bool(data.get("pool_batches_counted", False)),
            pack_hooks_counted=bool(data.get("pack_hooks_counted", False)),
            unbatched_chained=bool(data.get("unbatched_chained", False)),
            sample_hooks_counted=bool(data.get("sample_hooks_counted", False)),
        )

    @classmethod
    def coerce(cls, state: Any) -> "LoaderState":
        """A ``LoaderState``, its ``to_dict()`` or its ``to_json()``."""
        if isinstance(state, cls):
            if state.version != STATE_VERSION:
                raise StateError(f"loader state version {state.version!r} is not supported (expected {STATE_VERSION})")
            return state
        if isinstance(state, (str, bytes)):
            try:
                state = json.loads(state)
            except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
                text = state[:60]
                raise StateError(f"not a loader state: the text is not JSON ({exc}): {text!r}…") from None
        return cls.from_dict(state)


#: Fields every version-2 state has (``to_dict`` writes them all): without one, a restore would start
#: elsewhere than the save (no ``streams``: at the start of the pass). Later fields have defaults.
_REQUIRED = {
    "rank": (int,), "world_size": (int,), "num_workers": (int,), "fingerprint": (str,), "passes": (int,),
    "pass_index": (int, type(None)), "epoch_items": (int,), "round_robin": (dict, type(None)), "nodes": (list,),
    "streams": (list,),
}  # fmt: skip


def _check_fields(data: Dict[str, Any]) -> None:
    """Raises ``StateError`` naming a field a cut-off or edited state lacks, or holds a wrong type in."""
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise StateError(f"not a complete loader state: it has no {missing} (a cut-off or edited state?)")
    for name, types in _REQUIRED.items():
        value = data[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            wanted = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            raise StateError(f"loader state field {name!r} must be {wanted}, got {value!r}"[:300])


def _part(name: str, build: Any) -> Any:
    """``build()``, a malformed nested field raising ``StateError`` naming it."""
    try:
        return build()
    except (TypeError, KeyError, AttributeError) as exc:
        raise StateError(f"loader state field {name!r} is malformed ({type(exc).__name__}: {exc})") from None


def fingerprint(description: Any) -> str:
    """A short digest of what decides the batches (datasets, options, weights)."""
    text = json.dumps(description, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


_TUPLE = "__tuple__"


def _jsonable(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {_TUPLE: [_jsonable(v, where) for v in value]}
    if isinstance(value, list):
        return [_jsonable(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, where) for k, v in value.items()}
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item(), where)
    raise StateError(
        f"{where}: a {type(value).__name__} ({value!r}) is not JSON-serializable; bucket keys of "
        "batch_group_criterion must be str, int, float, bool, None or tuples of them for to_dict() "
        "(the state object itself still pickles)"
    )


def _unjson(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_TUPLE}:
            return tuple(_unjson(v) for v in value[_TUPLE])
        return {k: _unjson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unjson(v) for v in value]
    return value
