"""``VideoIndex``: every frame's presentation timestamp and the keyframes, read by demuxing only."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from fractions import Fraction
from typing import List, Optional, Tuple

import av
import av.container
import av.stream

from energon_ray.decode.av._container import AV_ERRORS
from energon_ray.errors import SampleException


@dataclass(frozen=True)
class VideoIndex:
    """Frames of one video stream in presentation order (frame ``i`` is the i-th frame shown).

    Attributes:
        pts: presentation timestamp of each frame, in ``time_base`` ticks, increasing.
        durations: display duration of each frame in ticks (> 0).
        keyframes: frame numbers of the keyframes, increasing.
        keyframe_seek_ts: for each keyframe, the timestamp handed to ``container.seek`` (its pts:
            with B-frames, seeking an MP4 on the keyframe's smaller dts lands a whole GOP early).
        time_base: seconds per tick.
    """

    pts: Tuple[int, ...]
    durations: Tuple[int, ...]
    keyframes: Tuple[int, ...]
    keyframe_seek_ts: Tuple[int, ...]
    time_base: Fraction

    def __len__(self) -> int:
        return len(self.pts)

    @property
    def end_ts(self) -> int:
        """The tick at which the last frame stops being shown."""
        return self.pts[-1] + self.durations[-1]

    def seconds(self, ticks: float) -> float:
        """Convert ticks to seconds."""
        return float(ticks * self.time_base)

    def frame_at(self, ticks: float) -> int:
        """The frame shown at ``ticks`` (the first frame for times before the video starts)."""
        return max(0, bisect.bisect_right(self.pts, ticks) - 1)

    def keyframe_before(self, frame: int) -> int:
        """Position in :attr:`keyframes` of the last keyframe at or before ``frame``, or -1."""
        return bisect.bisect_right(self.keyframes, frame) - 1

    @classmethod
    def build(
        cls, container: "av.container.InputContainer", stream: "av.stream.Stream", key: str
    ) -> "VideoIndex":
        """Demux (not decode) the whole ``stream`` and index its frames.

        Args:
            container: an opened container; it is left at the end of the file.
            stream: the video stream to index.
            key: the sample key, for error messages.

        Returns:
            The index.

        Raises:
            SampleException: when the container cannot be demuxed or holds no video frame.
        """
        if stream.time_base is None:
            raise SampleException(f"{key}: the video stream has no time base; cannot place its frames")
        packets = _read_packets(container, stream, key)
        if not packets:
            raise SampleException(f"{key}: the video stream holds no frames (empty or truncated file)")
        packets.sort()
        pts = [p[0] for p in packets]
        default = _default_duration(stream, pts)
        durations = [
            p[1] if p[1] > 0 else (pts[i + 1] - pts[i] if i + 1 < len(pts) else default)
            for i, p in enumerate(packets)
        ]
        keyframes = [i for i, p in enumerate(packets) if p[2] is not None]
        return cls(
            pts=tuple(pts),
            durations=tuple(max(1, d) for d in durations),
            keyframes=tuple(keyframes),
            keyframe_seek_ts=tuple(packets[i][2] for i in keyframes),
            time_base=Fraction(stream.time_base),
        )


def _read_packets(
    container: "av.container.InputContainer", stream: "av.stream.Stream", key: str
) -> List[Tuple[int, int, Optional[int]]]:
    """``(pts, duration, seek_ts if keyframe else None)`` per frame packet, deduplicated on pts."""
    seen = set()
    packets = []
    try:
        for packet in container.demux(stream):
            ts = packet.pts if packet.pts is not None else packet.dts
            if ts is None or packet.size == 0 or packet.is_discard or ts in seen:
                continue
            seen.add(ts)
            packets.append((ts, packet.duration or 0, ts if packet.is_keyframe else None))
    except AV_ERRORS as exc:
        raise SampleException(f"{key}: cannot demux the video stream: {type(exc).__name__}: {exc}") from exc
    return packets


def _default_duration(stream: "av.stream.Stream", pts: List[int]) -> int:
    """A frame duration in ticks for frames whose packet carries none (the last one, mostly)."""
    rate = stream.average_rate or stream.guessed_rate
    if rate:
        return max(1, round(1 / (Fraction(rate) * Fraction(stream.time_base))))
    gaps = sorted(b - a for a, b in zip(pts, pts[1:]))
    return gaps[len(gaps) // 2] if gaps else 1
