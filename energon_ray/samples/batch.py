"""``Batch``: base dataclass of batches, with Energon's meta fields as lists."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, TypeVar, Union

from energon_ray.samples.base import ExtendableDataclassMixin, PinMemoryMixin, SourceInfo, edataclass
from energon_ray.samples.display import to_html

T_batch = TypeVar("T_batch", bound="Batch")


@edataclass
class Batch(PinMemoryMixin, ExtendableDataclassMixin):
    """A batch of samples; subclass it and add your batched fields.

    Example:
        >>> import torch
        >>> @edataclass
        ... class MyBatch(Batch):
        ...     x: torch.Tensor
        >>> b = MyBatch(__key__=["a"], __restore_key__=(), x=torch.zeros(1, 2))
        >>> MyBatch.derive_from(b, x=torch.ones(1, 2)).__key__
        ['a']
    """

    __key__: List[str]
    __restore_key__: Tuple[Union[str, int, tuple], ...] = ()
    __subflavors__: Optional[List[Optional[Dict[str, Any]]]] = None
    __sources__: Optional[Tuple[SourceInfo, ...]] = None

    def _repr_html_(self) -> str:
        """Jupyter's rich display: a grid of the batch's images, texts, tensor shapes (``samples.display``)."""
        return to_html(self)

    @classmethod
    def derive_from(cls: Type[T_batch], base_batch: Any, **kwargs: Any) -> T_batch:
        """Copy the meta fields of ``base_batch`` and set the given fields."""
        meta = {
            f.name: getattr(base_batch, f.name)
            for f in dataclasses.fields(Batch)
            if hasattr(base_batch, f.name) and f.name not in kwargs
        }
        return cls(**meta, **kwargs)

    @classmethod
    def from_samples(cls: Type[T_batch], samples: Sequence[Any], **kwargs: Any) -> T_batch:
        """Batch dataclass samples: each field becomes the list of the samples' values.

        As Energon's, tensors are listed too, not stacked (its docstring says padded and stacked, its
        code lists them): a task encoder written for Energon gets the same types here. Stack a field
        yourself with a keyword, e.g. ``from_samples(samples, image=batch_pad_stack([...]))``.
        No samples give an empty batch, as Energon's: every field ``[]`` (``__restore_key__`` too),
        ``__sources__`` and ``__subflavors__`` ``None``.
        """
        for sample in samples:
            if not dataclasses.is_dataclass(sample):
                raise TypeError(f"{cls.__name__}.from_samples: {type(sample).__name__} is not a dataclass")
        values: Dict[str, Any] = {}
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            name = field.name
            if name in kwargs:
                values[name] = kwargs[name]
            elif name == "__sources__":
                if any(getattr(s, name, None) is not None for s in samples):  # all () gives (), as Energon's
                    values[name] = tuple(src for s in samples for src in (getattr(s, name, None) or ()))
            elif name == "__subflavors__":
                if any(getattr(s, name, None) is not None for s in samples):
                    values[name] = [getattr(s, name, None) for s in samples]
            elif all(hasattr(s, name) for s in samples):
                values[name] = [getattr(s, name) for s in samples]
        return cls(**values)
