"""Task encoders: the user's hooks, batching helpers and decorators (no Ray)."""

from energon_ray.task_encoder.base import DefaultTaskEncoder, TaskEncoder, is_overridden
from energon_ray.task_encoder.batching import batch_list, batch_pad_stack, batch_stack, generic_batch
from energon_ray.task_encoder.decorators import Cooker, basic_sample_keys, cooker, get_stateless, stateless

__all__ = [
    "Cooker",
    "DefaultTaskEncoder",
    "TaskEncoder",
    "basic_sample_keys",
    "batch_list",
    "batch_pad_stack",
    "batch_stack",
    "cooker",
    "generic_batch",
    "get_stateless",
    "is_overridden",
    "stateless",
]
