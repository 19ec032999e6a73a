"""AVHandler (the SampleDecoder's audio/video handler) in its three modes, alone and inside SampleDecoder."""

from __future__ import annotations

import re
import av.container
import pytest
import torch
from tests.unit.test_av_media import N_FRAMES, read_indices

from energon_ray.decode.av import AVData, AVDecoder
from energon_ray.decode.av_handler import AUDIO_EXTENSIONS, AV_EXTENSIONS, VIDEO_EXTENSIONS, AVHandler
from energon_ray.decode.sample_decoder import SampleDecoder
from energon_ray.errors import SampleException


def test_extension_lists():
    """Video and audio extensions together make up AV_EXTENSIONS."""
    assert set(AV_EXTENSIONS) == set(VIDEO_EXTENSIONS) | set(AUDIO_EXTENSIONS)
    assert {"mp4", "mkv", "avi", "mov", "webm"} <= set(VIDEO_EXTENSIONS)
    assert {"wav", "flac", "mp3", "ogg"} <= set(AUDIO_EXTENSIONS)


@pytest.mark.parametrize("key", ["txt", ".json", "image.jpg", "mp4.txt", "video.mp4.bak"])
def test_other_parts_are_left_to_other_handlers(key):
    """Parts whose last extension is not audio/video give None."""
    assert AVHandler()(key, b"whatever") is None


@pytest.mark.parametrize("key", ["mp4", ".mp4", "video.mp4", "clip.VIDEO.MP4"])
def test_avdecoder_mode_is_lazy(media_dir, key):
    """The default mode returns an AVDecoder over the bytes, named after the part; nothing decoded yet."""
    raw = (media_dir / "h264.mp4").read_bytes()
    out = AVHandler()(key, raw)
    assert isinstance(out, AVDecoder) and out.key == key.lstrip(".") and out.data == raw
    lazy = AVHandler()(key, b"not a video at all")  # garbage only fails once decoded
    with pytest.raises(SampleException, match=f"(^|[^.]){re.escape(key.lstrip('.'))}: cannot open media"):
        lazy.get_video()


def test_torch_mode_decodes_video_without_audio(media_dir):
    """'torch' returns an AVData of every frame; the audio track only with video_decode_audio."""
    raw = (media_dir / "h264_aac.mp4").read_bytes()
    out = AVHandler(av_decode="torch")("sample.mp4", raw)
    assert isinstance(out, AVData) and out.audio_clips == []
    assert read_indices(out.video_clips[0]) == list(range(N_FRAMES))
    both = AVHandler(av_decode="torch", video_decode_audio=True)("sample.mp4", raw)
    assert both.audio_clips[0].dtype == torch.float32 and both.audio_clips[0].shape[0] == 1


def test_torch_mode_decodes_audio_files(media_dir):
    """'torch' on a wav part returns its samples."""
    out = AVHandler(av_decode="torch", video_decode_audio=True)("a.wav", (media_dir / "ramp.wav").read_bytes())
    assert out.video_clips == [] and out.audio_clips[0].shape == (1, 16000)


def test_torch_mode_raises_on_bad_media():
    """'torch' on undecodable bytes raises a SampleException naming the part."""
    with pytest.raises(SampleException, match="broken.mp4: cannot open media"):
        AVHandler(av_decode="torch")("broken.mp4", b"\x00" * 100)


def test_pyav_mode_returns_an_open_container(media_dir):
    """'pyav' returns the opened input container for advanced use."""
    container = AVHandler(av_decode="pyav")("x.mkv", (media_dir / "vp9.mkv").read_bytes())
    try:
        assert isinstance(container, av.container.InputContainer)
        assert sum(1 for _ in container.decode(video=0)) == N_FRAMES
    finally:
        container.close()


def test_unknown_mode_is_rejected():
    """An unknown av_decode raises ValueError listing the choices."""
    with pytest.raises(ValueError, match="av_decode='tensor' is not one of"):
        AVHandler(av_decode="tensor")


def test_sample_decoder_uses_the_handler(media_dir):
    """SampleDecoder decodes .mp4 parts with the AV handler and leaves the rest to webdataset's handlers."""
    raw = (media_dir / "h264.mp4").read_bytes()
    sample = {"__key__": "s0", "mp4": raw, "txt": b"a caption"}
    lazy = SampleDecoder()(sample)
    assert isinstance(lazy["mp4"], AVDecoder) and lazy["txt"] == "a caption"
    eager = SampleDecoder(av_decode="torch")(sample)
    assert eager["mp4"].video_clips[0].shape[0] == N_FRAMES


def test_sample_decoder_guesses_content(media_dir):
    """With guess_content, an AV part without a usable extension is sniffed and decoded."""
    out = SampleDecoder(guess_content=True).decode_part("payload.bin", (media_dir / "vp9.mkv").read_bytes())
    assert isinstance(out, AVDecoder) and out.key == "mkv"
