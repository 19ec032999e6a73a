"""Video QA and audio datasets end to end on Ray: clips decoded in encode_sample, frame- and sample-exact."""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import av
import numpy as np
import pytest
import torch
from tests.unit.test_av_media import (
    FPS,
    expected_span,
    ramp_float,
    read_indices,
    reference_video,
    write_audio,
    write_video,
)

import energon_ray as er
from energon_ray.decode.av import AVData, AVDecoder
from energon_ray.format.prepare import prepare_dataset
from energon_ray.synthetic import write_shards
from energon_ray.tasks.audio import AudioTaskEncoder
from energon_ray.tasks.tokenizer import HashTokenizer
from energon_ray.tasks.video_qa import VideoQATaskEncoder

#: Frames of each video (1.0 s to 2.0 s at FPS); odd videos have B-frames.
VIDEO_FRAMES = (25, 30, 35, 40, 45, 50)
VIDEO_KEYS = [f"vid_{i:03d}" for i in range(len(VIDEO_FRAMES))]
VIDEO_FIELDS = {"video": "mp4", "context": "json[question]", "answers": "json[answers]"}
#: Seconds of each wav ramp; the last is shorter than the window.
AUDIO_SECONDS = (1.0, 1.0, 1.0, 1.0, 1.0, 0.2)
AUDIO_KEYS = [f"aud_{i:03d}" for i in range(len(AUDIO_SECONDS))]
AUDIO_RATE = 8000
FRAME_SIZE = (32, 24)
CORRUPT = 3
ONE_STREAM = er.WorkerConfig(rank=0, world_size=1, num_workers=1)


def _question(i: int) -> str:
    return f"Which number is shown in video {i}?"


def _answers(i: int) -> List[str]:
    return [f"number {i}", f"maybe {i + 10}"]


def _write_videos(media: Path) -> Dict[str, Path]:
    files = {}
    for i, (key, frames) in enumerate(zip(VIDEO_KEYS, VIDEO_FRAMES)):
        bframes = 2 if i % 2 else 0
        files[key] = write_video(
            media / f"{key}.mp4",
            codec="libx264",
            gop=10,
            bframes=bframes,
            options={"sc_threshold": "0", "bf": str(bframes)},
            n_frames=frames,
        )
    return files


def _video_dataset(
    root: Path, files: Dict[str, Path], corrupt: Optional[int] = None, metas: Optional[Dict[int, dict]] = None
) -> Path:
    samples = []
    for i, key in enumerate(VIDEO_KEYS):
        data = files[key].read_bytes()
        if i == corrupt:
            data = data[: len(data) // 2]  # mp4's index (moov) is written last: half a file cannot be opened
        meta = json.dumps((metas or {}).get(i, {"question": _question(i), "answers": _answers(i)})).encode()
        samples.append((key, {"mp4": data, "json": meta}))
    write_shards(root / "shards", samples, 4)
    prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="VidQASample", field_map=VIDEO_FIELDS, progress=False)
    return root


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Tuple[Path, Dict[str, Path]]:
    """The VidQASample dataset and the mp4 files it holds."""
    root = tmp_path_factory.mktemp("av_pipeline")
    (root / "media").mkdir()
    files = _write_videos(root / "media")
    return _video_dataset(root / "vidqa", files), files


@pytest.fixture(scope="module")
def corrupt_videos(tmp_path_factory, videos) -> Path:
    """The same dataset with sample CORRUPT's mp4 cut in half."""
    return _video_dataset(tmp_path_factory.mktemp("av_pipeline_corrupt"), videos[1], corrupt=CORRUPT)


@pytest.fixture(scope="module")
def bad_text_videos(tmp_path_factory, videos) -> Path:
    """The same dataset with sample 1's answers a string and sample 4's question null."""
    metas = {1: {"question": _question(1), "answers": "yes"}, 4: {"question": None, "answers": _answers(4)}}
    return _video_dataset(tmp_path_factory.mktemp("av_pipeline_bad_text"), videos[1], metas=metas)


