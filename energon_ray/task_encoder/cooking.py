"""Cookers at Energon's path ``megatron.energon.task_encoder.cooking``: ``Cooker``, ``cooker``, ``basic_sample_keys``.

Only re-exports; names of Energon's module we add later to ``energon_ray``'s top level resolve here
on first use.
"""

from energon_ray._reexport import lazy_names
from energon_ray.task_encoder import Cooker, basic_sample_keys, cooker

__all__ = ["Cooker", "basic_sample_keys", "cooker"]

__getattr__ = lazy_names(
    "energon_ray.task_encoder.cooking",
    "megatron.energon.task_encoder.cooking",
    ["get_cooker_need_cache", "get_cooker_need_primary"],
)
