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
    leaves = dataset.leaves()
    repeating = all(leaf.options.training and leaf.options.repeat for leaf in leaves)
    if not repeating or not any(leaf.options.repetitions is not None for leaf in leaves):
        return False
    return not any(isinstance(node, LimitDataset) for node in walk(dataset))


def check_something_to_repeat(dataset: Composition) -> None:
    """Refuse training sources that repeat without end but hold no sample on this rank (more ranks
    than samples or shards): the pass would give no batch, the loop end at once and this rank leave
    training while the others go on. Energon refuses to repeat such an empty dataset; so do we,
    naming the rank and the sources. (A rank that some sources give samples repeats those. A restore
    on another world size is no exception: such a rank would give its share of the unfinished
    epoch, if any, and then end while the others go on.)

    Raises:
        DatasetConfigError: naming the rank, the world size and the sources.
    """
    leaves = dataset.leaves()
    if not all(leaf.repeats_forever() for leaf in leaves):
        return
    if any(leaf.has_rank_samples() for leaf in leaves):
        return
    wc = leaves[0].worker_config
    raise DatasetConfigError(
        f"rank {wc.rank} of world size {wc.world_size} ({wc.num_workers} workers) holds no sample of "
        f"{', '.join(repr(leaf) for leaf in leaves)}: a training dataset that repeats (repeat=True) has "
        "nothing to repeat on this rank; use fewer ranks than the dataset has samples, or repeat=False"
    )
