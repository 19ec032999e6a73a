"""``AudioClipReader``: decode sample ranges of an audio stream by seeking near their start."""

from __future__ import annotations

import warnings
from fractions import Fraction
from typing import Callable, Iterator, Optional, Tuple

import av
import av.container
import numpy as np
import torch

from energon_ray.decode.av._container import AV_ERRORS, audio_stream
from energon_ray.errors import SampleException

Opener = Callable[[], "av.container.InputContainer"]


def frame_to_array(frame: "av.AudioFrame") -> np.ndarray:
    """One decoded audio frame as ``(channels, samples)`` in the codec's own sample type.

    PCM and FLAC keep their stored integers (int16 for 16-bit files, int32 for 24/32-bit ones, whose
    samples FFmpeg left-aligns), lossy codecs give float32: what Energon's ``AVDecoder`` returns.
    :func:`audio_to_float` maps any of them to float32 in [-1, 1].
    """
    arr = frame.to_ndarray()
    if not frame.format.is_planar:
        arr = arr.reshape(-1, frame.layout.nb_channels).T  # packed: L R L R ... -> rows per channel
    return arr


def audio_to_float(clip: torch.Tensor) -> torch.Tensor:
    """An audio clip from :class:`AVDecoder` as float32 in [-1, 1], whatever its sample type.

    Signed integers are divided by ``2 ** (bits - 1)``, unsigned 8-bit samples are centred on 128,
    floating point clips are only cast.

    Args:
        clip: a ``(channels, samples)`` tensor from ``AVData.audio_clips``.

    Returns:
        The float32 tensor of the same shape.

    Raises:
        TypeError: for a tensor type no audio codec produces (bool, complex).

    Example:
        >>> audio_to_float(torch.tensor([[-32768, 0, 16384]], dtype=torch.int16)).tolist()
        [[-1.0, 0.0, 0.5]]
    """
    if clip.dtype == torch.uint8:
        return (clip.to(torch.float32) - 128.0) / 128.0
    if clip.dtype in (torch.int16, torch.int32, torch.int64):
        return clip.to(torch.float32) / float(2 ** (torch.iinfo(clip.dtype).bits - 1))
    if clip.dtype.is_floating_point:
        return clip.to(torch.float32)
    raise TypeError(f"audio_to_float: no audio sample type is {clip.dtype}")


#: Codecs whose frames decode on their own, so decoding right from a seek point is bit-exact.
_SELF_CONTAINED = ("flac", "alac", "wavpack", "tta", "ape")
#: Lossy codecs overlap frames (MDCT) or borrow bits from earlier ones (mp3's reservoir): decode this
#: much before the clip and throw it away, so the clip's samples equal those of a full decode.
_PREROLL_SECONDS = Fraction(1, 4)


def preroll_samples(codec_name: str, sample_rate: int) -> int:
    """How many samples to decode and drop before a clip so that seeking gives a full decode's samples."""
    if codec_name.startswith("pcm_") or codec_name in _SELF_CONTAINED:
        return 0
    return int(_PREROLL_SECONDS * sample_rate)



class PastTheEnd(SampleException):
    """A clip range that starts at or after the end of its stream: no clip there (``AVDecoder``
    leaves it out of the clips it returns, as Energon's gives none)."""


