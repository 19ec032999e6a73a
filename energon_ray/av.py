"""Audio/video decoding (Energon's ``megatron.energon.av``): ``AVDecoder``, ``AVData``, ``AVMetadata`` and clip helpers."""

from energon_ray.decode.av import AVData, AVDecoder, AVMetadata, get_clips_uniform, get_single_frames_uniform

__all__ = ["AVData", "AVDecoder", "AVMetadata", "get_clips_uniform", "get_single_frames_uniform"]
