"""Opening media bytes with PyAV and picking the streams the decoder works on."""

from __future__ import annotations

import io
from typing import Optional

import av
import av.container
import av.stream

from energon_ray.errors import SampleException

#: Errors PyAV raises for unreadable media; they become :class:`SampleException`.
AV_ERRORS = (av.FFmpegError, EOFError, OSError, ValueError)


def _open_options(version: str) -> dict:
    """``av.open`` options for a PyAV ``version``: before 19, metadata that is not UTF-8 (binary
    tags some phones and editors write) failed the open unless ``metadata_errors="ignore"``;
    PyAV 19 dropped that argument (passing it raises ``TypeError``)."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 0
    return {} if major >= 19 else {"metadata_errors": "ignore"}


_OPEN_OPTIONS = _open_options(av.__version__)


def open_container(data: bytes, key: str) -> "av.container.InputContainer":
    """Open ``data`` as a PyAV input container, single-threaded.

    Decoding runs one file per Ray worker CPU, so ffmpeg's own thread pools would only
    oversubscribe the node (and frame threading delays output by one frame per thread).

    Args:
        data: the whole media file.
        key: the sample key, for error messages.

    Returns:
        The opened container; the caller closes it.

    Raises:
        SampleException: when the bytes are empty or not a media container PyAV can read.
    """
    if not data:
        raise SampleException(f"{key}: cannot open media: the file is empty (0 bytes)")
    try:
        container = av.open(io.BytesIO(data), mode="r", **_OPEN_OPTIONS)
    except AV_ERRORS as exc:
        raise SampleException(
            f"{key}: cannot open media ({len(data)} bytes): {type(exc).__name__}: {exc}"
        ) from exc
    for stream in container.streams:
        context = stream.codec_context
        if context is not None:
            context.thread_type = "NONE"
            context.thread_count = 1
    return container


def video_stream(container: "av.container.InputContainer") -> Optional["av.stream.Stream"]:
    """The first real video stream, skipping cover art (attached pictures) of audio files."""
    for stream in container.streams.video:
        if not stream.disposition & av.stream.Disposition.attached_pic:
            return stream
    return None


def audio_stream(container: "av.container.InputContainer") -> Optional["av.stream.Stream"]:
    """The first audio stream, or ``None``."""
    streams = container.streams.audio
    return streams[0] if len(streams) else None
