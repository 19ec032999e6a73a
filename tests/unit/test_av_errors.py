"""Bad input to AVDecoder: clear ValueError/SampleException naming the sample key and request, never garbage."""

from __future__ import annotations

import io
import math
import random

import numpy as np
import pytest
import torch
from tests.unit.test_av_media import N_FRAMES, read_indices

from energon_ray.decode.av import AVDecoder
from energon_ray.errors import SampleException


def decoder(media_dir, name: str) -> AVDecoder:
    return AVDecoder((media_dir / name).read_bytes(), key=f"shard_0/{name}")


@pytest.mark.parametrize(
    "ranges, unit, message",
    [
        ([(-0.5, 1.0)], "seconds", r"video clip #0 \(-0.5, 1.0\) \(seconds\): negative start"),
        ([(0.0, 1.0), (1.5, 1.0)], "seconds", r"video clip #1 \(1.5, 1.0\) \(seconds\): start is after end"),
        ([(float("nan"), 1.0)], "seconds", r"start must be finite"),
        ([(math.inf, math.inf)], "seconds", r"start must be finite"),
        ([(0.0, -math.inf)], "seconds", r"end finite or \+inf"),
        ([(1.5, 3)], "frames", r"\(frames\): positions in frames must be whole numbers"),
        ([(0, 1, 2)], "seconds", r"expected a \(start, end\) pair"),
        ([("0", "1")], "seconds", r"start must be a number, got str"),
        ([(True, 2)], "frames", r"start must be a number, got bool"),
        ((0.0, 1.0), "seconds", r"expected a \(start, end\) pair"),
        ("0-1", "seconds", r"video_clip_ranges must be a sequence of \(start, end\) pairs"),
    ],
)
def test_malformed_video_ranges_raise_value_error(media_dir, ranges, unit, message):
    """Malformed, negative, reversed or non-finite video ranges raise ValueError naming key and range."""
    with pytest.raises(ValueError, match="shard_0/h264.mp4: .*" + message):
        decoder(media_dir, "h264.mp4").get_clips(video_clip_ranges=ranges, video_unit=unit)


@pytest.mark.parametrize("kind", ["numpy", "tensor", "generator"])
def test_array_ranges_give_the_clips_of_the_same_list(media_dir, kind):
    """An (n, 2) numpy array, a tensor or a generator of ranges gives the clips of the list (Energon iterates them)."""
    as_kind = {
        "numpy": lambda r: np.array(r),
        "tensor": lambda r: torch.tensor(r),
        "generator": lambda r: (pair for pair in r),
    }[kind]
    video, audio = decoder(media_dir, "h264.mp4"), decoder(media_dir, "ramp_stereo.wav")
    for dec, name, unit, ranges in [
        (video, "video", "seconds", [(0.1, 0.5), (1.0, 1.2)]),
        (video, "video", "frames", [(3, 7), (20, 29)]),
        (audio, "audio", "seconds", [(0.1, 0.5), (1.0, 1.2)]),
        (audio, "audio", "samples", [(800, 4000), (8000, 9600)]),
    ]:
        expected = getattr(dec, f"get_{name}_clips")(ranges, unit)
        got = getattr(dec, f"get_{name}_clips")(as_kind(ranges), unit)
        assert got[1] == expected[1]
        assert [tuple(c.shape) for c in got[0]] == [tuple(c.shape) for c in expected[0]]
        assert all(torch.equal(a, b) for a, b in zip(got[0], expected[0]))


def test_array_ranges_are_checked_and_named_as_lists(media_dir):
    """A bad row of an array of ranges is reported as the plain list it holds."""
    with pytest.raises(ValueError, match=r"shard_0/h264.mp4: video clip #1 \[0.5, 0.25\] \(seconds\): start is after end"):
        decoder(media_dir, "h264.mp4").get_clips(video_clip_ranges=np.array([[0.0, 0.5], [0.5, 0.25]]))
    with pytest.raises(ValueError, match=r"audio_clip_ranges must be a sequence of \(start, end\) pairs, got 5"):
        decoder(media_dir, "ramp.wav").get_clips(audio_clip_ranges=5)


