"""AVDecoder audio clips: sample-exact ranges of ramps, seconds and samples units, lossy tracks vs full decode."""

from __future__ import annotations

import math
import random

import pytest
import torch
from tests.unit.test_av_media import AUDIO_RATE, ramp, ramp_float

from energon_ray.decode.av import AVDecoder, audio_to_float
from energon_ray.decode.av._audio_reader import preroll_samples

TOTAL = 2 * AUDIO_RATE


def ramp_int16(start: int, stop: int, channels: int = 1) -> torch.Tensor:
    """The stored int16 ramp samples ``[start, stop)``, as the decoder returns them."""
    return torch.from_numpy(ramp(start, stop, channels))


def decoder(media_dir, name: str) -> AVDecoder:
    return AVDecoder((media_dir / name).read_bytes(), key=name)


@pytest.mark.parametrize("name, channels", [("ramp.wav", 1), ("ramp_stereo.wav", 2), ("ramp.flac", 1)])
def test_full_audio_is_the_ramp(media_dir, name, channels):
    """get_audio returns the stored int16 (channels, samples) of the ramp, channel order kept."""
    data = decoder(media_dir, name).get_audio()
    assert data.video_clips == [] and len(data.audio_clips) == 1
    clip = data.audio_clips[0]
    assert clip.dtype == torch.int16 and clip.shape == (channels, TOTAL)
    assert torch.equal(clip, ramp_int16(0, TOTAL, channels))
    assert torch.equal(audio_to_float(clip), ramp_float(0, TOTAL, channels))
    assert data.audio_timestamps == [(0.0, 2.0)]


@pytest.mark.parametrize("name, channels", [("ramp.wav", 1), ("ramp_stereo.wav", 2), ("ramp.flac", 1)])
def test_clips_in_seconds_are_sample_exact(media_dir, name, channels):
    """A (start, end) seconds range holds round((end-start)*rate) samples from round(start*rate), exactly."""
    rng = random.Random(3)
    ranges = [tuple(sorted(round(rng.uniform(0, 2), 4) for _ in range(2))) for _ in range(8)]
    ranges = [(a, b) for a, b in ranges if round(b * AUDIO_RATE) > round(a * AUDIO_RATE)] + [(1.5, 2.0)]
    data = decoder(media_dir, name).get_clips(audio_clip_ranges=ranges)
    for (start, end), clip, stamps in zip(ranges, data.audio_clips, data.audio_timestamps):
        first = round(start * AUDIO_RATE)
        stop = first + math.floor((end - start) * AUDIO_RATE + 0.5)
        assert torch.equal(clip, ramp_int16(first, stop, channels)), (start, end)
        assert stamps == (first / AUDIO_RATE, stop / AUDIO_RATE)


@pytest.mark.parametrize("start", [1 / 128, 5 / 128, 1 + 5 / 128])
def test_a_start_half_way_between_samples_rounds_up(media_dir, start):
    """A start exactly half way between two samples begins at the later one, as Energon's does (not half to even)."""
    first = math.floor(start * AUDIO_RATE) + 1  # start * 8000 ends in .5: 62.5, 312.5, 8312.5
    data = decoder(media_dir, "ramp.wav").get_clips(audio_clip_ranges=[(start, start + 0.25)])
    assert torch.equal(data.audio_clips[0], ramp_int16(first, first + 2000))
    assert data.audio_timestamps == [(first / AUDIO_RATE, (first + 2000) / AUDIO_RATE)]


@pytest.mark.parametrize("name", ["ramp.wav", "ramp.flac"])
def test_clips_in_samples_are_half_open(media_dir, name):
    """A (a, b) samples range holds samples a..b-1; +inf runs to the end."""
    ranges = [(0, 1), (123, 4567), (8000, 8001), (15000, math.inf), (4567, 9999)]
    data = decoder(media_dir, name).get_clips(audio_clip_ranges=ranges, audio_unit="samples")
    for (a, b), clip in zip(ranges, data.audio_clips):
        b = TOTAL if b == math.inf else b
        assert torch.equal(clip, ramp_int16(a, b)), (a, b)


