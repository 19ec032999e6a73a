"""Audio/video part handler for ``SampleDecoder``: lazy decoder, decoded tensors or a PyAV container."""

from __future__ import annotations

from typing import Any, Optional

from energon_ray.decode.av import AVDecoder
from energon_ray.decode.av._container import open_container

VIDEO_EXTENSIONS = ("mp4", "mkv", "avi", "mov", "webm", "flv")
AUDIO_EXTENSIONS = ("wav", "flac", "mp3", "ogg")
AV_EXTENSIONS = VIDEO_EXTENSIONS + AUDIO_EXTENSIONS

AV_DECODE_MODES = ("AVDecoder", "torch", "pyav")


class AVHandler:
    """webdataset-style handler ``(key, data) -> decoded | None`` for audio and video parts.

    The part's last extension decides whether the handler applies (``"mp4"``, ``".mp4"`` and
    ``"clip.video.mp4"`` all do); other parts get ``None`` so the next handler can try.

    Args:
        av_decode: ``"AVDecoder"`` returns a lazy :class:`AVDecoder` (nothing decoded yet);
            ``"torch"`` decodes the whole file to an :class:`AVData` of tensors; ``"pyav"`` returns
            the opened ``av.container.InputContainer`` (the caller closes it).
        video_decode_audio: with ``"torch"``, also decode the audio track of videos that have one.

    Raises:
        ValueError: for an unknown ``av_decode``.

    Example:
        >>> AVHandler()("caption.txt", b"hello") is None
        True
        >>> AVHandler()("clip.mp4", b"\\x00\\x01")
        AVDecoder(key='clip.mp4', bytes=2)
    """

    def __init__(self, av_decode: str = "AVDecoder", video_decode_audio: bool = False):
        if av_decode not in AV_DECODE_MODES:
            raise ValueError(f"AVHandler: av_decode={av_decode!r} is not one of {list(AV_DECODE_MODES)}")
        self.av_decode = av_decode
        self.video_decode_audio = video_decode_audio

    def __call__(self, key: str, data: bytes) -> Optional[Any]:
        """Decode ``data`` if ``key`` names an audio/video part, else return ``None``.

        Raises:
            SampleException: in ``"torch"`` and ``"pyav"`` modes, when the media cannot be read.
        """
        ext = key.rsplit(".", 1)[-1].lower()
        if ext not in AV_EXTENSIONS:
            return None
        key = key.lstrip(".")  # webdataset passes ".mp4"; messages should name the part as "mp4"
        if self.av_decode == "pyav":
            return open_container(bytes(data), key)
        decoder = AVDecoder(data, key=key)
        if self.av_decode == "torch":
            return decoder.get_frames(video_decode_audio=self.video_decode_audio)
        return decoder

    def __repr__(self) -> str:
        return f"AVHandler(av_decode={self.av_decode!r}, video_decode_audio={self.video_decode_audio!r})"
