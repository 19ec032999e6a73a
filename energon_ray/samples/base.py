"""``Sample``: the typed record every dataset yields, with Energon's four meta fields."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple, Type, TypeVar, Union

import torch

from energon_ray.samples.display import to_html

T = TypeVar("T")


def edataclass(cls: Optional[type] = None, **kwargs: Any):
    """``dataclass(kw_only=True, slots=True)``, the decorator Energon's sample types use.

    Instances pickle as ``{field: value}``, whatever the class's layout on the other side: a class
    declared in ``__main__`` or a notebook travels to Ray workers by value (cloudpickle rebuilds it
    there, with a ``__dict__``), and its instances come back to the original slotted class.
    """
    opts = {"kw_only": True, "slots": True, **kwargs}
    if cls is None:
        return lambda c: _edataclass(c, opts)
    return _edataclass(cls, opts)


def _edataclass(cls: type, opts: Dict[str, Any]) -> type:
    own = set(vars(cls))
    out = dataclasses.dataclass(cls, **opts)
    if "__getstate__" not in own and "__setstate__" not in own:
        out.__getstate__ = _fields_state
        out.__setstate__ = _set_fields_state
    return out


_FIELD_NAMES: Dict[type, Tuple[str, ...]] = {}


def _fields_state(self: Any) -> Dict[str, Any]:
    names = _FIELD_NAMES.get(type(self))
    if names is None:  # a dataclass's fields are fixed once it is made
        names = _FIELD_NAMES[type(self)] = tuple(f.name for f in dataclasses.fields(self))
    return {name: getattr(self, name) for name in names if hasattr(self, name)}


def _set_fields_state(self: Any, state: Any) -> None:
    if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state) of a default reduce
        state = {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, dict):
        items = state.items()
    else:  # the value list of dataclasses' own frozen-slots state
        items = zip((f.name for f in dataclasses.fields(self)), state)
    for name, value in items:
        object.__setattr__(self, name, value)


@dataclasses.dataclass(frozen=True, slots=True)
class SourceInfo:
    """Where a sample came from: dataset folder, global index, shard and the tar members read."""

    dataset_path: str
    index: Union[int, str]
    shard_name: str
    file_names: Tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.dataset_path}/{self.shard_name}[{self.index}] {list(self.file_names)}"

    def to(self, *args: Any, **kwargs: Any) -> "SourceInfo":
        """Itself: it holds no tensors. Lightning (and other code that moves a batch by calling
        ``.to(device)`` on what has it) thus moves batches that hold sources; without it, Lightning
        rebuilds dataclasses field by field and refuses frozen ones."""
        return self


def _pin(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, PinMemoryMixin):
        return value.pin_memory()
    if isinstance(value, list):
        return [_pin(v) for v in value]
    if isinstance(value, tuple):
        pinned = [_pin(v) for v in value]
        return type(value)(*pinned) if hasattr(value, "_fields") else tuple(pinned)
    if isinstance(value, dict):
        return {k: _pin(v) for k, v in value.items()}
    return value


def pin_batch(value: Any) -> Any:
    """Pin every tensor inside a batch: ``Batch`` dataclasses, other dataclasses, dicts, lists."""
    if hasattr(value, "pin_memory") and not isinstance(value, torch.Tensor):
        return value.pin_memory()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            setattr(value, field.name, _pin(getattr(value, field.name)))
        return value
    return _pin(value)


class PinMemoryMixin:
    """``pin_memory()`` for dataclasses: pins every tensor field, recursing into containers."""

    __slots__ = ()

    def pin_memory(self: T) -> T:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            setattr(self, field.name, _pin(getattr(self, field.name)))
        return self


class ExtendableDataclassMixin:
    """``extend`` and ``derive_from`` for building one dataclass from another."""

    __slots__ = ()

    @classmethod
    def extend(cls: Type[T], src: Any, **kwargs: Any) -> T:
        """Create ``cls`` from the fields of ``src`` plus ``kwargs`` (a subclass adds fields); fields
        declared ``init=False`` are not passed (``cls`` sets them itself), as in Energon."""
        values = {f.name: getattr(src, f.name) for f in dataclasses.fields(src) if f.init}
        values.update(kwargs)
        return cls(**values)


_META_FIELDS = ("__key__", "__restore_key__", "__subflavors__", "__sources__")


@edataclass
class Sample(PinMemoryMixin, ExtendableDataclassMixin):
    """Base of all sample types.

    Example:
        >>> s = Sample(__key__="a", __restore_key__=("Webdataset", 0))
        >>> s.__key__
        'a'
    """

    #: Unique key of the sample in its dataset (the tar member name before the first dot).
    __key__: str
    #: Tuple of strings and ints that locates the sample again (``("Webdataset", global_index)``).
    __restore_key__: Tuple[Union[str, int, tuple], ...] = ()
    #: Free-form flavour tags of the dataset the sample came from.
    __subflavors__: Optional[Dict[str, Any]] = None
    #: Where the sample came from.
    __sources__: Optional[Tuple[SourceInfo, ...]] = None

    def _repr_html_(self) -> str:
        """Jupyter's rich display: images as PNG thumbnails, texts, tensor shapes (``samples.display``)."""
        return to_html(self)

    @classmethod
    def derive_from(cls: Type[T], base_sample: Any, **kwargs: Any) -> T:
        """Create ``cls`` with the meta fields of ``base_sample`` and the given fields."""
        meta = {
            name: getattr(base_sample, name)
            for name in _META_FIELDS
            if hasattr(base_sample, name) and name not in kwargs
        }
        return cls(**meta, **kwargs)

    @classmethod
    def from_joined(cls: Type[T], *args: Any, **kwargs: Any) -> T:
        """Join samples: the first (primary) gives the meta fields; later ones override the others."""
        samples = [s for s in list(args) + list(kwargs.values()) if s is not None]
        if not samples:
            raise ValueError("from_joined needs at least one sample")
        primary = samples[0]
        values: Dict[str, Any] = {}
        sources: list = []
        for sample in samples:
            for field in dataclasses.fields(sample):
                if field.name in _META_FIELDS:
                    continue
                values[field.name] = getattr(sample, field.name)
            sources.extend(getattr(sample, "__sources__", None) or ())
        own = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values = {k: v for k, v in values.items() if k in own}
        return cls(
            __key__=primary.__key__,
            __restore_key__=primary.__restore_key__,
            __subflavors__=primary.__subflavors__,
            __sources__=tuple(sources) or None,
            **values,
        )
