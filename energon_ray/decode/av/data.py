"""``AVData``: the decoded clips of one media file and where they sit on its timeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Optional, Tuple

import torch

from energon_ray.decode.media_metadata import MediaMetadataBase, MediaMetadataType

Timestamps = List[Tuple[float, float]]


@dataclass
class AVData:
    """Video and audio clips returned by :class:`AVDecoder` and the uniform helpers.

    Attributes:
        video_clips: one uint8 tensor ``(frames, channels, height, width)`` per requested video range.
        video_timestamps: ``(start, end)`` in seconds of each video clip: the first frame's
            presentation time and the end of the last frame's display interval.
        audio_clips: one tensor ``(channels, samples)`` per requested audio range, in the codec's
            sample type (int16 for 16-bit PCM/FLAC, float32 for lossy codecs; see ``audio_to_float``).
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


@dataclass
class AVMetadata(MediaMetadataBase):
    """What :meth:`AVDecoder.get_metadata` found out about a media file (``None``: not asked, or no such stream).

    The field names are Energon's (``megatron.energon.media.AVMetadata``); ``to_dict``/``from_dict``
    and the stored form (``metadata_type`` ``"av"``) come from :class:`MediaMetadataBase`.

    Attributes:
        video_duration: seconds of the first video stream.
        video_num_frames: its number of frames (the numbering of ``video_unit="frames"``).
        video_fps: its frames per second.
        video_width: its frame width in pixels.
        video_height: its frame height in pixels.
        audio_duration: seconds of the first audio stream.
        audio_channels: its number of channels.
        audio_sample_rate: its samples per second (per channel).
        audio_num_samples: its number of samples per channel.

    Example:
        >>> AVMetadata(audio_duration=2.0, audio_channels=1, audio_sample_rate=8000).to_dict()
        {'audio_duration': 2.0, 'audio_channels': 1, 'audio_sample_rate': 8000}
    """

    metadata_type: ClassVar[MediaMetadataType] = MediaMetadataType.AV

    video_duration: Optional[float] = None
    video_num_frames: Optional[int] = None
    video_fps: Optional[float] = None
    video_width: Optional[int] = None
    video_height: Optional[int] = None
    audio_duration: Optional[float] = None
    audio_channels: Optional[int] = None
    audio_sample_rate: Optional[int] = None
    audio_num_samples: Optional[int] = None


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
