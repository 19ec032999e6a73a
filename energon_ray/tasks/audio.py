"""Audio with a label or transcript, ready to run: a fixed-length window of each file, mono float32.

The data path is the one of :mod:`energon_ray.tasks.video_qa`: the compressed file is read and
wrapped in a lazy ``AVDecoder`` inside the Ray task, ``encode_sample`` decodes only the window
(seeking, not decoding from the start), and only batches of windows travel to the driver.

The dataset is a crude one (``CrudeWebdataset``): each sample has an audio part (``wav``, ``flac``,
``mp3``, ``ogg``) and optionally a ``txt`` part, and the encoder's cooker turns it into an
:class:`AudioSample`. A typed dataset works too (``sample_type: {__module__:
energon_ray.tasks.audio, __class__: AudioSample}`` with a ``field_map``).

Example:
    >>> from energon_ray.tasks.audio import AudioTaskEncoder
    >>> AudioTaskEncoder(window_seconds=0.5, sample_rate=8000).window_samples
    4000
"""

from __future__ import annotations

import math
import numbers
import random
from typing import Any, List, Optional, Tuple

import torch

from energon_ray.decode.av import AVDecoder, audio_to_float
from energon_ray.decode.sample_decoder import SampleDecoder
from energon_ray.errors import SampleException
from energon_ray.samples import Batch, CrudeSample, Sample, edataclass
from energon_ray.task_encoder import Cooker, DefaultTaskEncoder, basic_sample_keys
from energon_ray.tasks.tokenizer import HashTokenizer


@edataclass
class AudioSample(Sample):
    """An audio file (a lazy ``AVDecoder``) with its label or transcript."""

    audio: Any
    text: str = ""


@edataclass
class AudioEncodedSample(Sample):
    """One window: mono float32 samples, how many of them are real (the rest is zero padding), where it starts."""

    audio: torch.Tensor
    length: int
    start_seconds: float
    text: str


@edataclass
class AudioBatch(Batch):
    """What the model gets.

    Attributes:
        audio: float32 ``(batch, window_samples)`` in [-1, 1], mono.
        lengths: ``(batch,)`` real samples of each row (shorter files are zero padded).
        starts: ``(batch,)`` float64 seconds where each window starts in its file.
        texts: labels or transcripts.
        text_tokens: ``(batch, length)`` token ids of ``texts``, padded with 0.
        text_attn_mask: 1 where ``text_tokens`` holds a token.
    """

    audio: torch.Tensor
    lengths: torch.Tensor
    starts: torch.Tensor
    texts: List[str]
    text_tokens: torch.Tensor
    text_attn_mask: torch.Tensor


def cook_audio(crude: CrudeSample) -> AudioSample:
    """Crude sample → :class:`AudioSample`: the first part decoded to an ``AVDecoder``, and ``txt``.

    Raises:
        SampleException: when no part holds audio, naming the sample and its parts.
    """
    parts = sorted(k for k in crude if not k.startswith("__"))
    audio = next((crude[k] for k in parts if isinstance(crude[k], AVDecoder)), None)
    if audio is None:
        raise SampleException(
            f"sample {crude.get('__key__')!r}: no audio part (decoded to an AVDecoder) among its parts {parts}"
        )
    text = crude.get("txt", "")
    return AudioSample(**basic_sample_keys(crude), audio=audio, text=text if isinstance(text, str) else str(text))


