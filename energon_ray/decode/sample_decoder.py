"""``SampleDecoder``: decode tar parts by extension with webdataset's handlers."""

from __future__ import annotations

from typing import Any, Callable, Dict, Literal, Optional

import webdataset.autodecode as wds_decode

from energon_ray.decode.av_handler import AV_EXTENSIONS, AVHandler

ImageDecoderType = Literal[
    "l8", "rgb8", "rgba8", "l", "rgb", "rgba",
    "torchl8", "torchrgb8", "torchrgba8", "torchl", "torchrgb", "torch", "torchrgba",
    "pill", "pil", "pilrgb", "pilrgba",
]  # fmt: skip
AVDecoderType = Literal["torch", "AVDecoder", "pyav"]

IMAGE_MODES = tuple(wds_decode.imagespecs.keys())
AV_MODES = ("torch", "AVDecoder", "pyav")


class _GuessingHandler:
    """Replace the extension by what ``filetype`` sniffs from the bytes, then call ``handler``."""

    def __init__(self, handler: Callable[[str, bytes], Any]):
        self.handler = handler

    def __call__(self, key: str, data: bytes) -> Any:
        import filetype

        kind = filetype.guess(data)
        if kind is not None:
            key = "." + kind.extension
        return self.handler(key, data)


class SampleDecoder:
    """Decodes each part of a raw sample by its last extension.

    Images go through webdataset's ``imagehandler(image_decode)``; audio and video through the
    AV handler (``av_decode``); ``txt``, ``json``, ``cls``, ``npy``, ``pickle``, … through
    webdataset's basic handlers. Unknown extensions stay ``bytes``.

    Args:
        image_decode: one of webdataset's image specs (``torchrgb`` = float CHW in [0, 1]).
        av_decode: ``"AVDecoder"`` (lazy decoder object), ``"torch"`` (decoded tensors) or ``"pyav"``.
        video_decode_audio: with ``av_decode="torch"``, also decode a video's audio track.
        guess_content: sniff the content type with ``filetype`` instead of trusting the extension.

    Raises:
        ValueError: for an unknown ``image_decode`` or ``av_decode``.

    Example:
        >>> SampleDecoder().decode_part("caption.txt", b"hello")
        'hello'
    """

    def __init__(
        self,
        *,
        image_decode: ImageDecoderType = "torchrgb",
        av_decode: AVDecoderType = "AVDecoder",
        video_decode_audio: bool = False,
        guess_content: bool = False,
    ):
        if image_decode not in IMAGE_MODES:
            raise ValueError(f"SampleDecoder: image_decode={image_decode!r} is not one of {list(IMAGE_MODES)}")
        if av_decode not in AV_MODES:
            raise ValueError(f"SampleDecoder: av_decode={av_decode!r} is not one of {list(AV_MODES)}")
        self.image_decode = image_decode
        self.av_decode = av_decode
        self.video_decode_audio = video_decode_audio
        self.guess_content = guess_content
        self._decoder: Optional[wds_decode.Decoder] = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_decoder"] = None  # handlers are rebuilt where the decoder runs
        return state

    def _build(self) -> wds_decode.Decoder:
        handlers: list = [
            wds_decode.imagehandler(self.image_decode),
            AVHandler(av_decode=self.av_decode, video_decode_audio=self.video_decode_audio),
        ]
        if self.guess_content:
            handlers = [_GuessingHandler(h) for h in handlers]
        return wds_decode.Decoder(handlers)

    def decode_part(self, part: str, data: bytes) -> Any:
        """Decode the bytes of one part (``jpg``, ``caption.txt``, ``json``, …)."""
        if self._decoder is None:
            self._decoder = self._build()
        return self._decoder.decode1(part, data)

    def decode(self, fname: str, raw: bytes) -> Any:
        """Decode a file by its name (``"images/0001.jpg"``), e.g. an auxiliary file of a crude sample."""
        base = fname.rsplit("/", 1)[-1]
        part = base.split(".", 1)[1] if "." in base else base
        return self.decode_part(part, raw)

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        """Decode every non-meta part of a raw sample dict (keys starting with ``__`` pass through)."""
        return {
            k: (v if k.startswith("__") or not isinstance(v, (bytes, bytearray)) else self.decode_part(k, v))
            for k, v in sample.items()
        }

    def config(self) -> Dict[str, Any]:
        """The decoder's settings."""
        return {
            "image_decode": self.image_decode,
            "av_decode": self.av_decode,
            "video_decode_audio": self.video_decode_audio,
            "guess_content": self.guess_content,
        }

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"SampleDecoder({args})"

    @staticmethod
    def is_av_part(part: str) -> bool:
        """Whether a part name has an audio/video extension."""
        return part.rsplit(".", 1)[-1].lower() in AV_EXTENSIONS
