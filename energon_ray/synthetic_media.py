"""Small synthetic video and audio datasets: real mp4 (H.264) and wav files made with PyAV.

The companions of :mod:`energon_ray.synthetic` for the video QA and audio tasks, used by the
notebooks and tests: every sample's picture and sound depend on its index, so what a loader returns
can be told apart by eye and by value. ``synthetic_video_qa`` and ``synthetic_audio`` write and
prepare a dataset once (like :func:`energon_ray.tasks.run.synthetic_captioning`).

Example:
    >>> import tempfile
    >>> root = synthetic_audio(tempfile.mkdtemp() + "/audio", 3, seconds=0.25)  # doctest: +SKIP
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from energon_ray.synthetic import write_shards, write_synthetic_dataset

#: Field map of the video QA datasets written here (a ``VidQASample`` per mp4 + json pair).
VIDEO_QA_FIELDS = {"video": "mp4", "context": "json[question]", "answers": "json[answers]"}
_SHAPES = ("square", "disc")


def video_frames(index: int, num_frames: int, size: Tuple[int, int] = (64, 48)) -> np.ndarray:
    """uint8 ``(frames, height, width, 3)``: a white shape moving left to right over a coloured gradient.

    The background colour depends on ``index``, the shape (square or disc) on its parity, and the
    shape's position on the frame number.

    Example:
        >>> video_frames(0, 4, (32, 24)).shape
        (4, 24, 32, 3)
    """
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.array([(index * 67) % 200 + 30, (index * 131) % 200 + 30, (index * 29) % 200 + 30], np.float32)
    background = base[None, None, :] * (0.6 + 0.4 * yy[..., None] / max(height - 1, 1))
    radius = max(2, min(width, height) // 5)
    frames = np.empty((num_frames, height, width, 3), np.uint8)
    for t in range(num_frames):
        cx = radius + (width - 2 * radius) * t / max(num_frames - 1, 1)
        cy = height / 2
        if _SHAPES[index % 2] == "disc":
            inside = (xx - cx) ** 2 + (yy - cy) ** 2 <= radius**2
        else:
            inside = (abs(xx - cx) <= radius) & (abs(yy - cy) <= radius)
        frame = background.copy()
        frame[inside] = 255
        frames[t] = frame.astype(np.uint8)
    return frames


def encode_video(frames: np.ndarray, fps: int = 10, gop: int = 5) -> bytes:
    """H.264 mp4 bytes of uint8 ``(frames, height, width, 3)`` frames (even sides), no B-frames."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps, options={"sc_threshold": "0", "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.codec_context.gop_size = gop
        for t, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts = t
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buffer.getvalue()


def tone(index: int, seconds: float, rate: int) -> np.ndarray:
    """float32 mono samples in [-1, 1]: a sine of ``220 * (1 + index % 4 / 2)`` Hz under a decaying envelope."""
    t = np.arange(int(round(seconds * rate)), dtype=np.float64) / rate
    frequency = 220.0 * (1 + (index % 4) / 2)
    envelope = 0.8 * np.exp(-2.0 * t / max(seconds, 1e-9))
    return (envelope * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def encode_wav(samples: np.ndarray, rate: int) -> bytes:
    """16-bit PCM wav bytes of float mono samples in [-1, 1]."""
    import av

    pcm = np.clip(np.rint(samples * 32767), -32768, 32767).astype(np.int16)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=rate)
        stream.layout, stream.format = "mono", "s16"
        for start in range(0, len(pcm), 1024):
            frame = av.AudioFrame.from_ndarray(pcm[None, start : start + 1024], format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buffer.getvalue()


def video_qa_samples(
    num_samples: int, num_frames: int = 20, size: Tuple[int, int] = (64, 48), fps: int = 10
) -> List[Tuple[str, Dict[str, bytes]]]:
    """``(key, {"mp4", "json"})`` samples: a video, a question about its shape, two answers."""
    out = []
    for i in range(num_samples):
        shape = _SHAPES[i % 2]
        meta = {"question": f"What moves across video {i}?", "answers": [f"a white {shape}", "nothing"]}
        parts = {"mp4": encode_video(video_frames(i, num_frames, size), fps), "json": json.dumps(meta).encode()}
        out.append((f"video_{i:04d}", parts))
    return out


def audio_samples(num_samples: int, seconds: float = 1.0, rate: int = 8000) -> List[Tuple[str, Dict[str, bytes]]]:
    """``(key, {"wav", "txt"})`` samples: a decaying tone and its frequency as the label."""
    out = []
    for i in range(num_samples):
        label = f"tone {220 * (1 + (i % 4) / 2):g} Hz"
        out.append((f"audio_{i:04d}", {"wav": encode_wav(tone(i, seconds, rate), rate), "txt": label.encode()}))
    return out


def synthetic_video_qa(
    root: Path | str, num_samples: int, samples_per_shard: int = 4, num_frames: int = 20, size: Tuple[int, int] = (64, 48)
) -> Path:
    """Write (once, into a new or empty folder) and prepare a ``VidQASample`` dataset of mp4 videos
    under ``root`` (all in ``train``)."""
    return write_synthetic_dataset(
        root, lambda folder: write_shards(folder / "shards", video_qa_samples(num_samples, num_frames, size), samples_per_shard),
        recipe=dict(num_samples=num_samples, samples_per_shard=samples_per_shard, num_frames=num_frames, size=size),
        split_ratio=(1, 0, 0), sample_type="VidQASample", field_map=VIDEO_QA_FIELDS, progress=False,
    )  # fmt: skip


def synthetic_audio(
    root: Path | str, num_samples: int, samples_per_shard: int = 4, seconds: float = 1.0, rate: int = 8000
) -> Path:
    """Write (once, into a new or empty folder) and prepare a crude dataset of wav + txt samples
    under ``root`` (all in ``train``)."""
    return write_synthetic_dataset(
        root, lambda folder: write_shards(folder / "shards", audio_samples(num_samples, seconds, rate), samples_per_shard),
        recipe=dict(num_samples=num_samples, samples_per_shard=samples_per_shard, seconds=seconds, rate=rate),
        split_ratio=(1, 0, 0), sample_type="CrudeWebdataset", progress=False,
    )  # fmt: skip
