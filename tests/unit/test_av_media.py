"""Generated media for the AV tests: video frames and audio samples that carry their own position.

The other ``test_av_*`` modules import the writers and readers from here (and use the files through
the ``media_dir`` fixture of ``conftest.py``); the tests in this module only check that the generated
files have the structure the decoder tests rely on (B-frames, irregular keyframes, readable frame
numbers).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import av
import numpy as np
import torch
from av.video.frame import PictureType

FPS = 25
WIDTH, HEIGHT = 64, 48
N_FRAMES = 50  # 2 s
BITS = 8  # frame numbers up to 255
AUDIO_RATE = 8000
RAMP_PERIOD = 20000

#: name -> how to write it. Each video has N_FRAMES frames at FPS.
VIDEO_SPECS: Dict[str, dict] = {
    "h264.mp4": dict(codec="libx264", gop=10, options={"sc_threshold": "0", "bf": "0"}),
    "h264_bframes.mp4": dict(codec="libx264", gop=16, bframes=3, options={"sc_threshold": "0", "bf": "3"}),
    "h264_bframes.mkv": dict(codec="libx264", gop=12, bframes=2, options={"sc_threshold": "0", "bf": "2"}),
    "h264_vargop.mp4": dict(
        codec="libx264",
        gop=1000,
        keyframes=(0, 3, 17, 18, 40, 41),
        options={"sc_threshold": "0", "bf": "0", "forced-idr": "1"},
    ),
    "mpeg4.avi": dict(codec="mpeg4", gop=12, options={"sc_threshold": "1000000000"}),
    "vp9.mkv": dict(codec="libvpx-vp9", gop=15, options={"deadline": "realtime", "cpu-used": "8"}),
    "h264_aac.mp4": dict(codec="libx264", gop=10, options={"sc_threshold": "0", "bf": "0"}, audio=True),
}
VIDEO_NAMES = list(VIDEO_SPECS)


def index_image(i: int, width: int = WIDTH, height: int = HEIGHT) -> np.ndarray:
    """An RGB ``(height, width, 3)`` frame showing ``i`` as BITS black/white blocks over a fixed texture."""
    yy, xx = np.mgrid[0:height, 0:width]
    img = np.repeat(((xx * 3 + yy * 2) % 160 + 40).astype(np.uint8)[..., None], 3, axis=2)
    block_w, block_h = width // BITS, height // 3
    for bit in range(BITS):
        img[:block_h, bit * block_w : (bit + 1) * block_w] = 235 if (i >> bit) & 1 else 16
    return img


def read_index(frame: torch.Tensor) -> int:
    """The frame number drawn by :func:`index_image` in a ``(3, height, width)`` frame of any size."""
    _, height, width = frame.shape
    block_w, block_h = width / BITS, height / 3
    rows = slice(int(block_h * 0.25), max(int(block_h * 0.75), int(block_h * 0.25) + 1))
    value = 0
    for bit in range(BITS):
        cols = slice(int((bit + 0.25) * block_w), max(int((bit + 0.75) * block_w), int((bit + 0.25) * block_w) + 1))
        if frame[:, rows, cols].float().mean() > 128:
            value |= 1 << bit
    return value


def read_indices(clip: torch.Tensor) -> List[int]:
    """Frame numbers of every frame of a ``(frames, 3, height, width)`` clip."""
    return [read_index(f) for f in clip]


def write_video(
    path: Path,
    *,
    codec: str,
    gop: int,
    bframes: int = 0,
    keyframes: Iterable[int] = (),
    options: Optional[Dict[str, str]] = None,
    audio: bool = False,
    n_frames: int = N_FRAMES,
    first_pts: int = 0,
) -> Path:
    """Encode ``n_frames`` numbered frames (plus an AAC tone if ``audio``) into ``path``; the first
    is shown at ``first_pts`` frame durations (a stream that starts after 0)."""
    forced = set(keyframes)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=FPS, options=dict(options or {}))
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.codec_context.gop_size = gop
        stream.codec_context.max_b_frames = bframes
        sound = _add_tone(out) if audio else None
        for i in range(n_frames):
            frame = av.VideoFrame.from_ndarray(index_image(i), format="rgb24")
            frame.pts = first_pts + i
            if i in forced:
                frame.pict_type = PictureType.I
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
        if sound is not None:
            _write_tone(out, sound, n_frames / FPS)
    return path


def _add_tone(out: "av.container.OutputContainer"):
    stream = out.add_stream("aac", rate=16000)
    stream.layout = "mono"
    return stream


def _write_tone(out, stream, seconds: float) -> None:
    rate, total, chunk = 16000, int(16000 * seconds), 1024
    for start in range(0, total, chunk):
        t = np.arange(start, min(start + chunk, total)) / rate
        samples = (0.4 * np.sin(2 * np.pi * 440 * t) * (1 + t)).astype(np.float32)[None]
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate, frame.pts = rate, start
        out.mux(stream.encode(frame))
    out.mux(stream.encode())


def ramp(start: int, stop: int, channels: int = 1) -> np.ndarray:
    """int16 ramp samples ``[start, stop)``: channel 0 counts up, channel 1 counts down."""
    up = (np.arange(start, stop) % RAMP_PERIOD).astype(np.int16)
    return np.stack([up if c == 0 else -up for c in range(channels)])


def ramp_float(start: int, stop: int, channels: int = 1) -> torch.Tensor:
    """:func:`ramp` as float32 in [-1, 1] (what ``audio_to_float`` makes of the decoded int16)."""
    return torch.from_numpy(ramp(start, stop, channels).astype(np.float32) / 32768)


def write_audio(path: Path, *, codec: str, seconds: float = 2.0, channels: int = 1, rate: int = AUDIO_RATE) -> Path:
    """Encode a :func:`ramp` of ``seconds`` into ``path`` (wav: pcm_s16le, flac: flac)."""
    layout = "mono" if channels == 1 else "stereo"
    total, chunk = int(rate * seconds), 1000
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout, stream.format = layout, "s16"
        for start in range(0, total, chunk):
            packed = ramp(start, min(start + chunk, total), channels).T.reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(packed), format="s16", layout=layout)
            frame.sample_rate, frame.pts = rate, start
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return path


def reference_video(path: Path) -> Tuple[torch.Tensor, List[Fraction], List[Fraction]]:
    """A plain PyAV full decode: frames ``(n, 3, H, W)``, each frame's start and end time in seconds."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        tb = Fraction(stream.time_base)  # inside: PyAV 19 refuses a closed container's stream attributes
    starts = [f.pts * tb for f in frames]
    ends = [f.pts * tb + f.duration * tb for f in frames]
    rgb = np.stack([f.to_ndarray(format="rgb24") for f in frames]).transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(rgb)), starts, ends


