"""``AVDecoder``: a lazy, picklable handle on one audio/video file that decodes clips on demand."""

from __future__ import annotations

import io
import math
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple

import av.container
import torch

from energon_ray.decode.av import _metadata as meta
from energon_ray.decode.av._audio_reader import AudioClipReader, PastTheEnd, preroll_samples
from energon_ray.decode.av._container import audio_stream, open_container, video_stream
from energon_ray.decode.av._ranges import (
    AUDIO_UNITS,
    VIDEO_UNITS,
    Range,
    check_frame_size,
    check_ranges,
    check_unit,
    range_list,
)
from energon_ray.decode.av._spans import audio_span, video_span
from energon_ray.decode.av._video_index import VideoIndex
from energon_ray.decode.av._video_reader import VideoClipReader
from energon_ray.decode.av.data import AVData, AVMetadata, Timestamps
from energon_ray.errors import SampleException

Clips = Tuple[List[torch.Tensor], Timestamps]
WHOLE = [(0.0, math.inf)]


class AVDecoder:
    """Holds the bytes of one media file; every method decodes only what it is asked for.

    Video positions: with ``video_unit="seconds"`` a range ``(start, end)`` holds every frame shown
    during ``[start, end]`` (the frame on screen at ``start`` through the frame on screen at
    ``end``), so a zero-length range gives one frame; with ``"frames"`` it holds frames
    ``start..end`` inclusive, counted in presentation order from 0. Audio ranges are half open:
    samples ``[start, end)``, sample ``n`` being at ``n / sample_rate`` seconds; a seconds range
    starts at sample ``round(start * rate)`` and holds ``round((end - start) * rate)`` samples (halves
    up), so equal durations give equal lengths. Audio comes out in the codec's sample type, as
    Energon's does: int16 for 16-bit WAV/FLAC, int32 for 24/32-bit, float32 for lossy codecs
    (:func:`audio_to_float` gives float32 in [-1, 1]). ``end=float("inf")`` means "to the end
    of the stream". An end past the stream by at most one frame (video) or 1 ms / one codec frame
    (audio) is cut at the end, as headers round durations; anything further raises.

    Clips are frame-exact: each read seeks to the last keyframe at or before the clip (audio: the
    packet before it, minus a pre-roll for lossy codecs), decodes forward and keeps the frames
    whose timestamps fall in the range, so the result equals the same frames of a full decode.

    Pickling keeps only the bytes and the settings (no open container, no cached index), so an
    ``AVDecoder`` can travel between Ray tasks; decoding where the bytes already are is cheaper.
    In the loader it never has to travel: the Ray task that reads a sample from its shard also runs
    ``encode_sample``, which decodes the clips there (see :mod:`energon_ray.tasks.video_qa`).

    Args:
        stream_or_bytes: the file's bytes (``bytes``/``bytearray``/``memoryview``) or a binary
            file object, which is read to its end.
        key: the sample key (or part name) used in error messages.
        suppress_warnings: silence ``RuntimeWarning`` about seeks that had to be redone.

    Raises:
        ValueError: for text streams or other objects that are not bytes.

    Example:
        >>> d = AVDecoder(b"not a video", key="sample_0007.mp4")
        >>> d.has_video_stream()
        Traceback (most recent call last):
        ...
        energon_ray.errors.SampleException: sample_0007.mp4: cannot open media (11 bytes): ...
    """

    def __init__(self, stream_or_bytes: Any, key: str = "<unknown>", suppress_warnings: bool = False):
        self.key = key
        self.suppress_warnings = suppress_warnings
        self._data = _read_bytes(stream_or_bytes, key)
        self._index: Optional[VideoIndex] = None

    @property
    def data(self) -> bytes:
        """The raw bytes of the media file."""
        return self._data

    @property
    def stream(self) -> io.BytesIO:
        """A fresh binary stream on the bytes (Energon's ``AVDecoder.stream``)."""
        return io.BytesIO(self._data)

    def __getstate__(self) -> Dict[str, Any]:
        return {"data": self._data, "key": self.key, "suppress_warnings": self.suppress_warnings}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["data"], state["key"], state["suppress_warnings"])

    def __repr__(self) -> str:
        return f"AVDecoder(key={self.key!r}, bytes={len(self._data)})"

    @contextmanager
    def _open(self) -> Iterator["av.container.InputContainer"]:
        container = open_container(self._data, self.key)
        try:
            yield container
        finally:
            container.close()

    def _reopen(self) -> "av.container.InputContainer":
        return open_container(self._data, self.key)

    # ------------------------------------------------------------------ clips

    def get_clips(
        self,
        video_clip_ranges: Optional[Sequence[Range]] = None,
        audio_clip_ranges: Optional[Sequence[Range]] = None,
        video_unit: Literal["frames", "seconds"] = "seconds",
        audio_unit: Literal["samples", "seconds"] = "seconds",
        video_out_frame_size: Optional[Tuple[int, int]] = None,
    ) -> AVData:
        """Decode the requested video and audio clips.

        Args:
            video_clip_ranges: ``(start, end)`` video ranges in ``video_unit`` (pairs, or an ``(n, 2)``
                numpy array or tensor), or ``None`` for no video.
            audio_clip_ranges: ``(start, end)`` audio ranges in ``audio_unit`` (likewise), or ``None`` for no audio.
            video_unit: ``"seconds"`` or ``"frames"``.
            audio_unit: ``"seconds"`` or ``"samples"``.
            video_out_frame_size: ``(width, height)`` to scale frames to while decoding (Energon's order).

        Returns:
            An :class:`AVData` with one clip and one ``(start, end)`` timestamp per requested range, in
            order; a range starting at or after its stream's end gives none (as Energon's).

        Raises:
            ValueError: for an unknown unit, a malformed, negative or reversed range, a bad frame size.
            SampleException: for a missing stream or unreadable media (ranges that end after the
                media's end are cut there; those that start after it give no clip, above).
        """
        check_unit(video_unit, VIDEO_UNITS, "video", self.key)
        check_unit(audio_unit, AUDIO_UNITS, "audio", self.key)
        video: Clips = ([], [])
        audio: Clips = ([], [])
        if video_clip_ranges is not None:
            video = self.get_video_clips(video_clip_ranges, video_unit, video_out_frame_size)
        if audio_clip_ranges is not None:
            audio = self.get_audio_clips(audio_clip_ranges, audio_unit)
        return AVData(
            video_clips=video[0], video_timestamps=video[1], audio_clips=audio[0], audio_timestamps=audio[1]
        )

    def get_video_clips(
        self,
        video_clip_ranges: Sequence[Range],
        video_unit: Literal["frames", "seconds"] = "seconds",
        video_out_frame_size: Optional[Tuple[int, int]] = None,
    ) -> Clips:
        """Decode video clips; see :meth:`get_clips` for the arguments and errors.

        Returns:
            ``(clips, timestamps)``: uint8 tensors ``(frames, 3, height, width)`` and ``(start, end)`` seconds.
        """
        check_unit(video_unit, VIDEO_UNITS, "video", self.key)
        video_clip_ranges = range_list(video_clip_ranges, what="video", key=self.key)
        ranges = check_ranges(video_clip_ranges, what="video", unit=video_unit, key=self.key)
        size = check_frame_size(video_out_frame_size, self.key)
        if not ranges:
            return [], []
        with self._open() as container:
            stream = self._require_video(container, f"video clips {video_clip_ranges!r}")
            index = self._video_index(container, stream)
        # a range starting at or after the video's end gives no clip (left out, as in Energon)
        spans = [span for span in (video_span(index, rng, video_unit) for rng in ranges) if span is not None]
        reader = VideoClipReader(self._reopen, index, self.key, self.suppress_warnings)
        try:
            clips = [torch.from_numpy(reader.read(first, last, size)) for first, last in spans]
        finally:
            reader.close()
        stamps = [
            (index.seconds(index.pts[first]), index.seconds(index.pts[last] + index.durations[last]))
            for first, last in spans
        ]
        return clips, stamps

    def get_audio_clips(
        self, audio_clip_ranges: Sequence[Range], audio_unit: Literal["samples", "seconds"] = "seconds"
    ) -> Clips:
        """Decode audio clips; see :meth:`get_clips` for the arguments and errors.

        Returns:
            ``(clips, timestamps)``: tensors ``(channels, samples)`` in the codec's sample type (see the
            class) and ``(start, end)`` seconds.
        """
        check_unit(audio_unit, AUDIO_UNITS, "audio", self.key)
        audio_clip_ranges = range_list(audio_clip_ranges, what="audio", key=self.key)
        ranges = check_ranges(audio_clip_ranges, what="audio", unit=audio_unit, key=self.key)
        if not ranges:
            return [], []
        with self._open() as container:
            stream = self._require_audio(container, f"audio clips {audio_clip_ranges!r}")
            rate = stream.sample_rate
            preroll = preroll_samples(stream.codec_context.name, rate)
        spans = [audio_span(rate, r, i, audio_unit) for i, r in enumerate(ranges)]
        reader = AudioClipReader(self._reopen, self.key, preroll, self.suppress_warnings)
        clips, stamps = [], []
        try:
            for start, end in spans:
                empty = end == start  # an empty range: no samples, in the stream's channels and type (Energon's)
                try:
                    samples, first = reader.read(start, start + 1 if empty else end)
                except PastTheEnd:  # no clip there: left out, as in Energon
                    continue
                samples = samples[:, :0] if empty else samples
                clips.append(torch.from_numpy(samples))
                stamps.append((first / rate, (first + samples.shape[1]) / rate))
        finally:
            reader.close()
        return clips, stamps

    # ------------------------------------------------------------ whole file

    def get_video(self) -> AVData:
        """Decode every video frame (no audio)."""
        clips, stamps = self.get_video_clips(WHOLE)
        return AVData(video_clips=clips, video_timestamps=stamps, audio_clips=[], audio_timestamps=[])

    def get_audio(self) -> AVData:
        """Decode the whole audio stream."""
        clips, stamps = self.get_audio_clips(WHOLE)
        return AVData(video_clips=[], video_timestamps=[], audio_clips=clips, audio_timestamps=stamps)

    def get_video_with_audio(self) -> AVData:
        """Decode every video frame and the whole audio stream (both must exist)."""
        return self.get_clips(video_clip_ranges=WHOLE, audio_clip_ranges=WHOLE)

    def get_frames(self, video_decode_audio: bool = False) -> AVData:
        """Decode the whole file: the video (plus its audio if asked and present), or the audio.

        Args:
            video_decode_audio: also decode the audio track of a video (it must have one, as in Energon).

        Returns:
            The decoded :class:`AVData`.

        Raises:
            SampleException: when the file has neither an audio nor a video stream, a video asked for
                its audio has none, or it cannot be decoded.
        """
        has_video, has_audio = self._streams()
        if has_video:
            if video_decode_audio and not has_audio:  # Energon asserts; an empty audio_clips went unnoticed
                raise SampleException(f"{self.key}: video_decode_audio=True, but the video has no audio stream")
            audio = WHOLE if video_decode_audio else None
            return self.get_clips(video_clip_ranges=WHOLE, audio_clip_ranges=audio)
        if has_audio:
            return self.get_audio()
        raise SampleException(f"{self.key}: the media has neither a video nor an audio stream")

    # --------------------------------------------------------------- metadata

    def get_video_fps(self) -> float:
        """Frames per second of the video stream.

        Raises:
            SampleException: when there is no video stream.
        """
        with self._open() as container:
            stream = self._require_video(container, "the video fps")
            fps = meta.video_fps(stream)
            if fps is None:
                index = self._video_index(container, stream)
                fps = len(index) / index.seconds(index.end_ts - index.pts[0])
        return fps

    def get_video_duration(self, get_frame_count: bool = False) -> Tuple[Optional[float], Optional[int]]:
        """Duration of the video stream in seconds, and its frame count if asked.

        Args:
            get_frame_count: also count the frames (demuxes the file, does not decode it).

        Returns:
            ``(duration, frame_count)``; ``(None, None)`` without a video stream; the count is ``None``
            unless asked for or the header holds no duration (then the frames were counted to find
            it, and the count is returned as Energon's does).
        """
        with self._open() as container:
            stream = video_stream(container)
            if stream is None:
                return None, None
            duration = float(stream.duration * stream.time_base) if stream.duration else None
            if duration is not None and not get_frame_count:
                return duration, None
            index = self._video_index(container, stream)
            if duration is None:
                duration = index.seconds(index.end_ts - index.pts[0])
        return duration, len(index)

    def get_audio_duration(self) -> Optional[float]:
        """Duration of the audio stream in seconds, or ``None`` without an audio stream."""
        with self._open() as container:
            stream = audio_stream(container)
            return None if stream is None else meta.audio_duration_seconds(container, stream, self.key)

    def get_audio_samples_per_second(self) -> int:
        """Sample rate of the audio stream.

        Raises:
            SampleException: when there is no audio stream.
        """
        with self._open() as container:
            return int(self._require_audio(container, "the audio sample rate").sample_rate)

    def get_metadata(
        self,
        get_video: bool = True,
        get_video_duration: bool = True,
        get_video_frame_count: bool = True,
        get_video_frame_size: bool = True,
        get_audio: bool = True,
        get_audio_duration: bool = True,
        get_audio_num_samples: bool = False,
    ) -> AVMetadata:
        """Facts about the first video and audio streams (Energon's arguments and field names).

        Header values (fps, size, duration, sample rate, channels; the header's frame count unless
        ``get_video_frame_count``) are always filled in; the flags allow the extra work for what
        headers leave out: demuxing for durations and the exact frame count, decoding the first
        frame for its size, decoding the audio to count ``audio_num_samples``.

        Args:
            get_video / get_audio: look at the video / audio stream at all.
            get_video_duration / get_audio_duration: demux for a duration no header states.
            get_video_frame_count: count the frames (the numbering ``video_unit="frames"`` uses).
            get_video_frame_size: decode the first frame when no header states the size.
            get_audio_num_samples: decode the audio and count samples per channel.

        Returns:
            An :class:`AVMetadata`; a missing stream's fields stay ``None``.

        Raises:
            SampleException: when the media cannot be opened, demuxed or decoded.
        """
        return meta.read_metadata(
            self._open, self._video_index, self.key, video=get_video, video_duration=get_video_duration,
            video_frame_count=get_video_frame_count, video_frame_size=get_video_frame_size, audio=get_audio,
            audio_duration=get_audio_duration, audio_num_samples=get_audio_num_samples,
        )  # fmt: skip

    def has_video_stream(self) -> bool:
        """Whether the file has a video stream (cover art of audio files does not count)."""
        return self._streams()[0]

    def has_audio_stream(self) -> bool:
        """Whether the file has an audio stream."""
        return self._streams()[1]

    # ---------------------------------------------------------------- helpers

    def _streams(self) -> Tuple[bool, bool]:
        with self._open() as container:
            return video_stream(container) is not None, audio_stream(container) is not None

    def _video_index(self, container: "av.container.InputContainer", stream: Any) -> VideoIndex:
        if self._index is None:
            self._index = VideoIndex.build(container, stream, self.key)
        return self._index

    def _require_video(self, container: "av.container.InputContainer", request: str) -> Any:
        stream = video_stream(container)
        if stream is None:
            raise SampleException(f"{self.key}: {request} requested, but the media has no video stream")
        return stream

    def _require_audio(self, container: "av.container.InputContainer", request: str) -> Any:
        stream = audio_stream(container)
        if stream is None:
            raise SampleException(f"{self.key}: {request} requested, but the media has no audio stream")
        if not stream.sample_rate or stream.time_base is None:
            raise SampleException(f"{self.key}: {request} requested, but the audio stream has no sample rate")
        return stream


def _read_bytes(source: Any, key: str) -> bytes:
    """The bytes of ``source``: bytes-like objects as they are, binary file objects read to the end."""
    if isinstance(source, bytes):
        return source
    if isinstance(source, (bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, io.TextIOBase) or "t" in getattr(source, "mode", ""):
        raise ValueError(f"{key}: AVDecoder needs a binary stream, got a text stream {source!r}")
    read = getattr(source, "read", None)
    if read is None:
        raise ValueError(f"{key}: AVDecoder needs bytes or a binary file object, got {type(source).__name__}")
    if getattr(source, "seekable", lambda: False)():
        source.seek(0)
    data = read()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"{key}: AVDecoder needs a binary stream, its read() returned {type(data).__name__}")
    return bytes(data)
