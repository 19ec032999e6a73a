"""``VideoClipReader``: decode runs of frames by seeking to the keyframe before them."""

from __future__ import annotations

import warnings
from typing import Callable, Iterator, Optional, Tuple

import av
import av.container
import av.stream
import numpy as np
from av.video.reformatter import VideoReformatter

from energon_ray.decode.av._container import AV_ERRORS, video_stream
from energon_ray.decode.av._video_index import VideoIndex
from energon_ray.errors import SampleException

Opener = Callable[[], "av.container.InputContainer"]


class VideoClipReader:
    """Reads frames ``first..last`` (presentation order, inclusive) of a video, exactly.

    Each read seeks to the last keyframe at or before ``first`` and decodes forward, dropping
    frames shown before ``first`` by their pts; when the previous read left the decoder between
    that keyframe and ``first``, it just keeps decoding. Frames are checked one by one against the
    index, so a clip holds exactly the frames a full decode shows at those positions. If a seek
    lands after the wanted frame (a demuxer seeking coarsely), the read retries from the keyframe
    before, then from the very start of the file.

    Args:
        open_container: opens a fresh container on the same bytes (used to restart from the top).
        index: the stream's :class:`VideoIndex`.
        key: the sample key, for messages.
        suppress_warnings: do not warn when a seek had to be retried.
    """

    def __init__(self, open_container: Opener, index: VideoIndex, key: str, suppress_warnings: bool = False):
        self._open = open_container
        self._index = index
        self._key = key
        self._quiet = suppress_warnings
        self._container: Optional["av.container.InputContainer"] = None
        self._frames: Optional[Iterator["av.VideoFrame"]] = None
        self._pending: Optional["av.VideoFrame"] = None
        self._last_pts: Optional[int] = None
        self._scaler = VideoReformatter()

    def close(self) -> None:
        """Close the container this reader opened."""
        if self._container is not None:
            self._container.close()
        self._container = self._frames = self._pending = None

    def read(self, first: int, last: int, size: Optional[Tuple[int, int]]) -> np.ndarray:
        """Decode frames ``first..last`` into a uint8 array ``(frames, 3, height, width)``.

        Args:
            first: first frame number (presentation order).
            last: last frame number, inclusive, ``>= first``.
            size: ``(width, height)`` to scale to while converting each frame, or ``None``.

        Returns:
            The RGB frames.

        Raises:
            SampleException: when the decoder cannot produce every frame of the range.
        """
        keyframe = self._index.keyframe_before(first)
        for attempt in range(3):
            self._position(first, keyframe)
            out = self._collect(first, last, size)
            if out is not None:
                return out
            if keyframe < 0:
                break
            keyframe = keyframe - 1 if attempt == 0 else -1
            if not self._quiet:
                warnings.warn(
                    f"{self._key}: seeking missed frame {first}; decoding again from an earlier keyframe",
                    RuntimeWarning,
                    stacklevel=3,
                )
        raise SampleException(
            f"{self._key}: the decoder did not produce frames {first}..{last} listed in the container "
            "(corrupt or truncated video)"
        )

    def _position(self, first: int, keyframe: int) -> None:
        """Seek to ``keyframe`` (restart the file if -1), unless already decoding between it and ``first``."""
        target = self._index.pts[first]
        if self._frames is not None:
            ahead = self._pending.pts if self._pending is not None else None
            behind = ahead is None and self._last_pts is not None and self._last_pts < target
            if (ahead is not None and ahead <= target) or behind:
                reached = ahead if ahead is not None else self._last_pts
                if keyframe < 0 or reached >= self._index.pts[self._index.keyframes[keyframe]]:
                    return
        self._pending = None
        self._last_pts = None
        if keyframe < 0 or self._container is None:
            self.close()
            self._container = self._open()
        if keyframe >= 0:
            stream = video_stream(self._container)
            try:
                self._container.seek(
                    self._index.keyframe_seek_ts[keyframe], stream=stream, backward=True, any_frame=False
                )
            except AV_ERRORS as exc:
                raise SampleException(f"{self._key}: seeking the video failed: {exc}") from exc
        self._frames = self._decode()

    def _decode(self) -> Iterator["av.VideoFrame"]:
        stream = video_stream(self._container)
        try:
            for packet in self._container.demux(stream):
                for frame in packet.decode():
                    yield frame
        except AV_ERRORS as exc:
            raise SampleException(
                f"{self._key}: decoding the video failed (corrupt or truncated data): {type(exc).__name__}: {exc}"
            ) from exc

    def _next_frame(self) -> Optional["av.VideoFrame"]:
        if self._pending is not None:
            frame, self._pending = self._pending, None
            return frame
        frame = next(self._frames, None)
        if frame is None:
            self._frames = None  # at the end of the file: the next read has to seek
        else:
            if frame.pts is None:
                raise SampleException(f"{self._key}: the video decoder returned a frame without timestamp")
            self._last_pts = frame.pts
        return frame

    def _collect(self, first: int, last: int, size: Optional[Tuple[int, int]]) -> Optional[np.ndarray]:
        """Take frames ``first..last`` from the decoder; ``None`` if one of them never comes."""
        pts = self._index.pts
        out: Optional[np.ndarray] = None
        filled = 0
        count = last - first + 1
        while filled < count:
            frame = self._next_frame()
            if frame is None:
                return None
            if frame.pts < pts[first + filled]:
                continue
            if frame.pts > pts[first + filled]:
                self._pending = frame  # a later clip may start with it
                return None
            if out is None:
                width, height = size if size is not None else (frame.width, frame.height)
                out = np.empty((count, 3, height, width), dtype=np.uint8)
            out[filled] = self._to_rgb(frame, out.shape[3], out.shape[2]).transpose(2, 0, 1)
            filled += 1
        return out

    def _to_rgb(self, frame: "av.VideoFrame", width: int, height: int) -> np.ndarray:
        """Convert (and scale, in the same swscale pass) one decoded frame to ``(height, width, 3)``."""
        rgb = self._scaler.reformat(
            frame, width=width, height=height, format="rgb24", interpolation="BILINEAR", threads=1
        )
        return rgb.to_ndarray()