class AudioClipReader:
    """Reads samples ``[start, end)`` of the first audio stream, placed by the frames' pts.

    Sample ``n`` is the sample shown at ``n / sample_rate`` seconds. A read seeks to the packet at or
    before ``start`` (minus a pre-roll for lossy codecs) and drops the samples before ``start``; if
    the seek lands too late (or on a frame without timestamp), the read decodes again from the top.

    Args:
        open_container: opens a fresh container on the same bytes.
        key: the sample key, for messages.
        preroll: samples to decode before ``start`` after a seek (see :func:`preroll_samples`).
        suppress_warnings: do not warn when a seek had to be retried.
    """

    def __init__(
        self, open_container: Opener, key: str, preroll: int, suppress_warnings: bool
    ):
        self._open = open_container
        self._key = key
        self._preroll = preroll
        self._quiet = suppress_warnings
        self._container: Optional["av.container.InputContainer"] = None

    def close(self) -> None:
        """Close the container this reader opened."""
        if self._container is not None:
            self._container.close()
            self._container = None

    def read(self, start: int, end: Optional[int]) -> Tuple[np.ndarray, int]:
        """Decode samples ``[start, end)`` (``end=None``: to the end of the stream).

        Returns:
            The samples ``(channels, n)`` in the codec's sample type and the sample number of the first one (later than
            ``start`` only when the stream itself begins later).

        Raises:
            SampleException: when the range starts at or after the end of the stream or ends before its
                first sample, or decoding fails.
        """
        self.close()
        self._container = self._open()
        target = start - self._preroll
        if target > 0:
            frames = self._seek(target)
            got = None if frames is None else self._collect(start, end, frames, seek_target=target)
            if got is not None:
                return got
            if not self._quiet:
                how = "missed" if frames is not None else "was refused by the demuxer at"
                warnings.warn(
                    f"{self._key}: audio seek {how} sample {start}; decoding again from the start",
                    RuntimeWarning,
                    stacklevel=3,
                )
            self.close()
            self._container = self._open()
        got = self._collect(start, end, self._decode(), seek_target=None)
        assert got is not None  # without a seek nothing can be missed
        return got

    def _seek(self, start: int) -> Optional[Iterator["av.AudioFrame"]]:
        """Frames from the packet at or before sample ``start``; ``None`` when the demuxer refuses the
        seek (FFmpeg's FLAC demuxer does for some targets in a file without seek table: EPERM)."""
        stream = audio_stream(self._container)
        ticks = int(Fraction(start, stream.sample_rate) / Fraction(stream.time_base))
        try:
            self._container.seek(ticks, stream=stream, backward=True, any_frame=False)
        except AV_ERRORS:
            return None  # decoding from the top gives the same samples, only slower
        return self._decode()

    def _decode(self) -> Iterator["av.AudioFrame"]:
        stream = audio_stream(self._container)
        try:
            for packet in self._container.demux(stream):
                yield from packet.decode()
        except AV_ERRORS as exc:
            raise SampleException(
                f"{self._key}: decoding the audio failed (corrupt or truncated data): {type(exc).__name__}: {exc}"
            ) from exc

    def _collect(
        self, start: int, end: Optional[int], frames: Iterator["av.AudioFrame"], seek_target: Optional[int]
    ) -> Optional[Tuple[np.ndarray, int]]:
        """Gather samples ``[start, end)``; ``None`` if the seek to ``seek_target`` landed after it."""
        seeked = seek_target is not None
        stream = audio_stream(self._container)
        samples_per_tick = Fraction(stream.time_base) * stream.sample_rate
        chunks, first, pos, began = [], None, None, None
        for number, frame in enumerate(frames):
            if frame.pts is not None:
                pos = round(frame.pts * samples_per_tick)
            elif pos is None:
                if seeked:
                    return None  # cannot place the first frame after a seek
                pos = 0
            # FFmpeg 7 (PyAV 19) drops the first AAC frame decoded after a seek (it only primes the
            # decoder): one frame late keeps most of the pre-roll; later, or past start, is a miss
            if seeked and number == 0 and pos > min(start, seek_target + frame.samples):
                return None  # the seek landed after the pre-roll point
            began = pos if began is None else began
            lo = max(start, pos)
            hi = pos + frame.samples if end is None else min(end, pos + frame.samples)
            if hi > lo:
                chunks.append(frame_to_array(frame)[:, lo - pos : hi - pos])
                first = lo if first is None else first
            pos += frame.samples
            if end is not None and pos >= end:
                break
        if not chunks:
            if pos is None:  # no frame at all: a seek to or past the end (a header can claim more)
                pos = self._demuxed_end()
            self._raise_empty(start, end, began, pos, stream.sample_rate)
        return np.concatenate(chunks, axis=1), first

    def _demuxed_end(self) -> Optional[int]:
        """The sample at which the last packet of the audio ends, read by demuxing (no decoding)."""
        reached = None
        with self._open() as container:
            stream = audio_stream(container)
            samples_per_tick = Fraction(stream.time_base) * stream.sample_rate
            try:
                for packet in container.demux(stream):
                    if packet.pts is not None and packet.size:
                        end = round((packet.pts + (packet.duration or 0)) * samples_per_tick)
                        reached = end if reached is None else max(reached, end)
            except AV_ERRORS:
                pass  # the packets read so far tell how far the audio reaches
        return reached

    def _raise_empty(
        self, start: int, end: Optional[int], began: Optional[int], reached: Optional[int], rate: int
    ) -> None:
        """No sample of ``[start, end)`` exists: the range lies before the audio's first sample (an mp3's
        encoder delay) or at or after its end (Energon silently returns no clip there). A range that
        only ends past the stream is cut at its end instead, as Energon cuts it."""
        if end is not None and began is not None and end <= began:
            raise SampleException(
                f"{self._key}: audio range [{start}, {end}) (samples; {start / rate:.6f}s to {end / rate:.6f}s) "
                f"ends before the audio starts (its first sample is sample {began}, at {began / rate:.6f}s)"
            )
        where = "" if reached is None else f" ({reached / rate:.6f}s)"
        raise PastTheEnd(
            f"{self._key}: audio range starts at sample {start} ({start / rate:.6f}s), "
            f"at or after the end of the audio{where}"
        )
