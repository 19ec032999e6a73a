"""What the trainer receives: each item as a torch ``DataLoader`` hands it out.

Energon's loaders are torch ``DataLoader``s with ``batch_size=None``, so every item they give passes
through torch's ``default_convert``: numpy arrays and numpy scalars (not those of strings or objects)
become tensors and tuples become lists, inside dicts, lists, tuples and NamedTuples (a dataclass
batch is left as it is). The loader hands its items out the same way, so a batch that holds numpy
arrays reaches the trainer as tensors, as with Energon. ``restore_sample`` gives the item as the
hooks made it, as Energon's does.
"""

from __future__ import annotations

import collections.abc
from typing import Any

from torch.utils.data import default_convert

from energon_ray.pipeline.serde import without_read_only_warning
from energon_ray.samples.base import pin_batch


def handed_out(item: Any, pin: bool) -> Any:
    """``item`` as torch's ``DataLoader`` gives it (``default_convert``); with ``pin``, the tensors it
    made of numpy arrays are pinned too (the pin thread copied the item before they existed).

    Example:
        >>> import numpy as np
        >>> handed_out({"x": np.arange(2), "k": ("a", "b")}, pin=False)
        {'x': tensor([0, 1]), 'k': ['a', 'b']}
    """
    if not _holds_numpy(item):
        return default_convert(item)
    out = without_read_only_warning(lambda: default_convert(item))  # arrays mapped from Ray's store
    return pin_batch(out) if pin else out


def _holds_numpy(value: Any) -> bool:
    if type(value).__module__ == "numpy":
        return True
    if isinstance(value, collections.abc.Mapping):
        return any(_holds_numpy(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_numpy(v) for v in value)
    return False
