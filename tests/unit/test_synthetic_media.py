"""Synthetic video and audio datasets: real mp4/wav files that decode to what was drawn, prepared once."""

from __future__ import annotations

import io

import av
import numpy as np
import yaml

from energon_ray.synthetic_media import (
    audio_samples,
    encode_video,
    synthetic_audio,
    synthetic_video_qa,
    tone,
    video_frames,
    video_qa_samples,
)


def test_video_decodes_to_the_moving_shape():
    """20 frames of 64x48; the white shape starts at the left edge and ends at the right one."""
    drawn = video_frames(3, 20, (64, 48))
    with av.open(io.BytesIO(encode_video(drawn))) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert frames.shape == (20, 48, 64, 3)
    assert np.abs(frames.astype(int) - drawn.astype(int)).mean() < 4  # lossy H.264, but close
    white = [np.nonzero(frames[t, 24].min(axis=-1) > 230)[0] for t in (0, 19)]  # the middle row
    assert white[0].min() <= 1 and white[1].max() >= 62


def test_video_qa_samples_hold_question_and_answers():
    """Keys video_0000..; the json names the shape (disc for odd indices)."""
    samples = video_qa_samples(2, num_frames=4, size=(32, 24))
    assert [key for key, _ in samples] == ["video_0000", "video_0001"]
    assert b'"answers": ["a white disc", "nothing"]' in samples[1][1]["json"]


def test_wav_holds_the_tone_sample_exact():
    """8000 16-bit samples at 8 kHz equal the float tone to within one quantisation step."""
    key, parts = audio_samples(2, seconds=1.0, rate=8000)[1]
    with av.open(io.BytesIO(parts["wav"])) as container:
        rate = container.streams.audio[0].rate
        pcm = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=-1)[0]
    assert key == "audio_0001" and parts["txt"] == b"tone 330 Hz" and rate == 8000 and pcm.shape == (8000,)
    assert np.abs(pcm / 32767 - tone(1, 1.0, 8000)).max() <= 1 / 32767


def test_datasets_are_prepared_once(tmp_path):
    """VidQASample and CrudeWebdataset datasets get their .nv-meta; a second call rewrites nothing."""
    video = synthetic_video_qa(tmp_path / "video", 3, samples_per_shard=2, num_frames=4, size=(32, 24))
    audio = synthetic_audio(tmp_path / "audio", 3, seconds=0.25)
    spec = yaml.safe_load((video / ".nv-meta" / "dataset.yaml").read_text())
    assert spec["sample_type"]["__class__"] == "VidQASample" and spec["field_map"]["video"] == "mp4"
    assert yaml.safe_load((audio / ".nv-meta" / "dataset.yaml").read_text())["__class__"] == "CrudeWebdataset"
    shards = sorted(p.name for p in (video / "shards").glob("*.tar"))
    before = {p: p.stat().st_mtime_ns for p in (video / "shards").iterdir()}
    assert synthetic_video_qa(video, 3, samples_per_shard=2, num_frames=4, size=(32, 24)) == video and shards == ["shard_0000.tar", "shard_0001.tar"]
    assert {p: p.stat().st_mtime_ns for p in (video / "shards").iterdir()} == before


def test_captioning_shards_written_in_processes_are_the_same_bytes(tmp_path):
    """``processes=2`` (the benchmarks' fast path) writes the same shards, byte for byte, as one process."""
    from energon_ray.synthetic import write_captioning_dataset

    one = write_captioning_dataset(tmp_path / "one", 23, 10, image_size=(16, 12))
    two = write_captioning_dataset(tmp_path / "two", 23, 10, image_size=(16, 12), processes=2)
    assert [p.name for p in one] == [p.name for p in two] == ["shard_0000.tar", "shard_0001.tar", "shard_0002.tar"]
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in two]
