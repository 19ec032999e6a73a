"""AVDecoder video clips against a plain full decode: exact frames, timestamps, units, resizing, seeking."""

from __future__ import annotations

import dataclasses
import io
import math
import pickle
import random

import pytest
import torch
from megatron.energon.av import AVDecoder as EnergonAVDecoder
from tests.unit.test_av_media import (
    FPS,
    HEIGHT,
    N_FRAMES,
    VIDEO_NAMES,
    WIDTH,
    expected_span,
    read_indices,
    reference_video,
)

from energon_ray.decode.av import AVData, AVDecoder
from energon_ray.decode.av import _video_reader
from energon_ray.decode.av._container import open_container, video_stream
from energon_ray.decode.av._video_index import VideoIndex
from energon_ray.decode.av._video_reader import VideoClipReader
from energon_ray.errors import SampleException


@pytest.fixture(scope="module")
def references(media_dir):
    """name -> (frames, starts, ends) of a plain PyAV full decode."""
    return {name: reference_video(media_dir / name) for name in VIDEO_NAMES}


def decoder(media_dir, name: str) -> AVDecoder:
    return AVDecoder((media_dir / name).read_bytes(), key=name)


def random_ranges(seed: int, count: int, top: float, integral: bool):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = sorted(rng.uniform(0, top) for _ in range(2))
        out.append((int(a), int(b)) if integral else (round(a, 3), round(b, 3)))
    return out


@pytest.mark.parametrize("name", VIDEO_NAMES)
def test_full_decode_equals_plain_pyav_decode(media_dir, references, name):
    """get_video returns every frame, pixel for pixel, with the stream's start and end times."""
    frames, starts, ends = references[name]
    data = decoder(media_dir, name).get_video()
    assert isinstance(data, AVData) and data.audio_clips == []
    (clip,) = data.video_clips
    assert clip.dtype == torch.uint8 and clip.shape == (N_FRAMES, 3, HEIGHT, WIDTH)
    assert torch.equal(clip, frames)
    assert data.video_timestamps == [(float(starts[0]), float(ends[-1]))]


@pytest.mark.parametrize("name", VIDEO_NAMES)
def test_clips_in_seconds_hold_exactly_the_frames_shown(media_dir, references, name):
    """Each (start, end) seconds range yields the frames on screen from start to end, with their times."""
    frames, starts, ends = references[name]
    ranges = random_ranges(seed=len(name), count=10, top=N_FRAMES / FPS, integral=False)
    ranges += [(0.4, 0.4), (0.0, 0.04), (1.0, 1.96), (0.12, 0.12)]  # frame boundaries and single frames
    data = decoder(media_dir, name).get_clips(video_clip_ranges=ranges)
    for (start, end), clip, stamps in zip(ranges, data.video_clips, data.video_timestamps):
        first, last = expected_span(starts, start, end)
        assert read_indices(clip) == list(range(first, last + 1)), (start, end)
        assert torch.equal(clip, frames[first : last + 1])
        assert stamps == (float(starts[first]), float(ends[last]))


@pytest.mark.parametrize("name", VIDEO_NAMES)
def test_clips_in_frames_are_inclusive_frame_numbers(media_dir, references, name):
    """A (a, b) frames range yields frames a..b of the full decode, whatever the GOP or B-frames."""
    frames, starts, ends = references[name]
    ranges = random_ranges(seed=7, count=10, top=N_FRAMES - 1, integral=True) + [(N_FRAMES - 1, N_FRAMES - 1)]
    data = decoder(media_dir, name).get_clips(video_clip_ranges=ranges, video_unit="frames")
    for (a, b), clip, stamps in zip(ranges, data.video_clips, data.video_timestamps):
        assert read_indices(clip) == list(range(a, b + 1))
        assert torch.equal(clip, frames[a : b + 1])
        assert stamps == (float(starts[a]), float(ends[b]))


def test_sequential_and_backward_clips_match(media_dir, references):
    """Adjacent, overlapping and backward clips in one call all come out exact (continue vs seek)."""
    frames, _, _ = references["h264_vargop.mp4"]
    ranges = [(2, 5), (6, 6), (7, 20), (19, 21), (1, 2), (41, 49), (0, 49)]
    data = decoder(media_dir, "h264_vargop.mp4").get_clips(video_clip_ranges=ranges, video_unit="frames")
    for (a, b), clip in zip(ranges, data.video_clips):
        assert torch.equal(clip, frames[a : b + 1]), (a, b)


def test_open_end_reads_to_the_last_frame(media_dir):
    """An end of +inf means the end of the video in both units."""
    dec = decoder(media_dir, "vp9.mkv")
    data = dec.get_clips(video_clip_ranges=[(1.5, math.inf)])
    assert read_indices(data.video_clips[0]) == list(range(37, N_FRAMES))
    data = dec.get_clips(video_clip_ranges=[(45, math.inf)], video_unit="frames")
    assert read_indices(data.video_clips[0]) == list(range(45, N_FRAMES))


