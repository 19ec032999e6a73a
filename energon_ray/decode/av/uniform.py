"""Equally spaced clips and frames: convenience wrappers around :meth:`AVDecoder.get_clips`."""

from __future__ import annotations

import math
import numbers
from typing import List, Optional, Tuple, Union

import numpy as np
import torch

from energon_ray.decode.av.data import AVData
from energon_ray.decode.av.decoder import AVDecoder
from energon_ray.errors import SampleException


def get_clips_uniform(
    av_decoder: AVDecoder,
    clip_duration_seconds: float,
    num_clips: int,
    request_video: bool = False,
    request_audio: bool = False,
    video_out_frame_size: Optional[Tuple[int, int]] = None,
) -> AVData:
    """Decode ``num_clips`` clips of ``clip_duration_seconds``, equally spaced over the media.

    The first clip starts at 0 and the last one ends at the end of the shorter of the requested
    streams. A duration of 0 asks for single frames, centred on frames: starts run from half a
    frame to the end minus half a frame.

    Args:
        av_decoder: the decoder of the file.
        clip_duration_seconds: length of each clip (>= 0, at most the media's duration).
        num_clips: how many clips (>= 1).
        request_video: decode video clips.
        request_audio: decode audio clips (not with a duration of 0).
        video_out_frame_size: ``(width, height)`` to scale frames to while decoding.

    Returns:
        An :class:`AVData` with ``num_clips`` clips per requested stream.

    Raises:
        ValueError: when neither stream is requested, or for a bad duration or clip count.
        SampleException: when a requested stream is missing or shorter than one clip.
    """
    key = av_decoder.key
    request = f"{num_clips} uniform clips of {clip_duration_seconds!r}s"
    _check_request(key, request, clip_duration_seconds, num_clips, request_video, request_audio)
    total = math.inf
    if request_video:
        video_duration, _ = av_decoder.get_video_duration()
        if video_duration is None:
            raise SampleException(f"{key}: {request} (video) requested, but the media has no video stream")
        total = video_duration
    if request_audio:
        audio_duration = av_decoder.get_audio_duration()
        if audio_duration is None:
            raise SampleException(f"{key}: {request} (audio) requested, but the media has no audio stream")
        total = min(total, audio_duration)  # streams rarely end together; stay inside both
    if clip_duration_seconds == 0:
        half_frame = 0.5 / av_decoder.get_video_fps()
        first, last = half_frame, total - half_frame
    else:
        first, last = 0.0, total - clip_duration_seconds
    if last < first:
        raise SampleException(f"{key}: {request} requested, but the media lasts only {total:.6f}s")
    ranges = [(float(s), float(s) + clip_duration_seconds) for s in np.linspace(first, last, num_clips)]
    return av_decoder.get_clips(
        video_clip_ranges=ranges if request_video else None,
        audio_clip_ranges=ranges if request_audio else None,
        video_unit="seconds",
        audio_unit="seconds",
        video_out_frame_size=video_out_frame_size,
    )


def _check_request(key: str, request: str, duration, num_clips, request_video, request_audio) -> None:
    if not request_video and not request_audio:
        raise ValueError(f"{key}: {request}: request_video or request_audio must be True")
    if isinstance(duration, bool) or not isinstance(duration, numbers.Real) or not duration >= 0:
        raise ValueError(f"{key}: {request}: clip_duration_seconds must be a number >= 0")
    if math.isinf(duration):
        raise ValueError(f"{key}: {request}: clip_duration_seconds must be finite")
    if isinstance(num_clips, bool) or not isinstance(num_clips, numbers.Integral) or num_clips < 1:
        raise ValueError(f"{key}: {request}: num_clips must be an integer >= 1")
    if duration == 0 and request_audio:
        raise ValueError(f"{key}: {request}: audio clips of 0 seconds hold no sample")


def get_single_frames_uniform(
    av_decoder: AVDecoder,
    num_frames: int,
    *,
    video_out_frame_size: Optional[Tuple[int, int]] = None,
    return_timestamps: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, List[float]]]:
    """Decode ``num_frames`` single frames, equally spaced over the video.

    Args:
        av_decoder: the decoder of the file.
        num_frames: how many frames (>= 1).
        video_out_frame_size: ``(width, height)`` to scale frames to while decoding.
        return_timestamps: also return each frame's presentation time in seconds.

    Returns:
        A uint8 tensor ``(num_frames, 3, height, width)``, and the list of timestamps if asked.

    Raises:
        ValueError: for a bad ``num_frames``.
        SampleException: when there is no video stream or it cannot be decoded.

    Example:
        >>> # frames = get_single_frames_uniform(AVDecoder(mp4_bytes), 8, video_out_frame_size=(224, 224))
    """
    data = get_clips_uniform(
        av_decoder,
        clip_duration_seconds=0,
        num_clips=num_frames,
        request_video=True,
        video_out_frame_size=video_out_frame_size,
    )
    frames = torch.cat(data.video_clips, dim=0)
    if return_timestamps:
        return frames, [start for start, _ in data.video_timestamps]
    return frames
