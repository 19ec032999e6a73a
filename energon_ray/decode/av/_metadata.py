"""Stream facts read from headers, falling back to demuxing when a header leaves them out."""

from __future__ import annotations

from typing import Optional

import av.container
import av.stream

from energon_ray.decode.av._container import AV_ERRORS
from energon_ray.errors import SampleException


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