@pytest.mark.parametrize(
    "ranges, unit, frames",
    [
        ([(0.5, 0.5), (2.5, 3.0), (1.0, 1.0), (2.0, 2.0)], "seconds", [[12], [25]]),
        ([(5, 5), (50, 50), (60, 70), (7, 8)], "frames", [[5], [7, 8]]),
    ],
)
def test_video_ranges_starting_at_or_after_the_video_end_give_no_clip(media_dir, ranges, unit, frames):
    """As in Energon, a range that starts at or after the video's end (2 s, 50 frames) gives no clip:
    the others come back in order (a fixed time grid longer than the video keeps its clips)."""
    out = decoder(media_dir, "vp9.mkv").get_clips(video_clip_ranges=ranges, video_unit=unit)
    assert [read_indices(clip) for clip in out.video_clips] == frames
    assert len(out.video_timestamps) == len(frames)


def test_audio_ranges_starting_at_or_after_the_audio_end_give_no_clip(media_dir):
    """As in Energon, an audio range starting at or after the end (2 s; right at it the seek lands
    after the last packet) gives no clip; the others come back in order."""
    out = decoder(media_dir, "ramp.wav").get_clips(audio_clip_ranges=[(0.5, 0.75), (2.5, 3.0), (1.0, 1.25), (2.0, 3.0)])
    assert [tuple(c.shape) for c in out.audio_clips] == [(1, 2000), (1, 2000)]
    assert out.audio_timestamps == [(0.5, 0.75), (1.0, 1.25)]


@pytest.mark.parametrize(
    "ranges, unit, frames, stamps",
    [
        ([(1.0, 2.5)], "seconds", list(range(25, 50)), [(1.0, 2.0)]),
        ([(10, 60)], "frames", list(range(10, 50)), [(0.4, 2.0)]),
    ],
)
def test_video_ranges_ending_after_the_video_are_cut_at_its_end(media_dir, ranges, unit, frames, stamps):
    """As in Energon, a clip that ends after the video holds the frames up to its last one."""
    out = decoder(media_dir, "vp9.mkv").get_clips(video_clip_ranges=ranges, video_unit=unit)
    assert read_indices(out.video_clips[0]) == frames
    assert [tuple(round(float(t), 6) for t in ts) for ts in out.video_timestamps] == stamps


def test_end_within_half_a_frame_is_clamped(media_dir):
    """An end up to half a frame past the video (header rounding) still gives the last frame."""
    clip = decoder(media_dir, "vp9.mkv").get_clips(video_clip_ranges=[(1.9, 2.015)]).video_clips[0]
    assert read_indices(clip) == [47, 48, 49]


@pytest.mark.parametrize(
    "ranges, unit, exc, message",
    [
        ([(-1, 5)], "samples", ValueError, r"audio clip #0 \(-1, 5\) \(samples\): negative start"),
        ([(0.5, 0.25)], "seconds", ValueError, r"start is after end"),
        ([(0.5, 10.5)], "samples", ValueError, r"positions in samples must be whole numbers"),
    ],
)
def test_bad_audio_ranges(media_dir, ranges, unit, exc, message):
    """Audio ranges negative, reversed or fractional in samples raise errors naming key and range."""
    with pytest.raises(exc, match="shard_0/ramp.wav: .*" + message):
        decoder(media_dir, "ramp.wav").get_clips(audio_clip_ranges=ranges, audio_unit=unit)


def test_unknown_units_and_sizes_raise_value_error(media_dir):
    """Unknown units and malformed output sizes are rejected before any decoding."""
    dec = decoder(media_dir, "h264.mp4")
    with pytest.raises(ValueError, match=r"shard_0/h264.mp4: video_unit='pts' is not one of \['seconds', 'frames'\]"):
        dec.get_clips(video_clip_ranges=[(0, 1)], video_unit="pts")
    with pytest.raises(ValueError, match=r"audio_unit='frames' is not one of \['seconds', 'samples'\]"):
        dec.get_clips(audio_clip_ranges=[(0, 1)], audio_unit="frames")
    for size in [(0, 10), (32,), (32.0, 24.0), "32x24", (-1, 5)]:
        with pytest.raises(ValueError, match="video_out_frame_size"):
            dec.get_clips(video_clip_ranges=[(0, 1)], video_out_frame_size=size)


