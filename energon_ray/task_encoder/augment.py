"""``AugmentTaskEncoder``: a task encoder that forwards every hook to another one.

Subclass it and override the hooks you want to change, calling ``super()`` for the wrapped
encoder's result. Hooks it does not override count as the wrapped encoder's own (``is_overridden``
looks through), so a wrapped encoder without packing or grouping hooks still neither packs nor groups.
"""

from __future__ import annotations

from typing import Any, Sequence

from energon_ray.task_encoder.base import TaskEncoder


def _delegate(name: str):
    def hook(self: "AugmentTaskEncoder", *args: Any, **kwargs: Any) -> Any:
        return getattr(self._task_encoder, name)(*args, **kwargs)

    hook.__name__ = hook.__qualname__ = name
    hook.__doc__ = f"The wrapped task encoder's ``{name}``."
    hook.__augment_delegate__ = True  # type: ignore[attr-defined]
    return hook


class AugmentTaskEncoder(TaskEncoder):
    """Wraps ``task_encoder``; every hook and ``decoder``/``cookers`` come from it unless overridden.

    Example:
        >>> from energon_ray import DefaultTaskEncoder
        >>> class Tagged(AugmentTaskEncoder):
        ...     def encode_sample(self, sample):
        ...         return ("tagged", super().encode_sample(sample))
        >>> Tagged(DefaultTaskEncoder()).encode_sample(1)
        ('tagged', 1)
    """

    def __init__(self, task_encoder: TaskEncoder):
        if not isinstance(task_encoder, TaskEncoder):
            raise TypeError(f"AugmentTaskEncoder wraps a TaskEncoder, got {type(task_encoder).__name__}")
        self._task_encoder = task_encoder

    @property
    def task_encoder(self) -> TaskEncoder:
        """The wrapped task encoder."""
        return self._task_encoder

    @property
    def decoder(self) -> Any:  # type: ignore[override]
        return self._task_encoder.decoder

    @property
    def cookers(self) -> Sequence[Any]:  # type: ignore[override]
        return self._task_encoder.cookers

    @property
    def __default_failure_tolerance__(self) -> int:  # type: ignore[override]
        return self._task_encoder.__default_failure_tolerance__

    cook_crude_sample = _delegate("cook_crude_sample")
    encode_sample = _delegate("encode_sample")
    preencode_sample = _delegate("preencode_sample")
    postencode_sample = _delegate("postencode_sample")
    select_samples_to_pack = _delegate("select_samples_to_pack")
    pack_selected_samples = _delegate("pack_selected_samples")
    batch_group_criterion = _delegate("batch_group_criterion")
    batch = _delegate("batch")
    encode_batch = _delegate("encode_batch")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._task_encoder!r})"

