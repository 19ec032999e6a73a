"""Audio/video decoding at Energon's path ``megatron.energon.av``: ``AVDecoder``, ``AVData`` and the clip helpers.

Only re-exports (the code lives in :mod:`energon_ray.decode.av`); Energon names we add later to
``energon_ray``'s top level resolve here on first use.
"""

from energon_ray._reexport import lazy_names
from energon_ray.decode.av import AVData, AVDecoder, AVMetadata, get_clips_uniform, get_single_frames_uniform

__all__ = ["AVData", "AVDecoder", "AVMetadata", "get_clips_uniform", "get_single_frames_uniform"]

__getattr__ = lazy_names("energon_ray.av", "megatron.energon.av", ["AVWebdatasetDecoder"])