@pytest.mark.parametrize("size", [(32, 24), (40, 20), (96, 72)])
def test_out_frame_size_is_width_height(media_dir, size):
    """video_out_frame_size=(width, height) gives (frames, 3, height, width) with readable content."""
    data = decoder(media_dir, "h264.mp4").get_clips(video_clip_ranges=[(10, 14)], video_unit="frames",
                                                    video_out_frame_size=size)
    assert data.video_clips[0].shape == (5, 3, size[1], size[0])
    assert read_indices(data.video_clips[0]) == [10, 11, 12, 13, 14]


def test_resizing_happens_in_the_conversion_pass(media_dir, monkeypatch):
    """Frames are scaled by the same swscale call that converts them to RGB: no full-size RGB frame exists."""
    calls = []
    real = _video_reader.VideoReformatter

    class Spy:
        def __init__(self):
            self._inner = real()

        def reformat(self, frame, **kwargs):
            calls.append(((frame.width, frame.height), kwargs["width"], kwargs["height"], kwargs["format"]))
            return self._inner.reformat(frame, **kwargs)

    monkeypatch.setattr(_video_reader, "VideoReformatter", Spy)
    decoder(media_dir, "h264.mp4").get_clips(video_clip_ranges=[(0.2, 0.5)], video_out_frame_size=(16, 12))
    assert calls and all(c == ((WIDTH, HEIGHT), 16, 12, "rgb24") for c in calls)


def count_decoded_frames(monkeypatch):
    counter = {"frames": 0}
    real = VideoClipReader._decode

    def counting(self):
        for frame in real(self):
            counter["frames"] += 1
            yield frame

    monkeypatch.setattr(VideoClipReader, "_decode", counting)
    return counter


@pytest.mark.parametrize(
    "name, frames, keyframe",
    [("h264.mp4", (43, 45), 40), ("h264_vargop.mp4", (39, 39), 18), ("vp9.mkv", (33, 34), 30)],
)
def test_seeks_to_the_keyframe_before_the_clip(media_dir, monkeypatch, name, frames, keyframe):
    """A clip decodes from the last keyframe at or before it, not from the start of the file."""
    counter = count_decoded_frames(monkeypatch)
    data = decoder(media_dir, name).get_clips(video_clip_ranges=[frames], video_unit="frames")
    assert read_indices(data.video_clips[0]) == list(range(frames[0], frames[1] + 1))
    assert counter["frames"] <= frames[1] - keyframe + 1 + 3  # + frames the decoder had buffered


def test_bframe_mp4_seek_lands_before_the_clip(media_dir, monkeypatch):
    """With B-frames, a clip just before a keyframe still seeks to the previous keyframe (dts-based seek)."""
    counter = count_decoded_frames(monkeypatch)
    data = decoder(media_dir, "h264_bframes.mp4").get_clips(video_clip_ranges=[(31, 33)], video_unit="frames")
    assert read_indices(data.video_clips[0]) == [31, 32, 33]
    assert counter["frames"] < 31


def test_missed_seek_is_retried_from_an_earlier_keyframe(media_dir, references):
    """If a seek lands after the clip, the reader warns and decodes again from earlier: still exact."""
    frames, _, _ = references["h264.mp4"]
    data = (media_dir / "h264.mp4").read_bytes()
    with open_container(data, "x") as container:
        index = VideoIndex.build(container, video_stream(container), "x")
    # pretend frame 20's keyframe must be sought at frame 40's timestamp: the seek overshoots
    wrong = list(index.keyframe_seek_ts)
    wrong[2] = index.keyframe_seek_ts[4]
    misleading = dataclasses.replace(index, keyframe_seek_ts=tuple(wrong))
    reader = VideoClipReader(lambda: open_container(data, "x"), misleading, "x")
    with pytest.warns(RuntimeWarning, match="seeking missed frame 22"):
        clip = reader.read(22, 25, None)
    reader.close()
    assert torch.equal(torch.from_numpy(clip), frames[22:26])


def test_video_metadata(media_dir):
    """fps, duration and frame count come from the stream (demuxing, not decoding, for the count)."""
    for name in VIDEO_NAMES:
        dec = decoder(media_dir, name)
        assert dec.get_video_fps() == pytest.approx(FPS), name
        duration, count = dec.get_video_duration(get_frame_count=True)
        assert duration == pytest.approx(N_FRAMES / FPS, abs=1e-6) and count == N_FRAMES, name
        assert dec.has_video_stream() and dec.has_audio_stream() == (name == "h264_aac.mp4")


def test_video_duration_counts_frames_when_the_header_has_no_duration(media_dir):
    """get_video_duration() gives the frame count also unasked where the duration needed it (mkv), as Energon's."""
    for name in VIDEO_NAMES:
        counted = N_FRAMES if name.endswith(".mkv") else None
        expected = (pytest.approx(N_FRAMES / FPS, abs=1e-6), counted)
        assert decoder(media_dir, name).get_video_duration() == expected, name
        assert EnergonAVDecoder(io.BytesIO((media_dir / name).read_bytes())).get_video_duration() == expected, name