def test_audio_request_on_video_without_audio(media_dir):
    """Asking a silent video for audio raises SampleException naming key and request."""
    dec = decoder(media_dir, "h264.mp4")
    message = r"shard_0/h264.mp4: audio clips \[\(0.0, 1.0\)\] requested, but the media has no audio stream"
    with pytest.raises(SampleException, match=message):
        dec.get_clips(audio_clip_ranges=[(0.0, 1.0)])
    for call in (dec.get_audio, dec.get_video_with_audio, dec.get_audio_samples_per_second):
        with pytest.raises(SampleException, match="has no audio stream"):
            call()
    assert dec.get_audio_duration() is None


def test_video_request_on_audio_file(media_dir):
    """Asking an audio file for video raises SampleException."""
    dec = decoder(media_dir, "ramp.flac")
    message = r"shard_0/ramp.flac: video clips \[\(0, 1\)\] requested, but the media has no video stream"
    with pytest.raises(SampleException, match=message):
        dec.get_clips(video_clip_ranges=[(0, 1)])
    with pytest.raises(SampleException, match="the video fps requested, but the media has no video stream"):
        dec.get_video_fps()


@pytest.mark.parametrize(
    "data, message",
    [(b"", "cannot open media: the file is empty"), (b"\x00garbage" * 50, r"cannot open media \(400 bytes\)")],
)
def test_unreadable_bytes(data, message):
    """Empty or non-media bytes raise SampleException on first use, naming the key."""
    dec = AVDecoder(data, key="s9.mp4")
    with pytest.raises(SampleException, match="s9.mp4: " + message):
        dec.get_video()
    with pytest.raises(SampleException, match="s9.mp4: " + message):
        dec.has_audio_stream()


def test_non_binary_sources_are_rejected():
    """Text streams and non-bytes objects raise ValueError at construction."""
    with pytest.raises(ValueError, match="k: AVDecoder needs a binary stream"):
        AVDecoder(io.StringIO("abc"), key="k")
    with pytest.raises(ValueError, match="k: AVDecoder needs bytes or a binary file object, got int"):
        AVDecoder(42, key="k")


