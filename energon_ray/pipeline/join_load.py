"""Raw joined row → one sample: each dataset's sample is built by its own loader (its dataset.yaml's
sample type and field_map, its subflavors), then the joiner merges them.

A joiner is a sample type (its ``from_joined`` is called) or a function; a list join passes the
samples positionally, a mapping join by name. Samples of ``nonmatch: none`` datasets may be ``None``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Dict, List, Optional, Sequence

from energon_ray.errors import DatasetConfigError, SampleException, untrusted
from energon_ray.format.dataset_code import resolve_class
from energon_ray.pipeline.load import SampleLoader
from energon_ray.samples import Sample
from energon_ray.source.joined_reader import JOINED

_OURS = ("energon_ray", "megatron.energon")


def resolve_joiner(value: Any, file: str, trusted: bool) -> Callable[..., Any]:
    """The joiner of a ``join:`` node: a sample type (→ its ``from_joined``) or a function.

    ``value`` is a ``{__module__, __class__}`` or ``{__module__, __function__}`` mapping, a sample type
    name, a class or a callable. A class or function of a module other than energon_ray /
    megatron.energon is user code: it is imported only when ``trusted`` (``trust_dataset_code=True``).

    Raises:
        UntrustedCodeError: user code without the opt-in.
        DatasetConfigError: not importable, or neither a sample type nor callable.
    """
    if isinstance(value, dict) and ("__class__" in value or "__function__" in value):
        module = str(value.get("__module__", "energon_ray"))
        name = str(value["__class__"] if "__class__" in value else value["__function__"])
        ours = any(module == package or module.startswith(package + ".") for package in _OURS)
        if ours and "__class__" in value:
            value = resolve_class(value, file, "joiner", trusted)
        else:
            if not ours and not trusted:
                raise untrusted(f"joiner {module}.{name} would import module {module!r}", file)
            try:
                value = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError) as exc:
                raise DatasetConfigError(f"{file}: cannot import joiner {module}.{name}: {exc}") from None
    elif isinstance(value, str):
        value = resolve_class(value, file, "joiner", trusted)
    if isinstance(value, type) and issubclass(value, Sample):
        return value.from_joined
    if callable(value):
        return value
    raise DatasetConfigError(f"{file}: joiner must be a sample type or a function, got {value!r}")


class JoinedSampleLoader:
    """Builds the joined sample of a raw joined row (see :mod:`energon_ray.source.joined_reader`).

    Args:
        loaders: one :class:`SampleLoader` per joined dataset (primary first).
        joiner: the function that merges the samples (``Sample.from_joined`` for a sample type).
        names: the mapping join's names (``None``: the samples are passed positionally).
    """

    def __init__(self, loaders: Sequence[SampleLoader], joiner: Callable[..., Any], names: Optional[List[str]] = None):
        self.loaders = list(loaders)
        self.joiner = joiner
        self.names = names
        #: the primary's spec (what a stage reports for this source)
        self.spec = self.loaders[0].spec

    def __call__(self, raw: Dict[str, Any]) -> Any:
        samples = [None if part is None else loader(part) for loader, part in zip(self.loaders, raw[JOINED])]
        try:
            if self.names is None:
                joined = self.joiner(*samples)
            else:
                joined = self.joiner(**dict(zip(self.names, samples)))
        except SampleException:
            raise
        except Exception as exc:
            raise SampleException(
                f"{raw['__shard__']}: sample {raw['__key__']!r}: joiner {getattr(self.joiner, '__qualname__', self.joiner)} "
                f"failed: {type(exc).__name__}: {exc}"
            ) from exc
        return _with_restore_key(joined, raw["__restore_key__"])


def _with_restore_key(sample: Any, restore_key: Any) -> Any:
    """The joined sample with the row's restore key (as Energon sets it on a joined sample)."""
    if isinstance(sample, dict):
        sample["__restore_key__"] = restore_key
    elif dataclasses.is_dataclass(sample) and hasattr(sample, "__restore_key__"):
        try:
            sample.__restore_key__ = restore_key
        except dataclasses.FrozenInstanceError:
            sample = dataclasses.replace(sample, __restore_key__=restore_key)
    return sample