def expected_span(starts: List[Fraction], start: float, end: float) -> Tuple[int, int]:
    """Frames shown during ``[start, end]`` seconds: the frame on screen at ``start`` .. at ``end``.

    Positions are read as the decimals they print as (0.12 s is 3/25 s, not the float below it).
    """
    start, end = Fraction(str(start)), Fraction(str(end))
    first = max([i for i, s in enumerate(starts) if s <= start], default=0)
    last = max([i for i, s in enumerate(starts) if s <= end], default=0)
    return first, max(first, last)


def write_media_files(root: Path) -> Path:
    """Every generated file (``VIDEO_SPECS`` and the audio ramps) under ``root``: the ``media_dir``
    fixture of ``tests/unit/conftest.py``, written once per test session."""
    for name, spec in VIDEO_SPECS.items():
        write_video(root / name, **spec)
    write_audio(root / "ramp.wav", codec="pcm_s16le")
    write_audio(root / "ramp_stereo.wav", codec="pcm_s16le", channels=2)
    write_audio(root / "ramp.flac", codec="flac")
    return root


def _packets(path: Path) -> List[Tuple[int, int, bool]]:
    with av.open(str(path)) as container:
        return [(p.pts, p.dts, p.is_keyframe) for p in container.demux(video=0) if p.size]


def test_every_frame_carries_its_number(media_dir):
    """A full decode of each generated video reads back 0..N-1 from the pixels."""
    for name in VIDEO_NAMES:
        frames, _, _ = reference_video(media_dir / name)
        assert read_indices(frames) == list(range(N_FRAMES)), name


def test_bframe_files_reorder_frames(media_dir):
    """The B-frame fixtures decode in a different order than they are shown (pts != dts)."""
    for name in ("h264_bframes.mp4", "h264_bframes.mkv"):
        assert any(pts != dts for pts, dts, _ in _packets(media_dir / name) if dts is not None), name


def test_variable_gop_keyframes_are_where_forced(media_dir):
    """The variable-GOP fixture has keyframes exactly at the forced frames."""
    packets = sorted(_packets(media_dir / "h264_vargop.mp4"))
    assert [i for i, (_, _, key) in enumerate(packets) if key] == list(VIDEO_SPECS["h264_vargop.mp4"]["keyframes"])


def test_audio_fixtures_hold_the_ramp(media_dir):
    """A plain PyAV decode of the wav fixture returns the ramp sample for sample."""
    with av.open(str(media_dir / "ramp.wav")) as container:
        samples = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=1)
    np.testing.assert_array_equal(samples, ramp(0, 2 * AUDIO_RATE))
