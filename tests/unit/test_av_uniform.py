"""get_clips_uniform / get_single_frames_uniform: equally spaced clips and frames, Energon's spacing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.unit.test_av_media import (
    FPS,
    N_FRAMES,
    expected_span,
    read_indices,
    reference_video,
)

from energon_ray.decode.av import AVDecoder, get_clips_uniform, get_single_frames_uniform
from energon_ray.errors import SampleException


def decoder(media_dir, name: str) -> AVDecoder:
    return AVDecoder((media_dir / name).read_bytes(), key=name)


@pytest.mark.parametrize("name", ["h264.mp4", "h264_bframes.mkv", "mpeg4.avi"])
def test_uniform_video_clips_start_at_0_and_end_at_the_end(media_dir, name):
    """num_clips starts are linspace(0, duration - clip); each clip holds the frames shown in its span."""
    _, starts, _ = reference_video(media_dir / name)
    data = get_clips_uniform(decoder(media_dir, name), clip_duration_seconds=0.4, num_clips=4, request_video=True)
    assert data.audio_clips == [] and len(data.video_clips) == 4
    for begin, clip in zip(np.linspace(0, N_FRAMES / FPS - 0.4, 4), data.video_clips):
        first, last = expected_span(starts, float(begin), float(begin) + 0.4)
        assert read_indices(clip) == list(range(first, last + 1))
    assert data.video_timestamps[0][0] == 0.0 and data.video_timestamps[-1][1] == N_FRAMES / FPS


def test_uniform_audio_and_video_share_the_spans(media_dir):
    """With both streams requested the clips cover the same spans; audio clips have duration * rate samples."""
    data = get_clips_uniform(
        decoder(media_dir, "h264_aac.mp4"), 0.5, 3, request_video=True, request_audio=True,
        video_out_frame_size=(32, 24),
    )
    assert [c.shape for c in data.audio_clips] == [(1, 8000)] * 3
    assert data.audio_timestamps == [(0.0, 0.5), (0.75, 1.25), (1.5, 2.0)]
    assert [c.shape[1:] for c in data.video_clips] == [(3, 24, 32)] * 3
    assert [read_indices(c)[0] for c in data.video_clips] == [0, 18, 37]


def test_uniform_audio_only(media_dir):
    """Audio-only files work with request_audio alone."""
    data = get_clips_uniform(decoder(media_dir, "ramp.wav"), 0.25, 5, request_audio=True)
    assert [t[0] for t in data.audio_timestamps] == [0.0, 0.4375, 0.875, 1.3125, 1.75]
    assert all(c.shape == (1, 2000) for c in data.audio_clips)


def test_single_frames_are_centred_on_frames(media_dir):
    """N single frames over an N-frame video are exactly all frames, in order (starts at half frames)."""
    frames, _, _ = reference_video(media_dir / "h264_bframes.mp4")
    out = get_single_frames_uniform(decoder(media_dir, "h264_bframes.mp4"), N_FRAMES)
    assert torch.equal(out, frames)


def test_single_frames_with_timestamps_and_size(media_dir):
    """return_timestamps gives each frame's start time; frames are scaled to (width, height)."""
    frames, stamps = get_single_frames_uniform(
        decoder(media_dir, "vp9.mkv"), 5, video_out_frame_size=(16, 8), return_timestamps=True
    )
    assert frames.shape == (5, 3, 8, 16)
    assert stamps == [0.0, 0.48, 1.0, 1.48, 1.96]


def test_uniform_errors_name_the_key_and_request(media_dir):
    """Bad requests raise ValueError; impossible ones (missing stream, too long) raise SampleException."""
    dec = decoder(media_dir, "h264.mp4")
    with pytest.raises(ValueError, match="h264.mp4: 2 uniform clips of 0.5s: request_video or request_audio"):
        get_clips_uniform(dec, 0.5, 2)
    with pytest.raises(ValueError, match="num_clips must be an integer >= 1"):
        get_clips_uniform(dec, 0.5, 0, request_video=True)
    with pytest.raises(ValueError, match="clip_duration_seconds must be a number >= 0"):
        get_clips_uniform(dec, -1.0, 2, request_video=True)
    with pytest.raises(ValueError, match="audio clips of 0 seconds"):
        get_clips_uniform(dec, 0, 2, request_audio=True)
    message = r"h264.mp4: 2 uniform clips of 0.5s \(audio\) requested, but the media has no audio"
    with pytest.raises(SampleException, match=message):
        get_clips_uniform(dec, 0.5, 2, request_audio=True)
    with pytest.raises(SampleException, match="lasts only 2.000000s"):
        get_clips_uniform(dec, 3.0, 2, request_video=True)
    with pytest.raises(SampleException, match="no video stream"):
        get_single_frames_uniform(decoder(media_dir, "ramp.wav"), 3)
