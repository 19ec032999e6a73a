"""``AVData``: the decoded clips of one media file and where they sit on its timeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

Timestamps = List[Tuple[float, float]]


@dataclass
class AVData:
    """Video and audio clips returned by :class:`AVDecoder` and the uniform helpers.

    Attributes:
        video_clips: one uint8 tensor ``(frames, channels, height, width)`` per requested video range.
        video_timestamps: ``(start, end)`` in seconds of each video clip: the first frame's
            presentation time and the end of the last frame's display interval.
        audio_clips: one float32 tensor ``(channels, samples)`` per requested audio range, in [-1, 1].
        audio_timestamps: ``(start, end)`` in seconds of each audio clip (first sample, one past the last).

    Example:
        >>> AVData(video_clips=[torch.zeros(2, 3, 4, 5, dtype=torch.uint8)], video_timestamps=[(0.0, 0.2)],
        ...        audio_clips=[], audio_timestamps=[])
        AVData(video_clips=[(2, 3, 4, 5) uint8 @ 0.000-0.200s], audio_clips=[])
    """

    video_clips: Optional[List[torch.Tensor]]
    video_timestamps: Optional[Timestamps]
    audio_clips: Optional[List[torch.Tensor]]
    audio_timestamps: Optional[Timestamps]

    def __repr__(self) -> str:
        return (
            f"AVData(video_clips={_describe(self.video_clips, self.video_timestamps)}, "
            f"audio_clips={_describe(self.audio_clips, self.audio_timestamps)})"
        )


def _describe(clips: Optional[List[torch.Tensor]], stamps: Optional[Timestamps]) -> str:
    if clips is None:
        return "None"
    stamps = list(stamps or [])
    parts = []
    for i, clip in enumerate(clips):
        dtype = str(clip.dtype).replace("torch.", "")
        where = f" @ {stamps[i][0]:.3f}-{stamps[i][1]:.3f}s" if i < len(stamps) else ""
        parts.append(f"{tuple(clip.shape)} {dtype}{where}")
    return "[" + ", ".join(parts) + "]"
