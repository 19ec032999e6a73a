"""How a loader's ``iter()`` runs its passes, decided from the composition, without Ray.

A training dataset that repeats without end is one endless pass; a ``blend_epochized`` training
blend whose sources repeat a set number of times ends its pass, and the loader goes on with the
next one in the same ``iter()`` (``repeats_passes``), as Energon repeats the whole blend; a rank
that holds nothing to repeat is refused (``check_something_to_repeat``).
"""

from __future__ import annotations

from energon_ray.blend.base import Composition
from energon_ray.blend.wrappers import LimitDataset
from energon_ray.errors import DatasetConfigError
from energon_ray.loader.remake import walk


def repeats_passes(dataset: Composition) -> bool:
    """Whether a ``repeat=True`` training loader's pass ends because its sources repeat a set number
    of times (``blend_epochized`` repetitions), so its ``iter()`` goes on with the next pass; not
    under a ``LimitDataset``, which ends the loader's ``iter()`` after its items, as Energon's does."""
    if not _repeats_set_times(dataset.leaves()):
        return False
    return not any(isinstance(node, LimitDataset) for node in walk(dataset))


def _repeats_set_times(leaves: list) -> bool:
    """Training sources that repeat (``repeat=True``), some a set number of times (``blend_epochized``
    repetitions): the loader repeats their passes without end."""
    repeating = all(leaf.options.training and leaf.options.repeat for leaf in leaves)
    return repeating and any(leaf.options.repetitions is not None for leaf in leaves)


def _drawn(dataset: Composition, leaves: list) -> list:
    """The leaves a pass can take items from: those with a share above 0 (a blend weight of 0 gives
    its sources none)."""
    shares = dataset.leaf_shares()
    return [leaf for leaf in leaves if shares.get(id(leaf), (1.0, 0.0))[0] > 0]


def check_something_to_repeat(dataset: Composition) -> None:
    """Refuse training sources that repeat without end but hold no sample on this rank (more ranks
    than samples or shards): the pass would give no batch, the loop end at once and this rank leave
    training while the others go on. Energon refuses to repeat such an empty dataset; so do we,
    naming the rank and the sources. The same holds where this rank's only samples are of sources a
    blend gives weight 0 (Energon refuses any weight 0), and for a repeating ``blend_epochized``
    (its passes, each of no batch, ended the loop; Energon refuses it too). (A rank that some sources give samples
    repeats those. A restore on another world size is no exception: such a rank would give its share
    of the unfinished epoch, if any, and then end while the others go on.)

    Raises:
        DatasetConfigError: naming the rank, the world size and the sources.
    """
    leaves = dataset.leaves()
    if not (all(leaf.repeats_forever() for leaf in leaves) or _repeats_set_times(leaves)):
        return
    drawn = _drawn(dataset, leaves)
    if any(leaf.has_rank_samples() for leaf in drawn):
        return
    wc = leaves[0].worker_config
    rank = f"rank {wc.rank} of world size {wc.world_size} ({wc.num_workers} workers)"
    drawn_ids = {id(leaf) for leaf in drawn}
    idle = [leaf for leaf in leaves if id(leaf) not in drawn_ids and leaf.has_rank_samples()]
    if idle:
        raise DatasetConfigError(
            f"{rank} holds samples only of sources with weight 0 ({', '.join(repr(leaf) for leaf in idle)}), none of "
            f"{', '.join(repr(leaf) for leaf in drawn)}: a training blend that repeats (repeat=True) has nothing to "
            "draw on this rank; give those sources a weight above 0, or use fewer ranks than the weighted sources have samples"
        )
    raise DatasetConfigError(
        f"{rank} holds no sample of "
        f"{', '.join(repr(leaf) for leaf in leaves)}: a training dataset that repeats (repeat=True) has "
        "nothing to repeat on this rank; use fewer ranks than the dataset has samples, or repeat=False"
    )
