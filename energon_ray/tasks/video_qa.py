"""Video question answering, ready to run: clips are pulled from a lazy ``AVDecoder`` in ``encode_sample``.

Where the bytes travel and where decoding happens:

1. The driver sends each Ray task only a segment plan (sample indices). The task reads the
   compressed video bytes straight from the tar shard, so the mp4 never crosses the object store.
2. ``SampleDecoder(av_decode="AVDecoder")`` wraps those bytes in an :class:`AVDecoder` without
   decoding anything (``VidQASample.video``).
3. ``encode_sample`` runs in the same Ray task (read, decode, ``encode_sample`` and ``batch`` are one
   fused stage, see ``energon_ray.pipeline.build``). It seeks to the requested clips, decodes only
   their frames, already scaled to ``frame_size``, and drops the decoder.
4. Only finished batches (uint8 frames at ``frame_size`` and token ids) go back to the driver,
   plus, at the end of a segment, the few encoded samples that did not fill a batch (the driver
   batches those); both hold tensors, never the decoder.

Why: decoding is the most expensive step, so it has to run where the data is, in parallel on the
workers. Decoding only the requested frames at their output size keeps memory small, and what goes
to the trainer is exactly what the model reads, with no full-resolution frames and no decoder
objects. So an ``AVDecoder`` is never pickled between stages. If a hook did return one (or with
``fuse_stages=False`` between encoding and batching), it would pickle as its compressed bytes, not
as an open container or decoded frames. Frames stay uint8 (4x smaller than float32 in transit)
unless ``normalize=True``; convert on the GPU instead where you can.

Example:
    >>> from energon_ray.tasks.video_qa import VideoQATaskEncoder
    >>> VideoQATaskEncoder(num_frames=8, frame_size=(64, 48))
    VideoQATaskEncoder(num_frames=8, frame_size=(64, 48), normalize=False)
"""

from __future__ import annotations

import math
import numbers
import random
from typing import Any, List, Optional, Tuple

import torch

from energon_ray.decode.av import AVDecoder, get_clips_uniform, get_single_frames_uniform
from energon_ray.decode.sample_decoder import SampleDecoder
from energon_ray.errors import SampleException
from energon_ray.samples import Batch, Sample, VidQASample, edataclass
from energon_ray.task_encoder import DefaultTaskEncoder
from energon_ray.tasks.tokenizer import HashTokenizer


@edataclass
class VideoQAEncodedSample(Sample):
    """One encoded sample: a fixed number of frames, the question and the chosen answer."""

    #: uint8 ``(frames, 3, height, width)``.
    frames: torch.Tensor
    question: str
    answer: str


@edataclass
class VideoQABatch(Batch):
    """What the model gets: frames and tokenized questions and answers.

    Attributes:
        frames: ``(batch, frames, 3, height, width)``; uint8, or float32 in [0, 1] with ``normalize``.
        question_tokens: ``(batch, length)`` token ids, padded with 0.
        question_attn_mask: 1 where ``question_tokens`` holds a token.
        answer_tokens: ``(batch, length)`` token ids of the chosen answers, padded with 0.
        answer_attn_mask: 1 where ``answer_tokens`` holds a token.
        questions: the question texts.
        answers: the chosen answer texts.
    """

    frames: torch.Tensor
    question_tokens: torch.Tensor
    question_attn_mask: torch.Tensor
    answer_tokens: torch.Tensor
    answer_attn_mask: torch.Tensor
    questions: List[str]
    answers: List[str]


def pick_frames(clip: torch.Tensor, count: int) -> torch.Tensor:
    """The middle frame of each of ``count`` equal parts of ``clip`` (frames repeat if it is short).

    Integer arithmetic, so the choice never depends on float rounding.

    Example:
        >>> pick_frames(torch.arange(10).view(10, 1, 1, 1), 3).flatten().tolist()
        [1, 5, 8]
    """
    length = clip.shape[0]
    index = ((2 * torch.arange(count) + 1) * length) // (2 * count)
    return clip[index]