@pytest.fixture(scope="module")
def audio_ds(tmp_path_factory) -> Path:
    """Crude wav + txt samples: int16 ramps whose sample values are their positions."""
    root = tmp_path_factory.mktemp("av_pipeline_audio")
    (root / "media").mkdir()
    samples = []
    for i, (key, seconds) in enumerate(zip(AUDIO_KEYS, AUDIO_SECONDS)):
        path = write_audio(root / "media" / f"{key}.wav", codec="pcm_s16le", seconds=seconds, rate=AUDIO_RATE)
        samples.append((key, {"wav": path.read_bytes(), "txt": f"label {i}".encode()}))
    write_shards(root / "ds" / "shards", samples, 3)
    prepare_dataset(root / "ds", split_ratio=(1, 0, 0), sample_type="CrudeWebdataset", progress=False)
    return root / "ds"


def _val(path: Path, task_encoder, batch_size: Optional[int] = 2, **kwargs):
    dataset = er.get_val_dataset(
        path, split_part="train", worker_config=ONE_STREAM, batch_size=batch_size, task_encoder=task_encoder, **kwargs
    )
    return er.get_loader(dataset)


def _picked(first: int, last: int, count: int) -> List[int]:
    """VideoQATaskEncoder's frames of a clip spanning frames first..last: the middle of count equal parts."""
    length = last - first + 1
    return [first + ((2 * j + 1) * length) // (2 * count) for j in range(count)]


def _expected_clip_frames(path: Path, num_clips: int, clip_seconds: float, per_clip: int) -> List[int]:
    """Frame numbers the clips encoder must return, from a full decode's timestamps."""
    _, starts, ends = reference_video(path)
    duration = float(ends[-1])
    out = []
    for begin in np.linspace(0, duration - clip_seconds, num_clips):
        begin = round(float(begin), 9)  # the decimal linspace means (the decoder snaps float noise too)
        first, last = expected_span(starts, begin, round(begin + clip_seconds, 9))
        out += _picked(first, last, per_clip)
    return out


def _expected_single_frames(path: Path, num_frames: int) -> List[int]:
    """Frame numbers of get_single_frames_uniform: frames shown at linspace(half a frame, end - half a frame)."""
    _, starts, ends = reference_video(path)
    half = 0.5 / FPS
    times = np.linspace(half, float(ends[-1]) - half, num_frames)
    return [expected_span(starts, round(float(t), 9), round(float(t), 9))[0] for t in times]


@pytest.mark.parametrize("mode", ["clips", "frames_normalized"])
def test_video_qa_batches_hold_the_exact_frames(videos, mode):
    """Val batches have the planned keys, fixed shapes, tokenized QA, and frames equal to a full decode's."""
    path, files = videos
    if mode == "clips":
        encoder = VideoQATaskEncoder(num_clips=2, clip_duration_seconds=0.4, frames_per_clip=3, frame_size=FRAME_SIZE)
        expected = {k: _expected_clip_frames(files[k], 2, 0.4, 3) for k in VIDEO_KEYS}
    else:
        encoder = VideoQATaskEncoder(num_frames=5, frame_size=FRAME_SIZE, normalize=True)
        expected = {k: _expected_single_frames(files[k], 5) for k in VIDEO_KEYS}
    batches = list(_val(path, encoder))
    assert [b.__key__ for b in batches] == [VIDEO_KEYS[0:2], VIDEO_KEYS[2:4], VIDEO_KEYS[4:6]]
    tokenizer = HashTokenizer()
    for batch in batches:
        frames = batch.frames
        assert frames.shape == (2, 6 if mode == "clips" else 5, 3, FRAME_SIZE[1], FRAME_SIZE[0])
        if mode == "clips":
            assert frames.dtype == torch.uint8
        else:
            assert frames.dtype == torch.float32 and 0 <= frames.min() and frames.max() <= 1
            frames = (frames * 255).round().to(torch.uint8)
        for key, clip in zip(batch.__key__, frames):
            assert read_indices(clip) == expected[key], key
        indices = [VIDEO_KEYS.index(k) for k in batch.__key__]
        assert batch.questions == [_question(i) for i in indices]
        assert batch.answers == [_answers(i)[0] for i in indices]
        assert torch.equal(batch.question_tokens, tokenizer(batch.questions)["input_ids"])
        assert torch.equal(batch.answer_attn_mask, tokenizer(batch.answers)["attention_mask"])
        shards = [f"shards/shard_{i // 4:04d}.tar" for i in indices]
        assert [s.shard_name for s in batch.__sources__] == shards


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_clips=2, clip_duration_seconds=-1), r"clip_duration_seconds must be a finite number >= 0, got -1"),
        (dict(num_clips=2, clip_duration_seconds=float("nan")), r"clip_duration_seconds must be .* got nan"),
        (dict(num_clips=2, clip_duration_seconds="1"), r"clip_duration_seconds must be .* got '1'"),
        (dict(num_frames=2, frame_size=(0, 24)), r"frame_size must be \(width, height\), two ints >= 1, got \(0, 24\)"),
        (dict(num_frames=2, frame_size=224), r"frame_size must be .* got 224"),
        (dict(num_frames=2, frame_size=(32.0, 24)), r"frame_size must be .* got \(32.0, 24\)"),
    ],
)
def test_video_qa_refuses_a_bad_clip_duration_or_frame_size_when_built(kwargs, message):
    """A clip duration or frame size no video can satisfy is refused by the constructor, not by every sample."""
    with pytest.raises(ValueError, match="VideoQATaskEncoder: " + message):
        VideoQATaskEncoder(**kwargs)


