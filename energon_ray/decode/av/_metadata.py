"""Stream facts read from headers, falling back to demuxing when a header leaves them out."""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Optional, Tuple

import av
import av.container
import av.stream

from energon_ray.decode.av._container import AV_ERRORS, audio_stream, video_stream
from energon_ray.decode.av._video_index import VideoIndex
from energon_ray.decode.av.data import AVMetadata
from energon_ray.errors import MediaTooLargeError, SampleException

Opener = Callable[[], ContextManager["av.container.InputContainer"]]
Indexer = Callable[["av.container.InputContainer", Any], VideoIndex]


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


def read_metadata(
    open_media: Opener,
    index_of: Indexer,
    key: str,
    *,
    video: bool,
    video_duration: bool,
    video_frame_count: bool,
    video_frame_size: bool,
    audio: bool,
    audio_duration: bool,
    audio_num_samples: bool,
) -> AVMetadata:
    """Headers first; demux or decode only for what a flag asks and the headers leave out.

    Args:
        open_media: opens the media afresh (a context manager yielding the container).
        index_of: the (cached) :class:`VideoIndex` of a container's video stream.
        key: the sample key, for error messages.
        video, audio: whether to look at the first video / audio stream at all.
        video_duration, audio_duration: demux for a duration no header states.
        video_frame_count: count the frames by demuxing (exact; headers can disagree with the packets).
        video_frame_size: decode the first frame for a size no header states.
        audio_num_samples: decode the audio stream and count its samples.

    Raises:
        SampleException: when the media cannot be opened, demuxed or decoded.
    """
    found = AVMetadata()
    if video:
        with open_media() as container:
            stream = video_stream(container)
            if stream is not None:
                _fill_video(found, container, stream, index_of, key, video_duration, video_frame_count, video_frame_size)
    if audio:
        with open_media() as container:
            stream = audio_stream(container)
            if stream is not None:
                found.audio_sample_rate = int(stream.sample_rate) if stream.sample_rate else None
                found.audio_channels = int(stream.channels) if stream.channels else None
                if audio_duration:
                    found.audio_duration = audio_duration_seconds(container, stream, key)
                elif stream.duration and stream.time_base is not None:
                    found.audio_duration = float(stream.duration * stream.time_base)
        if audio_num_samples and found.audio_sample_rate is not None:
            with open_media() as container:
                found.audio_num_samples = _count_audio_samples(container, key)
    return found


def _fill_video(
    found: AVMetadata, container: "av.container.InputContainer", stream: "av.stream.Stream", index_of: Indexer,
    key: str, duration: bool, frame_count: bool, frame_size: bool,
) -> None:  # fmt: skip
    seconds = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else None
    frames = int(stream.frames) if stream.frames else None
    if frame_count or (duration and seconds is None):
        index = index_of(container, stream)
        frames = len(index)
        if seconds is None:
            seconds = index.seconds(index.end_ts - index.pts[0])
    found.video_duration, found.video_num_frames = seconds, frames
    found.video_fps = video_fps(stream)
    if found.video_fps is None and frames and seconds:
        found.video_fps = frames / seconds
    context = stream.codec_context
    width, height = (context.width, context.height) if context is not None else (0, 0)
    if not (width and height) and frame_size:
        width, height = _first_frame_size(container, stream, key)
    found.video_width, found.video_height = width or None, height or None


def _first_frame_size(container: "av.container.InputContainer", stream: "av.stream.Stream", key: str) -> Tuple[int, int]:
    """Width and height of the first decodable frame, ``(0, 0)`` if none decodes."""
    try:
        container.seek(0)
        for frame in container.decode(stream):
            return frame.width, frame.height
    except AV_ERRORS as exc:
        raise SampleException(f"{key}: cannot decode the first video frame: {type(exc).__name__}: {exc}") from exc
    return 0, 0


def _count_audio_samples(container: "av.container.InputContainer", key: str) -> int:
    """Samples per channel of the whole first audio stream, by decoding it."""
    stream = audio_stream(container)
    total = 0
    try:
        for frame in container.decode(stream):
            total += frame.samples
    except AV_ERRORS as exc:
        raise SampleException(f"{key}: cannot decode the audio stream: {type(exc).__name__}: {exc}") from exc
    return total