class VideoQATaskEncoder(DefaultTaskEncoder[VidQASample, VideoQAEncodedSample, VideoQABatch, VideoQABatch]):
    """Uniform clips (or single frames) of each video, tokenized question and answer.

    Give either ``num_clips`` (with ``clip_duration_seconds`` and ``frames_per_clip``) or
    ``num_frames``. Every sample then has ``num_clips * frames_per_clip`` (or ``num_frames``)
    frames, so batches stack without padding.

    Args:
        num_clips: equally spaced clips per video (``get_clips_uniform``).
        clip_duration_seconds: length of each clip.
        frames_per_clip: frames kept per clip, the middle frame of equal parts of the clip.
        num_frames: equally spaced single frames per video instead (``get_single_frames_uniform``).
        frame_size: ``(width, height)`` the frames are scaled to while decoding.
        tokenizer: ``tokenizer(texts) -> {"input_ids", "attention_mask"}``; default ``HashTokenizer``.
        max_length: longest question or answer, in tokens (for the default tokenizer).
        random_answer: train on a random one of the sample's answers (seeded per sample by the
            loader) instead of the first.
        normalize: return float32 frames in [0, 1] instead of uint8.

    Raises:
        ValueError: unless exactly one of ``num_clips`` and ``num_frames`` is given, for
            non-positive counts, a negative or non-finite ``clip_duration_seconds`` or a
            ``frame_size`` that is not two positive ints.
    """

    decoder = SampleDecoder(av_decode="AVDecoder")

    def __init__(
        self,
        *,
        num_clips: Optional[int] = None,
        clip_duration_seconds: float = 1.0,
        frames_per_clip: int = 4,
        num_frames: Optional[int] = None,
        frame_size: Tuple[int, int] = (224, 224),
        tokenizer: Optional[Any] = None,
        max_length: int = 64,
        random_answer: bool = False,
        normalize: bool = False,
    ):
        super().__init__()
        if (num_clips is None) == (num_frames is None):
            raise ValueError(
                f"VideoQATaskEncoder: give exactly one of num_clips and num_frames, got num_clips={num_clips!r}, "
                f"num_frames={num_frames!r}"
            )
        for name, value in (("num_clips", num_clips), ("num_frames", num_frames), ("frames_per_clip", frames_per_clip)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"VideoQATaskEncoder: {name} must be an int >= 1, got {value!r}")
        # checked here: each sample would otherwise fail with it, skipped one by one
        duration = clip_duration_seconds
        if isinstance(duration, bool) or not isinstance(duration, numbers.Real) or not 0 <= duration < math.inf:
            raise ValueError(f"VideoQATaskEncoder: clip_duration_seconds must be a finite number >= 0, got {duration!r}")
        try:
            width, height = frame_size
        except (TypeError, ValueError):
            width = height = None
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in (width, height)):
            raise ValueError(f"VideoQATaskEncoder: frame_size must be (width, height), two ints >= 1, got {frame_size!r}")
        self.num_clips = num_clips
        self.clip_duration_seconds = clip_duration_seconds
        self.frames_per_clip = frames_per_clip
        self.num_frames = num_frames
        self.frame_size = (int(width), int(height))
        self.tokenizer = tokenizer or HashTokenizer(max_length=max_length)
        self.random_answer = random_answer
        self.normalize = normalize

    def __repr__(self) -> str:
        if self.num_frames is not None:
            what = f"num_frames={self.num_frames}"
        else:
            what = (
                f"num_clips={self.num_clips}, clip_duration_seconds={self.clip_duration_seconds}, "
                f"frames_per_clip={self.frames_per_clip}"
            )
        return f"VideoQATaskEncoder({what}, frame_size={self.frame_size}, normalize={self.normalize})"

    def frames_of(self, video: AVDecoder) -> torch.Tensor:
        """The sample's uint8 frames ``(frames, 3, height, width)``, decoded from ``video``."""
        if not isinstance(video, AVDecoder):
            raise TypeError(
                f"VideoQATaskEncoder needs the video as an AVDecoder (SampleDecoder(av_decode='AVDecoder')), "
                f"got {type(video).__name__}"
            )
        if self.num_frames is not None:
            return get_single_frames_uniform(video, self.num_frames, video_out_frame_size=self.frame_size)
        data = get_clips_uniform(
            video,
            clip_duration_seconds=self.clip_duration_seconds,
            num_clips=self.num_clips,
            request_video=True,
            video_out_frame_size=self.frame_size,
        )
        return torch.cat([pick_frames(clip, self.frames_per_clip) for clip in data.video_clips])

    def encode_sample(self, sample: VidQASample) -> VideoQAEncodedSample:
        # Checked before decoding: a string of answers would train on its first letter, a question
        # that is not a string would fail the tokenizer and with it the whole batch.
        if not isinstance(sample.context, str):
            raise SampleException(f"field 'context': the question must be a string, got {sample.context!r}")
        answers = [] if sample.answers is None else sample.answers
        if not isinstance(answers, (list, tuple)) or not all(isinstance(a, str) for a in answers):
            raise SampleException(f"field 'answers': must be a list of strings, got {sample.answers!r}")
        try:
            frames = self.frames_of(sample.video)
        except SampleException as exc:
            # The decoder knows the part ('mp4') and the loader adds shard and key; name the field too.
            raise SampleException(f"field 'video': {exc}") from exc
        if not answers:
            answer = ""
        elif self.random_answer:
            answer = random.choice(answers)
        else:
            answer = answers[0]
        return VideoQAEncodedSample.derive_from(sample, frames=frames, question=sample.context, answer=answer)

    def batch(self, samples: List[VideoQAEncodedSample]) -> VideoQABatch:
        frames = torch.stack([s.frames for s in samples])
        if self.normalize:
            frames = frames.float().div_(255)
        questions, answers = [s.question for s in samples], [s.answer for s in samples]
        question_ids, answer_ids = self.tokenizer(questions), self.tokenizer(answers)
        return VideoQABatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=tuple(s.__restore_key__ for s in samples),
            __subflavors__=[s.__subflavors__ for s in samples],
            __sources__=tuple(src for s in samples for src in (s.__sources__ or ())),
            frames=frames,
            question_tokens=question_ids["input_ids"],
            question_attn_mask=question_ids["attention_mask"],
            answer_tokens=answer_ids["input_ids"],
            answer_attn_mask=answer_ids["attention_mask"],
            questions=questions,
            answers=answers,
        )
