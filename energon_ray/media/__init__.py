"""Media metadata at Energon's path ``megatron.energon.media``: ``AVMetadata``, ``ImageMetadata``…

Only re-exports: the code lives in :mod:`energon_ray.decode.media_metadata` (``AVMetadata`` in
:mod:`energon_ray.decode.av`).
"""

from energon_ray.decode.av import AVMetadata
from energon_ray.decode.media_metadata import (
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
