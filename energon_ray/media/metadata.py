"""Media metadata at Energon's module path ``megatron.energon.media.metadata`` (where Energon defines
the classes that ``megatron.energon.media`` exports; its own tests import them from here).

Only re-exports: the same objects, the same names as :mod:`energon_ray.media`.
"""

from energon_ray.media import (
    AVMetadata,
    ImageMetadata,
    MediaMetadataBase,
    MediaMetadataType,
    deserialize_media_metadata,
    serialize_media_metadata,
)

__all__ = [
    "AVMetadata",
    "ImageMetadata",
    "MediaMetadataBase",
    "MediaMetadataType",
    "deserialize_media_metadata",
    "serialize_media_metadata",
]
