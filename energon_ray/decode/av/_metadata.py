"""Stream facts read from headers, falling back to demuxing when a header leaves them out."""

from __future__ import annotations

from typing import Optional

import av
import av.container
import av.stream

from energon_ray.decode.av._container import AV_ERRORS
from energon_ray.errors import MediaTooLargeError, SampleException


def audio_duration_seconds(
    container: "av.container.InputContainer", stream: "av.stream.Stream", key: str
) -> Optional[float]:
    """The audio stream's duration: from the header, else from its packets' timestamps.

    Raises:
        SampleException: when the packets cannot be read.
    """
    if stream.time_base is None:
        return None
    if stream.duration:
        return float(stream.duration * stream.time_base)
    first = end = None
    try:
        for packet in container.demux(stream):
            if packet.pts is None or packet.size == 0:
                continue
            first = packet.pts if first is None else min(first, packet.pts)
            end = max(end or packet.pts, packet.pts + (packet.duration or 0))
    except AV_ERRORS as exc:
        raise SampleException(f"{key}: cannot demux the audio stream: {type(exc).__name__}: {exc}") from exc
    if first is None:
        return None
    return float((end - first) * stream.time_base)


def video_fps(stream: "av.stream.Stream") -> Optional[float]:
    """Frames per second from the stream header (average, else guessed rate)."""
    rate = stream.average_rate or stream.guessed_rate
    return float(rate) if rate else None


def header_duration_seconds(container: "av.container.InputContainer") -> Optional[float]:
    """The longest duration the headers state (container or any stream), or ``None`` if none does."""
    durations = [container.duration / av.time_base] if container.duration else []
    durations += [float(s.duration * s.time_base) for s in container.streams if s.duration and s.time_base]
    return max(durations) if durations else None


def check_limits(
    container: "av.container.InputContainer",
    key: str,
    max_video_pixels: Optional[int],
    max_duration_s: Optional[float],
) -> None:
    """Refuse media whose headers promise larger video frames or a longer duration than allowed.

    Only headers are read, nothing is decoded; a limit of ``None`` is not checked, nor is a duration
    no header states.

    Raises:
        MediaTooLargeError: naming the part, the frame size or duration, and the limit.
    """
    if max_video_pixels is not None:
        for stream in container.streams.video:
            context = stream.codec_context
            if context is None:  # no decoder for it: its frames cannot be decoded anyway
                continue
            width, height = context.width or 0, context.height or 0
            if width * height > max_video_pixels:
                raise MediaTooLargeError(
                    f"{key}: video frames of {width}×{height} = {width * height:,} pixels exceed the limit of "
                    f"{max_video_pixels:,} pixels per frame; refused before decoding (raise it with "
                    "SampleDecoder(max_video_pixels=...), None for no limit)"
                )
    if max_duration_s is not None:
        duration = header_duration_seconds(container)
        if duration is not None and duration > max_duration_s:
            raise MediaTooLargeError(
                f"{key}: media of {duration:,.3f} s exceeds the limit of {max_duration_s:,} s; refused before "
                "decoding (raise it with SampleDecoder(max_av_duration_s=...), None for no limit)"
            )
