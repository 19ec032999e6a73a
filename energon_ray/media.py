"""Media metadata at Energon's path ``megatron.energon.media``: ``AVMetadata``, ``ImageMetadata``…

Only re-exports: ``AVMetadata`` from :mod:`energon_ray.decode.av`; the other names of Energon's module
resolve on first use from ``energon_ray``'s top level, when it has them.
"""

from energon_ray._reexport import lazy_names
from energon_ray.decode.av import AVMetadata

__all__ = ["AVMetadata"]

__getattr__ = lazy_names(
    "energon_ray.media",
    "megatron.energon.media",
    ["ImageMetadata", "MediaMetadataBase", "MediaMetadataType", "deserialize_media_metadata", "serialize_media_metadata"],
)
