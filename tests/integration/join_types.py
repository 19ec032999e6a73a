"""A user joiner for tests/integration/test_join.py (a module outside energon_ray: user code)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from megatron.energon import Sample as EnergonSample

from energon_ray import Sample


@dataclass
class PairSample(Sample):
    """The primary's and the secondary's text of one key."""

    first: str
    second: Optional[str]


def join_pair(primary, secondary):
    """Builds a :class:`PairSample` from two text samples (``secondary`` may be ``None``)."""
    return PairSample(
        __key__=primary.__key__, __restore_key__=primary.__restore_key__, __subflavors__=primary.__subflavors__,
        __sources__=None, first=primary.text, second=None if secondary is None else secondary.text,
    )


@dataclass
class EnergonPairSample(EnergonSample):
    """The same on Energon's side (its joiner must build an Energon sample)."""

    first: str
    second: Optional[str]


def energon_join_pair(primary, secondary):
    return EnergonPairSample(
        __key__=primary.__key__, __restore_key__=primary.__restore_key__, __subflavors__=primary.__subflavors__,
        first=primary.text, second=None if secondary is None else secondary.text,
    )
