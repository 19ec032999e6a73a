"""The values a metadataset's nodes hold, checked: numbers (weights, repetitions), subset ranges
(``N%``, sample indices, ``end``) and how ratio subsets compose, and ``shuffle_over_epochs_multiplier``
and how nested ones combine (Energon's rules; ``blend.metadataset`` parses the tree).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

from energon_ray.errors import DatasetConfigError


def node_error(file: str, where: str, message: str) -> DatasetConfigError:
    """An error in ``file`` at ``where`` (a node's path in the YAML)."""
    return DatasetConfigError(f"{file}: {where}: {message}")


def config_number(value: Any, file: str, where: str, name: str, allow_zero: bool = True) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise node_error(file, where, f"{name} must be a number, got {value!r}") from None
    if math.isnan(number) or math.isinf(number) or number < 0 or (number == 0 and not allow_zero):
        raise node_error(file, where, f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return number


def parse_bound(value: Any, file: str, where: str) -> Tuple[str, float]:
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return "ratio", float(value.strip()[:-1]) / 100
        except ValueError:  # 'a%': not a percentage (the error below)
            pass
    if isinstance(value, str) and value.strip() == "end":
        return "end", math.nan
    if isinstance(value, int) and not isinstance(value, bool):
        return "abs", value
    raise node_error(file, where, f"subset bounds are 'N%', sample indices or 'end', got {value!r}")


def parse_subset(node: dict, file: str, where: str) -> Tuple[Optional[Tuple[float, float]], Optional[Tuple[int, Optional[int]]]]:
    """``(ratio, absolute)`` of a node's ``subset: {range: [start, end]}`` (each ``None`` when absent)."""
    sub = node.get("subset")
    if sub is None:
        return None, None
    rng = sub.get("range") if isinstance(sub, dict) else None
    if not (isinstance(rng, (list, tuple)) and len(rng) == 2):
        raise node_error(file, where, f"subset must look like {{range: [start, end]}}, got {sub!r}")
    (k0, v0), (k1, v1) = parse_bound(rng[0], file, where), parse_bound(rng[1], file, where)
    if k0 == "ratio" and k1 == "ratio":
        if not 0 <= v0 <= v1 <= 1:
            raise node_error(file, where, f"subset range {rng} must satisfy 0% <= start <= end <= 100%")
        return (v0, v1), None
    if k0 == "abs" and k1 in ("abs", "end"):
        end = None if k1 == "end" else int(v1)
        if v0 < 0 or (end is not None and end < v0):
            raise node_error(file, where, f"subset range {rng} must satisfy 0 <= start <= end")
        return None, (int(v0), end)
    raise node_error(file, where, f"subset range {rng} mixes percentages and sample indices")


def absolute_subset_error(file: str, where: str, absolute: Tuple[int, Optional[int]]) -> DatasetConfigError:
    """An absolute subset range above a leaf; the sentence after ``file: where:`` is Energon's."""
    return node_error(file, where, f"Can only use absolute subset ranges for a leaf dataset (Range parent_subset.absolute_range={absolute})")


def compose_ratio(inner: Optional[Tuple[float, float]], outer: Optional[Tuple[float, float]]):
    if outer is None:
        return inner
    if inner is None:
        return outer
    span = inner[1] - inner[0]
    return (inner[0] + outer[0] * span, inner[0] + outer[1] * span)


#: What ``shuffle_over_epochs_multiplier`` may be, in a YAML node or as ``get_train_dataset``'s argument.
MULTIPLIER_VALUES = "a positive int, -1 (slices drawn with replacement) or None (no shuffling)"


def is_multiplier(value: Any) -> bool:
    """Whether ``value`` is a ``shuffle_over_epochs_multiplier`` (see ``MULTIPLIER_VALUES``)."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and (value >= 1 or value == -1))


def combine_multipliers(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None or b is None:
        return None
    if a == -1 or b == -1:
        return -1
    return int(a) * int(b)