def test_video_qa_takes_frame_size_as_any_pair_of_ints():
    """A list (as YAML gives it) is kept as a (width, height) tuple."""
    assert VideoQATaskEncoder(num_frames=2, frame_size=[32, 24]).frame_size == (32, 24)


def _train_run(path: Path) -> List[tuple]:
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
    encoder = VideoQATaskEncoder(num_frames=3, frame_size=FRAME_SIZE, random_answer=True)
    dataset = er.get_train_dataset(
        path,
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=4,
        max_samples_per_sequence=2,
        repeat=False,
        task_encoder=encoder,
    )
    return [(b.__key__, b.answers, b.frames) for b in er.get_loader(dataset)]


def test_video_qa_training_is_reproducible(videos):
    """Two training runs give the same shuffled keys, the same random answers and the same frames."""
    first, second = _train_run(videos[0]), _train_run(videos[0])
    assert sorted(k for keys, _, _ in first for k in keys) == VIDEO_KEYS
    assert [(k, a) for k, a, _ in first] == [(k, a) for k, a, _ in second]
    assert all(torch.equal(x, y) for (_, _, x), (_, _, y) in zip(first, second))
    for keys, answers, _ in first:
        assert all(a in _answers(VIDEO_KEYS.index(k)) for k, a in zip(keys, answers))


def _audio_batches(path: Path) -> list:
    return list(_val(path, AudioTaskEncoder(window_seconds=0.25, sample_rate=AUDIO_RATE), batch_size=3))


def test_audio_windows_are_sample_exact_and_seeded(audio_ds):
    """Each row is the ramp at its window's positions (zero padded if the file is short); starts repeat across runs."""
    batches = _audio_batches(audio_ds)
    assert [b.__key__ for b in batches] == [AUDIO_KEYS[0:3], AUDIO_KEYS[3:6]]
    window = AUDIO_RATE // 4
    starts = []
    for batch in batches:
        assert batch.audio.shape == (3, window) and batch.audio.dtype == torch.float32
        assert batch.texts == [f"label {AUDIO_KEYS.index(k)}" for k in batch.__key__]
        assert torch.equal(batch.text_tokens, HashTokenizer()(batch.texts)["input_ids"])
        for key, row, length, start in zip(batch.__key__, batch.audio, batch.lengths.tolist(), batch.starts.tolist()):
            total = round(AUDIO_SECONDS[AUDIO_KEYS.index(key)] * AUDIO_RATE)
            first = round(start * AUDIO_RATE)
            assert first == start * AUDIO_RATE and length == min(window, total) and first + length <= total
            assert torch.equal(row[:length], ramp_float(first, first + length)[0]), key
            assert not row[length:].any()
            starts.append(first)
    assert starts[-1] == 0 and len(set(starts[:-1])) == len(starts) - 1  # random starts, except the short file
    again = _audio_batches(audio_ds)
    assert all(torch.equal(a.starts, b.starts) and torch.equal(a.audio, b.audio) for a, b in zip(batches, again))


