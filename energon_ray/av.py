"""Audio/video decoding at Energon's path ``megatron.energon.av``: ``AVDecoder``, ``AVData``,
``AVWebdatasetDecoder`` and the clip helpers.

Only re-exports (the code lives in :mod:`energon_ray.decode.av` and :mod:`energon_ray.decode.av_handler`).
"""

from energon_ray.decode.av import AVData, AVDecoder, AVMetadata, get_clips_uniform, get_single_frames_uniform
from energon_ray.decode.av_handler import AVWebdatasetDecoder

__all__ = ["AVData", "AVDecoder", "AVMetadata", "AVWebdatasetDecoder", "get_clips_uniform", "get_single_frames_uniform"]
