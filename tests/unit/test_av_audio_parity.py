"""AVDecoder audio against megatron.energon.av.AVDecoder on the same WAV/FLAC bytes: dtype, values, clip shapes."""

from __future__ import annotations

import io

import pytest
import torch
from megatron.energon.av import AVDecoder as EnergonDecoder
from megatron.energon.av import get_clips_uniform as energon_clips_uniform
from tests.unit.test_av_media import write_audio

from energon_ray.decode.av import AVDecoder, audio_to_float, get_clips_uniform
from energon_ray.decode.sample_decoder import SampleDecoder

pytestmark = pytest.mark.parity

#: (file name, codec, channels, rate): 16-bit PCM and FLAC, mono and stereo, rates with awkward roundings.
FILES = [
    ("stereo16k.wav", "pcm_s16le", 2, 16000),
    ("mono44k.wav", "pcm_s16le", 1, 44100),
    ("mono16k.flac", "flac", 1, 16000),
    ("stereo22k.flac", "flac", 2, 22050),
]
#: (num_clips, clip_duration_seconds): the odd duration is the one of Energon's same-shape WAV test.
UNIFORM = [(10, 0.9954783485892385), (5, 3.0), (7, 1.23456), (4, 0.3337)]


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("av_parity")
    return {
        name: write_audio(root / name, codec=codec, seconds=10.3, channels=channels, rate=rate).read_bytes()
        for name, codec, channels, rate in FILES
    }


@pytest.mark.parametrize("name", [f[0] for f in FILES])
def test_get_audio_is_energons_int16(media, name):
    """get_audio returns Energon's tensor exactly: int16, same shape, same samples."""
    ours = AVDecoder(media[name], key=name).get_audio().audio_clips[0]
    theirs = EnergonDecoder(io.BytesIO(media[name])).get_audio().audio_clips[0]
    assert ours.dtype == theirs.dtype == torch.int16
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("name", [f[0] for f in FILES])
@pytest.mark.parametrize("num_clips, duration", UNIFORM)
def test_uniform_audio_clips_are_energons(media, name, num_clips, duration):
    """Uniform audio clips have one shape (round(duration * rate) samples) and Energon's samples."""
    dec = AVDecoder(media[name], key=name)
    ours = get_clips_uniform(dec, duration, num_clips, request_audio=True).audio_clips
    theirs = energon_clips_uniform(
        EnergonDecoder(io.BytesIO(media[name])), duration, num_clips, request_audio=True
    ).audio_clips
    rate = dec.get_audio_samples_per_second()
    assert len(ours) == len(theirs) == num_clips
    assert {tuple(c.shape[1:]) for c in ours} == {(int(duration * rate + 0.5),)}
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == b.dtype and torch.equal(a, b), i


def test_sample_decoder_audio_part_is_int16(media):
    """SampleDecoder(av_decode='torch') decodes a .wav part to Energon's int16 samples."""
    decoded = SampleDecoder(av_decode="torch", video_decode_audio=True)(
        {"__key__": "s0", "wav": media["stereo16k.wav"]}
    )
    theirs = EnergonDecoder(io.BytesIO(media["stereo16k.wav"])).get_audio().audio_clips[0]
    assert torch.equal(decoded["wav"].audio_clips[0], theirs)


def test_audio_to_float_scales_each_sample_type():
    """audio_to_float maps int16, int32, uint8 and float clips to float32 in [-1, 1]."""
    assert audio_to_float(torch.tensor([[-32768, 16384]], dtype=torch.int16)).tolist() == [[-1.0, 0.5]]
    assert audio_to_float(torch.tensor([[-(2**31), 2**30]], dtype=torch.int32)).tolist() == [[-1.0, 0.5]]
    assert audio_to_float(torch.tensor([[0, 192]], dtype=torch.uint8)).tolist() == [[-1.0, 0.5]]
    floats = torch.tensor([[0.25, -0.5]], dtype=torch.float64)
    assert audio_to_float(floats).dtype == torch.float32 and audio_to_float(floats).tolist() == [[0.25, -0.5]]
    with pytest.raises(TypeError, match="torch.bool"):
        audio_to_float(torch.zeros(1, 2, dtype=torch.bool))


@pytest.mark.parametrize("name", [f[0] for f in FILES])
@pytest.mark.parametrize("ranges, unit", [([(1.0, 1.0), (0.5, 0.5 + 1e-7), (2.0, 2.5)], "seconds"), ([(800, 800), (0, 16)], "samples")])
def test_empty_audio_ranges_give_empty_clips_as_energons(media, name, ranges, unit):
    """An empty range (or one shorter than half a sample) is an empty clip of the stream's channels
    and type starting where the range starts, beside the other clips, as Energon's from WAV (from
    FLAC Energon's holds the codec frame there)."""
    ours_clips, ours_stamps = AVDecoder(media[name], key=name).get_audio_clips(ranges, audio_unit=unit)
    theirs = EnergonDecoder(io.BytesIO(media[name])).get_clips(audio_clip_ranges=ranges, audio_unit=unit)
    channels = dict((f[0], f[2]) for f in FILES)[name]
    assert [tuple(c.shape) for c in ours_clips][:-1] == [(channels, 0)] * (len(ranges) - 1)
    if name.endswith(".flac"):
        assert all(c.shape[1] > 0 for c in theirs.audio_clips[:-1])  # Energon's: the samples of the codec frame there
        ours_clips, ours_stamps, theirs.audio_clips = ours_clips[-1:], ours_stamps[-1:], theirs.audio_clips[-1:]
        theirs.audio_timestamps = theirs.audio_timestamps[-1:]
    assert [c.shape for c in ours_clips] == [c.shape for c in theirs.audio_clips]
    assert all(c.dtype == torch.int16 for c in ours_clips)
    assert all(torch.equal(a, b) for a, b in zip(ours_clips, theirs.audio_clips))
    assert [s[0] for s in ours_stamps] == pytest.approx([float(s[0]) for s in theirs.audio_timestamps], abs=1e-4)
    assert all(s[0] == s[1] for s in ours_stamps[:-1])
