"""What the loader's own wrappers do to an item that ``restore_sample`` made again.

``restore_sample`` rebuilds a batch (or sample) from its dataset's Ray stream; the wrappers the user
put around that dataset in the loader process still have to be applied. As in Energon, only a
``MapDataset`` whose ``map_fn`` is declared stateless (``stateless_map_fn=True``) can be applied
again; a wrapper that makes one item of several (``MixBatchDataset``, ``GroupBatchDataset``,
``IterMapDataset``) cannot, so neither can a map that is not declared stateless: the loader's
``can_restore_sample`` is then ``False`` and ``restore_sample`` names the wrapper.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator, List, Optional

from energon_ray.blend.base import Composition
from energon_ray.loader.state import StateError

#: wrappers that make one item of several in the loader process (their items are not remade)
_MERGING = {
    "MixBatchDataset": "its batches are mixed by batch_mix_fn in the loader process from items of several streams",
    "GroupBatchDataset": "its batches are grouped by batcher in the loader process from items of several batches",
    "IterMapDataset": "its items are made by iter_map_fn in the loader process from a worker stream's items",
}


def _children(node: Composition) -> List[Composition]:
    kids = list(getattr(node, "datasets", None) or ())
    for name in ("dataset", "blend"):
        kid = getattr(node, name, None)
        if kid is not None:
            kids.append(kid)
    return [kid for kid in kids if isinstance(kid, Composition)]


def walk(node: Composition) -> Iterator[Composition]:
    """``node`` and the compositions inside it, down to its leaves."""
    yield node
    if not any(node is leaf for leaf in node.leaves()):
        for kid in _children(node):
            yield from walk(kid)


def _path(node: Composition, leaf: Any) -> Optional[List[Composition]]:
    """The compositions from ``node`` down to ``leaf`` (outermost first, the leaf excluded)."""
    if node is leaf:
        return []
    for kid in _children(node):
        below = _path(kid, leaf)
        if below is not None:
            return [node, *below]
    return None


def _reason(node: Composition) -> Optional[str]:
    """Why ``restore_sample`` cannot apply ``node`` again (``None``: it can, or the node keeps items as they are)."""
    kind = type(node).__name__
    if kind in _MERGING:
        return f"{kind}: {_MERGING[kind]}, so restore_sample cannot make them again"
    if kind == "MapDataset":
        name = getattr(node.map_fn, "__name__", repr(node.map_fn))
        if not getattr(node, "stateless_map_fn", False):
            return (
                f"MapDataset: map_fn {name!r} is not declared stateless (MapDataset(..., stateless_map_fn=True)), "
                "so restore_sample cannot apply it again (as in Energon)"
            )
        if inspect.isgeneratorfunction(node.map_fn):
            return f"MapDataset: map_fn {name!r} is a generator; a restore key does not say which of its outputs it was"
    return None


def blocker(dataset: Composition) -> Optional[str]:
    """The first wrapper of the loader's tree that ``restore_sample`` cannot apply again, as a reason."""
    for node in walk(dataset):
        reason = _reason(node)
        if reason is not None:
            return reason
    return None


def remakers(dataset: Composition, leaf: Any) -> List[Callable[[Any], Any]]:
    """The functions that turn an item made again from ``leaf``'s stream into the loader's item:
    the ``map_fn``s above ``leaf``, innermost first (checked before anything is made again).

    Raises:
        StateError: a wrapper on the way cannot be applied again (see ``blocker``).
    """
    path = _path(dataset, leaf) or []
    for node in path:
        reason = _reason(node)
        if reason is not None:
            raise StateError(reason)
    return [node.map_fn for node in reversed(path) if type(node).__name__ == "MapDataset"]


def remade(fns: List[Callable[[Any], Any]], item: Any) -> Any:
    """``item`` after ``fns`` (``remakers``)."""
    for fn in fns:
        item = fn(item)
    return item