def test_truncated_mkv_reports_its_real_length(media_dir):
    """A cut matroska file decodes the frames it still has and gives no clip for ranges past its new end."""
    raw = (media_dir / "vp9.mkv").read_bytes()
    dec = AVDecoder(raw[: len(raw) // 2], key="cut.mkv")
    _, count = dec.get_video_duration(get_frame_count=True)
    assert 0 < count < N_FRAMES
    assert read_indices(dec.get_clips(video_clip_ranges=[(0, 3)], video_unit="frames").video_clips[0]) == [0, 1, 2, 3]
    assert dec.get_clips(video_clip_ranges=[(45, 49)], video_unit="frames").video_clips == []  # past its end: no clip


def test_truncated_mp4_without_index_cannot_open(media_dir):
    """An mp4 cut before its moov index raises SampleException at the first request."""
    raw = (media_dir / "h264.mp4").read_bytes()
    with pytest.raises(SampleException, match="cut.mp4: cannot open media"):
        AVDecoder(raw[: len(raw) // 2], key="cut.mp4").get_clips(video_clip_ranges=[(0, 1)])


@pytest.mark.parametrize(
    "name", ["h264_bframes.mp4", "vp9.mkv", "mpeg4.avi", "h264_aac.mp4", "ramp.flac", "ramp.wav"]
)
def test_damaged_files_fail_cleanly(media_dir, name):
    """Randomly truncated or byte-flipped files either decode to real tensors or raise SampleException."""
    raw = (media_dir / name).read_bytes()
    rng = random.Random(name)
    for trial in range(16):
        if trial % 2:
            data = raw[: rng.randrange(len(raw))]
        else:
            flipped = bytearray(raw)
            for _ in range(rng.randint(1, 20)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            data = bytes(flipped)
        dec = AVDecoder(data, key=f"bad/{name}", suppress_warnings=True)
        try:
            out = dec.get_frames()
        except SampleException as exc:
            assert str(exc).startswith(f"bad/{name}: ")
            continue
        clips = out.video_clips or out.audio_clips
        assert len(clips) == 1 and clips[0].numel() > 0
        assert clips[0].dtype in (torch.uint8, torch.int16, torch.int32, torch.float32)  # audio: the stored type


def test_truncated_wav_cuts_ranges_at_its_data(media_dir):
    """A cut wav still claims 2 s in its header: a range ending past the remaining samples is cut at
    them (as Energon does); one starting past them gives no clip."""
    raw = (media_dir / "ramp.wav").read_bytes()
    dec = AVDecoder(raw[: 44 + 2 * 8000], key="cut.wav")  # header + 1 s of int16 mono
    assert dec.get_clips(audio_clip_ranges=[(0.25, 0.75)]).audio_clips[0].shape == (1, 4000)
    out = dec.get_clips(audio_clip_ranges=[(0.5, 1.8)])
    n = out.audio_clips[0].shape[1]  # up to the last sample the cut file holds (its header is > 44 bytes)
    assert 3900 < n <= 4000 and out.audio_timestamps == [(0.5, (4000 + n) / 8000)]
    assert dec.get_clips(audio_clip_ranges=[(1.5, 1.8)]).audio_clips == []  # past the samples it holds: no clip


def test_audio_range_before_the_first_sample_says_so(tmp_path):
    """An mp3's first sample comes after its encoder delay (pts > 0). A range that ends before it was
    reported as starting "at or after the end of the audio (0.052245s)"; it now says the range ends
    before the audio starts, naming its first sample. Ranges reaching into the audio are cut at it."""
    import av
    import numpy as np

    if "libmp3lame" not in av.codecs_available:
        pytest.skip("this PyAV has no mp3 encoder")
    rate, path = 22050, tmp_path / "tone.mp3"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libmp3lame", rate=rate)
        stream.layout = "mono"
        samples = (0.3 * np.sin(np.arange(rate // 4) / 7.0)).astype(np.float32)[None]
        frame = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
        frame.sample_rate, frame.pts = rate, 0
        out.mux(stream.encode(frame))
        out.mux(stream.encode())
    dec = AVDecoder(path.read_bytes(), key="s/tone.mp3")
    begins = dec.get_audio().audio_timestamps[0][0]
    first = round(begins * rate)
    assert first > 221
    message = rf"s/tone.mp3: audio range \[0, 221\) \(samples; 0.000000s to 0.010023s\) ends before the audio starts \(its first sample is sample {first}, at {begins:.6f}s\)$"
    with pytest.raises(SampleException, match=message):
        dec.get_clips(audio_clip_ranges=[(0.0, 0.01)])
    out = dec.get_clips(audio_clip_ranges=[(0, first + 10)], audio_unit="samples")
    assert out.audio_clips[0].shape == (1, 10) and out.audio_timestamps == [(begins, (first + 10) / rate)]


def test_audio_ranges_ending_after_the_audio_are_cut_at_its_end(media_dir):
    """As in Energon: (1.0, 2.5) s of a 2 s wav gives its last second, (0, 16010) samples all 16000."""
    dec = decoder(media_dir, "ramp.wav")
    out = dec.get_clips(audio_clip_ranges=[(1.0, 2.5)])
    assert out.audio_clips[0].shape == (1, 8000) and out.audio_timestamps == [(1.0, 2.0)]
    out = dec.get_clips(audio_clip_ranges=[(0, 16010)], audio_unit="samples")
    assert out.audio_clips[0].shape == (1, 16000) and out.audio_timestamps == [(0.0, 2.0)]


def test_audio_end_within_a_millisecond_is_clamped(media_dir):
    """An audio end at most 1 ms past the stream (rounded durations) is cut at the last sample."""
    data = decoder(media_dir, "ramp.wav").get_clips(audio_clip_ranges=[(1.5, 2.0005)])
    assert data.audio_clips[0].shape == (1, 4000) and data.audio_timestamps == [(1.5, 2.0)]


def test_open_options_follow_the_pyav_version_and_open_the_installed_one(media_dir):  # noqa: F811
    """PyAV before 19 needs ``metadata_errors="ignore"`` (else non-UTF-8 tags fail the open); 19 removed
    the argument (a ``TypeError`` that skipped every video). The options chosen for the installed
    PyAV open a real file."""
    import av

    from energon_ray.decode.av._container import _OPEN_OPTIONS, _open_options, open_container

    assert _open_options("18.1.0") == {"metadata_errors": "ignore"}
    assert _open_options("14.0.1") == {"metadata_errors": "ignore"}
    assert _open_options("19.0.2") == {} and _open_options("20.1") == {}
    assert _OPEN_OPTIONS == _open_options(av.__version__)
    name = next(p.name for p in media_dir.iterdir() if p.suffix == ".mp4")
    container = open_container((media_dir / name).read_bytes(), key=f"shard_0/{name}")
    try:
        assert container.streams.video
    finally:
        container.close()