def _empty_wav(rate: int) -> bytes:
    """A wav file with its header and no sample (what a recorder that captured nothing writes)."""
    out = io.BytesIO()
    with av.open(out, "w", format="wav") as container:
        container.add_stream("pcm_s16le", rate=rate)
        container.start_encoding()
    return out.getvalue()


def test_audio_file_without_samples_is_skipped_counted_and_named(tmp_path, caplog):
    """A wav that holds only its header drops only its sample, counted under encode_sample and logged
    with shard, key and field, instead of a TypeError from the task's arithmetic."""
    samples = []
    for i, key in enumerate(AUDIO_KEYS[:3]):
        data = _empty_wav(AUDIO_RATE) if i == 1 else write_audio(tmp_path / f"{key}.wav", codec="pcm_s16le", seconds=0.5).read_bytes()
        samples.append((key, {"wav": data, "txt": f"label {i}".encode()}))
    write_shards(tmp_path / "ds" / "shards", samples, 3)
    prepare_dataset(tmp_path / "ds", split_ratio=(1, 0, 0), sample_type="CrudeWebdataset", progress=False)
    caplog.set_level(logging.WARNING, logger="energon_ray")
    loader = _val(tmp_path / "ds", AudioTaskEncoder(window_seconds=0.25, sample_rate=AUDIO_RATE), batch_size=3)
    assert [k for b in loader for k in b.__key__] == [AUDIO_KEYS[0], AUDIO_KEYS[2]]
    assert loader.stats.skipped == {"encode_sample": 1}
    lines = [r.getMessage() for r in caplog.records if AUDIO_KEYS[1] in r.getMessage()]
    assert len(lines) == 1 and "shards/shard_0000.tar: sample 'aud_001'" in lines[0]
    assert "field 'audio': wav: the audio stream holds no samples" in lines[0]


class ArrivalProbe(er.DefaultTaskEncoder):
    """Reports what ``sample.video`` is in encode_sample for a given ``av_decode``, and the frames in it."""

    def __init__(self, av_decode: str):
        super().__init__()
        self.decoder = er.SampleDecoder(av_decode=av_decode)

    def encode_sample(self, sample):
        video = sample.video
        out = {"__key__": sample.__key__, "arrived": type(video).__name__, "pid": os.getpid()}
        if isinstance(video, AVData):
            out["frames"] = video.video_clips[0]
        elif isinstance(video, AVDecoder):
            out["decoder"] = video  # returned on purpose: it crosses to the driver as its bytes
        else:
            with video:  # a PyAV container, opened in this Ray task; the hook closes it
                rgb = [f.to_ndarray(format="rgb24") for f in video.decode(video=0)]
            out["frames"] = torch.from_numpy(np.stack(rgb)).permute(0, 3, 1, 2)
        return out


@pytest.mark.parametrize(
    "av_decode, arrived", [("AVDecoder", "AVDecoder"), ("torch", "AVData"), ("pyav", "InputContainer")]
)
def test_av_decode_modes_through_the_pipeline(videos, av_decode, arrived):
    """encode_sample (in a Ray worker) gets an AVDecoder, decoded AVData or an open PyAV container."""
    path, files = videos
    items = list(_val(path, ArrivalProbe(av_decode), batch_size=None))
    assert [item["__key__"] for item in items] == VIDEO_KEYS
    for item, count in zip(items, VIDEO_FRAMES):
        assert item["arrived"] == arrived and item["pid"] != os.getpid()
        if av_decode == "AVDecoder":
            decoder = item["decoder"]
            assert isinstance(decoder, AVDecoder) and decoder.data == files[item["__key__"]].read_bytes()
            frames = decoder.get_video().video_clips[0]
        else:
            frames = item["frames"]
        assert frames.shape == (count, 3, 48, 64) and read_indices(frames) == list(range(count))