def test_lossy_track_clips_equal_the_full_decode(media_dir):
    """AAC clips (decoded after a seek and a pre-roll) equal the same samples of a full decode, and
    every seek lands in time (no decode again from the start: PyAV 19's FFmpeg drops the first frame
    decoded after a seek, which must not count as a miss)."""
    import warnings

    dec = decoder(media_dir, "h264_aac.mp4")
    full = dec.get_audio().audio_clips[0]
    rate = dec.get_audio_samples_per_second()
    ranges = [(0.5, 0.9), (1.0, 1.2), (0.13, 1.77), (0.0, 0.01), (1.9, 2.0)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = dec.get_clips(audio_clip_ranges=ranges)
    assert not [w for w in caught if "seek missed" in str(w.message)]
    for (start, end), clip, stamps in zip(ranges, data.audio_clips, data.audio_timestamps):
        first, stop = round(start * rate), round(end * rate)
        assert stamps == (first / rate, stop / rate)
        assert torch.allclose(clip, full[:, first:stop], atol=1e-6), (start, end)


def _flac_seek_refused(data: bytes, sample: int, rate: int) -> bool:
    """Whether FFmpeg's FLAC demuxer refuses a backward seek to ``sample`` of ``data``."""
    import io
    from fractions import Fraction

    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        try:
            container.seek(int(Fraction(sample, rate) / Fraction(stream.time_base)), stream=stream, backward=True)
        except av.FFmpegError:
            return True
    return False


def test_flac_seek_refused_by_the_demuxer_decodes_from_the_start(tmp_path):
    """FFmpeg's FLAC demuxer refuses (EPERM) some seeks in a short stereo FLAC without seek table;
    a clip there used to fail ("seeking the audio failed: [Errno 1] Operation not permitted"; Energon:
    PermissionError). It is now decoded from the start of the file: the stored samples, with a
    RuntimeWarning saying the seek was refused."""
    import warnings

    from tests.unit.test_av_media import write_audio

    rate = 8000
    data = write_audio(tmp_path / "s.flac", codec="flac", seconds=0.3, channels=2, rate=rate).read_bytes()
    refused = _flac_seek_refused(data, 1300, rate)  # True with PyAV 18's FFmpeg
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clips = AVDecoder(data, key="s.flac").get_clips(
            audio_clip_ranges=[(1300, 1700), (400, 1800), (0, 2400)], audio_unit="samples"
        )
    for (a, b), clip in zip([(1300, 1700), (400, 1800), (0, 2400)], clips.audio_clips):
        assert clip.dtype == torch.int16 and torch.equal(clip, ramp_int16(a, b, 2)), (a, b)
    assert clips.audio_timestamps[0] == (1300 / rate, 1700 / rate)
    assert any("audio seek was refused by the demuxer at sample 1300" in str(w.message) for w in caught) == refused


def test_preroll_only_for_lossy_codecs():
    """PCM and FLAC decode from the seek point; lossy codecs decode a quarter second before it."""
    assert preroll_samples("pcm_s16le", 8000) == 0 and preroll_samples("flac", 44100) == 0
    assert preroll_samples("aac", 16000) == 4000 and preroll_samples("mp3float", 44100) == 11025


def test_audio_metadata(media_dir):
    """Sample rate, duration and stream flags of audio-only files."""
    for name in ("ramp.wav", "ramp.flac"):
        dec = decoder(media_dir, name)
        assert dec.get_audio_samples_per_second() == AUDIO_RATE
        assert dec.get_audio_duration() == pytest.approx(2.0)
        assert dec.has_audio_stream() and not dec.has_video_stream()
        assert dec.get_video_duration() == (None, None)


def test_get_frames_of_audio_file_is_the_audio(media_dir):
    """get_frames on an audio-only file decodes the whole audio."""
    data = decoder(media_dir, "ramp.flac").get_frames()
    assert data.video_clips == [] and torch.equal(data.audio_clips[0], ramp_int16(0, TOTAL))


def test_audio_and_video_clips_in_one_call(media_dir):
    """get_clips decodes video (frames 12..25 are on screen in [0.5, 1.0]) and audio ranges together."""
    data = decoder(media_dir, "h264_aac.mp4").get_clips(
        video_clip_ranges=[(0.5, 1.0)], audio_clip_ranges=[(0.5, 1.0)], audio_unit="seconds"
    )
    assert data.video_clips[0].shape[0] == 14 and data.audio_clips[0].shape == (1, 8000)
    assert data.video_timestamps == [(0.48, 1.04)] and data.audio_timestamps == [(0.5, 1.0)]


@pytest.mark.parametrize("window", [float("nan"), float("inf"), "1", True, 0.00001])
def test_audio_task_encoder_refuses_a_window_that_is_no_finite_length(window):
    """window_seconds nan, inf, "1" or True (before: "cannot convert float NaN to integer", OverflowError,
    TypeError from round) or too short for one sample: a ValueError naming window_seconds and the value."""
    from energon_ray.tasks.audio import AudioTaskEncoder

    with pytest.raises(ValueError, match=r"^AudioTaskEncoder: window_seconds") as raised:
        AudioTaskEncoder(window_seconds=window, sample_rate=8000)
    assert repr(window) in str(raised.value)