class AudioTaskEncoder(DefaultTaskEncoder[AudioSample, AudioEncodedSample, AudioBatch, AudioBatch]):
    """A window of ``window_seconds`` per file, mono, at a fixed length; texts tokenized per batch.

    Args:
        window_seconds: window length; every row has ``round(window_seconds * sample_rate)`` samples.
        sample_rate: the rate the files must have (nothing is resampled; others are skipped as errors).
        random_start: start the window at a random sample (seeded per sample by the loader, so the
            same in every run); ``False`` starts at 0.
        tokenizer: ``tokenizer(texts) -> {"input_ids", "attention_mask"}``; default ``HashTokenizer``.
        max_length: longest text, in tokens (for the default tokenizer).

    Raises:
        ValueError: for a window shorter than one sample or a non-positive rate.
    """

    decoder = SampleDecoder(av_decode="AVDecoder")
    cookers = (Cooker(cook_audio),)

    def __init__(
        self,
        *,
        window_seconds: float = 1.0,
        sample_rate: int = 16000,
        random_start: bool = True,
        tokenizer: Optional[Any] = None,
        max_length: int = 64,
    ):
        super().__init__()
        if not isinstance(sample_rate, int) or isinstance(sample_rate, bool) or sample_rate < 1:
            raise ValueError(f"AudioTaskEncoder: sample_rate must be an int >= 1, got {sample_rate!r}")
        if isinstance(window_seconds, bool) or not isinstance(window_seconds, numbers.Real) or not math.isfinite(window_seconds):
            raise ValueError(f"AudioTaskEncoder: window_seconds must be a finite number of seconds, got {window_seconds!r}")
        self.window_samples = round(window_seconds * sample_rate)
        if self.window_samples < 1:
            raise ValueError(f"AudioTaskEncoder: window_seconds={window_seconds!r} holds no sample at {sample_rate} Hz")
        self.window_seconds = window_seconds
        self.sample_rate = sample_rate
        self.random_start = random_start
        self.tokenizer = tokenizer or HashTokenizer(max_length=max_length)

    def __repr__(self) -> str:
        return (
            f"AudioTaskEncoder(window_seconds={self.window_seconds}, sample_rate={self.sample_rate}, "
            f"random_start={self.random_start})"
        )

    def window(self, audio: AVDecoder) -> Tuple[torch.Tensor, int, float]:
        """``(mono samples padded to window_samples, real length, start in seconds)`` of one file."""
        if not isinstance(audio, AVDecoder):
            raise TypeError(
                f"AudioTaskEncoder needs an AVDecoder (SampleDecoder(av_decode='AVDecoder')), got {type(audio).__name__}"
            )
        rate = audio.get_audio_samples_per_second()
        if rate != self.sample_rate:
            raise SampleException(f"{audio.key}: audio at {rate} Hz, the task expects {self.sample_rate} Hz")
        duration = audio.get_audio_duration()
        if duration is None:  # no duration in the header and no timestamped packet: nothing to decode
            raise SampleException(f"{audio.key}: the audio stream holds no samples")
        total = round(duration * rate)
        size = self.window_samples
        # The start is drawn in whole samples and the range given in samples, so every window holds
        # exactly `size` samples (seconds would be rounded at both ends).
        first = random.randint(0, total - size) if self.random_start and total > size else 0
        end = first + size if total >= size else float("inf")
        data = audio.get_clips(audio_clip_ranges=[(first, end)], audio_unit="samples")
        mono = audio_to_float(data.audio_clips[0]).mean(dim=0)  # int16 for wav/flac, float for lossy codecs
        out = torch.zeros(size, dtype=torch.float32)
        length = min(size, mono.shape[0])
        out[:length] = mono[:length]
        return out, length, data.audio_timestamps[0][0]

    def encode_sample(self, sample: AudioSample) -> AudioEncodedSample:
        try:
            audio, length, start = self.window(sample.audio)
        except SampleException as exc:
            raise SampleException(f"field 'audio': {exc}") from exc
        return AudioEncodedSample.derive_from(sample, audio=audio, length=length, start_seconds=start, text=sample.text)

    def batch(self, samples: List[AudioEncodedSample]) -> AudioBatch:
        texts = [s.text for s in samples]
        tokens = self.tokenizer(texts)
        return AudioBatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=tuple(s.__restore_key__ for s in samples),
            __subflavors__=[s.__subflavors__ for s in samples],
            __sources__=tuple(src for s in samples for src in (s.__sources__ or ())),
            audio=torch.stack([s.audio for s in samples]),
            lengths=torch.tensor([s.length for s in samples], dtype=torch.long),
            starts=torch.tensor([s.start_seconds for s in samples], dtype=torch.float64),
            texts=texts,
            text_tokens=tokens["input_ids"],
            text_attn_mask=tokens["attention_mask"],
        )