@pytest.mark.parametrize("av_decode, stage", [("AVDecoder", "encode_sample"), ("torch", "load")])
def test_corrupt_video_is_skipped_counted_and_named(corrupt_videos, caplog, av_decode, stage):
    """A half mp4 drops only its sample, counted under the stage that decodes it and logged with shard, key and field."""
    caplog.set_level(logging.WARNING, logger="energon_ray")
    if av_decode == "AVDecoder":
        loader = _val(corrupt_videos, VideoQATaskEncoder(num_frames=2, frame_size=FRAME_SIZE))
        keys = [k for batch in loader for k in batch.__key__]
    else:
        loader = _val(corrupt_videos, ArrivalProbe("torch"), batch_size=None)
        keys = [item["__key__"] for item in loader]
    assert keys == [k for i, k in enumerate(VIDEO_KEYS) if i != CORRUPT]
    assert loader.stats.skipped == {stage: 1}
    lines = [r.getMessage() for r in caplog.records if "vid_003" in r.getMessage()]
    assert len(lines) == 1
    assert "shards/shard_0000.tar: sample 'vid_003'" in lines[0]
    assert ("field 'video'" if stage == "encode_sample" else "cannot decode part 'mp4'") in lines[0]
    assert "mp4: cannot open media" in lines[0]


class AudioProbe(er.DefaultTaskEncoder):
    """Decodes videos with their audio (av_decode="torch", video_decode_audio=True); reports the shapes."""

    decoder = er.SampleDecoder(av_decode="torch", video_decode_audio=True)

    def encode_sample(self, sample):
        return {"__key__": sample.__key__, "channels": int(sample.video.audio_clips[0].shape[0])}


def test_video_decode_audio_on_a_silent_video_skips_counts_and_names_it(tmp_path, caplog):
    """video_decode_audio=True: a video with an AAC track gives its audio; a silent one (PyAV-made) drops
    only its sample, counted under load and logged with shard, key and part, as Energon's decoder fails it
    (an assertion), where it arrived without audio."""
    options = {"sc_threshold": "0", "bf": "0"}
    loud = write_video(tmp_path / "loud.mp4", codec="libx264", gop=10, options=options, audio=True, n_frames=10)
    silent = write_video(tmp_path / "silent.mp4", codec="libx264", gop=10, options=options, n_frames=10)
    with av.open(str(silent)) as container:
        assert len(container.streams.audio) == 0 and len(container.streams.video) == 1
    meta = json.dumps({"question": "q", "answers": ["a"]}).encode()
    samples = [(f"v{i}", {"mp4": path.read_bytes(), "json": meta}) for i, path in enumerate([loud, silent, loud])]
    write_shards(tmp_path / "ds" / "shards", samples, 3)
    prepare_dataset(tmp_path / "ds", split_ratio=(1, 0, 0), sample_type="VidQASample", field_map=VIDEO_FIELDS, progress=False)
    caplog.set_level(logging.WARNING, logger="energon_ray")
    loader = _val(tmp_path / "ds", AudioProbe(), batch_size=None)
    assert [(item["__key__"], item["channels"]) for item in loader] == [("v0", 1), ("v2", 1)]
    assert loader.stats.skipped == {"load": 1}
    lines = [r.getMessage() for r in caplog.records if "'v1'" in r.getMessage()]
    assert len(lines) == 1
    assert "shards/shard_0000.tar: sample 'v1'" in lines[0] and "cannot decode part 'mp4'" in lines[0]
    assert "mp4: video_decode_audio=True, but the video has no audio stream" in lines[0]


def test_video_qa_skips_answers_that_are_no_list_and_questions_that_are_no_string(bad_text_videos, caplog):
    """A string of answers (it would train on its first letter) and a null question (it would fail the
    tokenizer and the whole batch) drop only their own samples, counted and logged with their field."""
    caplog.set_level(logging.WARNING, logger="energon_ray")
    loader = _val(bad_text_videos, VideoQATaskEncoder(num_frames=2, frame_size=FRAME_SIZE))
    batches = list(loader)
    assert [k for b in batches for k in b.__key__] == [k for i, k in enumerate(VIDEO_KEYS) if i not in (1, 4)]
    assert [a for b in batches for a in b.answers] == [_answers(i)[0] for i in (0, 2, 3, 5)]
    assert loader.stats.skipped == {"encode_sample": 2}
    log = caplog.text
    assert "sample 'vid_001'" in log and "field 'answers': must be a list of strings, got 'yes'" in log
    assert "sample 'vid_004'" in log and "field 'context': the question must be a string, got None" in log
