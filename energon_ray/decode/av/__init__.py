"""Audio and video decoding on PyAV: lazy :class:`AVDecoder`, frame-exact clips, uniform sampling.

Example:
    >>> from energon_ray.decode.av import AVDecoder, get_clips_uniform
    >>> # clips = get_clips_uniform(AVDecoder(mp4_bytes, key="s0.mp4"), 2.0, 4, request_video=True)
"""

from energon_ray.decode.av._audio_reader import audio_to_float
from energon_ray.decode.av.data import AVData, AVMetadata
from energon_ray.decode.av.decoder import AVDecoder
from energon_ray.decode.av.uniform import get_clips_uniform, get_single_frames_uniform

__all__ = ["AVData", "AVDecoder", "AVMetadata", "audio_to_float", "get_clips_uniform", "get_single_frames_uniform"]