def test_a_video_starting_after_0_lasts_as_long_as_its_frames_in_any_container(tmp_path):
    """A 2 s video whose first frame is shown at 0.4 s: its duration is 2 s in mp4 (header) and mkv (demuxed), and
    its uniform clips are the same frames in both. Energon subtracts the start from the mp4 header's duration
    (1.6 s; its mkv says 2 s), a documented difference (docs/compatibility.md, AVDecoder)."""
    from tests.unit.test_av_media import write_video

    from energon_ray.av import get_clips_uniform

    clips = {}
    for name in ("late.mp4", "late.mkv"):
        raw = write_video(tmp_path / name, codec="libx264", gop=10, options={"bf": "0"}, first_pts=10).read_bytes()
        counted = N_FRAMES if name.endswith(".mkv") else None
        assert AVDecoder(raw).get_video_duration() == (pytest.approx(2.0, abs=1e-6), counted), name
        assert AVDecoder(raw).get_metadata().video_duration == pytest.approx(2.0, abs=1e-6), name
        clips[name] = [read_indices(c) for c in get_clips_uniform(AVDecoder(raw), 0.4, 3, request_video=True).video_clips]
    assert clips["late.mp4"] == clips["late.mkv"] == [[0], list(range(10, 21)), list(range(30, 41))]
    assert EnergonAVDecoder(io.BytesIO((tmp_path / "late.mp4").read_bytes())).get_video_duration() == (pytest.approx(1.6, abs=1e-6), None)


def test_decoder_pickles_only_bytes_and_settings(media_dir, references):
    """A used decoder pickles to its bytes plus a few settings, and decodes the same after unpickling."""
    raw = (media_dir / "h264_bframes.mkv").read_bytes()
    dec = AVDecoder(raw, key="s.mkv", suppress_warnings=True)
    before = dec.get_clips(video_clip_ranges=[(0.3, 0.9)])  # fills the frame index cache
    assert dec.__getstate__().keys() == {"data", "key", "suppress_warnings"}
    blob = pickle.dumps(dec)
    assert len(blob) < len(raw) + 200
    clone = pickle.loads(blob)
    assert (clone.key, clone.suppress_warnings, clone.data) == ("s.mkv", True, raw)
    after = clone.get_clips(video_clip_ranges=[(0.3, 0.9)])
    assert torch.equal(before.video_clips[0], after.video_clips[0])
    assert repr(clone) == f"AVDecoder(key='s.mkv', bytes={len(raw)})"


def test_decoder_accepts_streams_and_bytearrays(media_dir):
    """AVDecoder takes bytes, bytearray, memoryview or a binary file object (read from its start)."""
    path = media_dir / "h264.mp4"
    raw = path.read_bytes()
    with open(path, "rb") as f:
        f.read(10)
        sources = [raw, bytearray(raw), memoryview(raw), f]
        counts = [AVDecoder(s).get_video_duration(get_frame_count=True)[1] for s in sources]
    assert counts == [N_FRAMES] * 4


def test_get_frames_decodes_video_and_optionally_its_audio(media_dir):
    """get_frames returns all frames; with video_decode_audio also the audio track."""
    with_audio = decoder(media_dir, "h264_aac.mp4").get_frames(video_decode_audio=True)
    assert with_audio.video_clips[0].shape[0] == N_FRAMES
    assert with_audio.audio_clips[0].shape[0] == 1 and with_audio.audio_clips[0].shape[1] >= 2 * 16000
    only_video = decoder(media_dir, "h264.mp4").get_frames()
    assert only_video.video_clips[0].shape[0] == N_FRAMES and only_video.audio_clips == []
    assert decoder(media_dir, "h264_aac.mp4").get_frames().audio_clips == []


def test_get_frames_with_video_decode_audio_on_a_silent_video_raises_naming_the_key(media_dir):
    """video_decode_audio=True on a video without an audio stream raises SampleException naming the key
    (Energon asserts), where an empty audio_clips came back unnoticed."""
    raw = (media_dir / "h264.mp4").read_bytes()
    with pytest.raises(SampleException, match=r"^clip\.mp4: video_decode_audio=True, but the video has no audio stream$"):
        AVDecoder(raw, key="clip.mp4").get_frames(video_decode_audio=True)
    with pytest.raises(AssertionError, match="No audio stream found"):
        EnergonAVDecoder(io.BytesIO(raw)).get_frames(video_decode_audio=True)


def test_video_with_audio_returns_both(media_dir):
    """get_video_with_audio gives one video clip and one audio clip covering the file."""
    data = decoder(media_dir, "h264_aac.mp4").get_video_with_audio()
    assert len(data.video_clips) == len(data.audio_clips) == 1
    assert data.video_timestamps[0] == (0.0, N_FRAMES / FPS)
    assert data.audio_timestamps[0][0] == 0.0 and data.audio_timestamps[0][1] >= 2.0


def test_avdata_repr_shows_shapes_and_times(media_dir):
    """AVData's repr lists clip shapes and time spans, not pixel values."""
    data = decoder(media_dir, "h264.mp4").get_clips(video_clip_ranges=[(0, 1)], video_unit="frames")
    assert repr(data) == "AVData(video_clips=[(2, 3, 48, 64) uint8 @ 0.000-0.080s], audio_clips=[])"
