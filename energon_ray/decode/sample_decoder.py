"""``SampleDecoder``: decode tar parts by extension with webdataset's handlers (images:
``decode.image_handler``; audio and video: ``decode.av_handler``; bounded basic handlers:
``decode.part_limits``)."""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any, Callable, Dict, Literal, Optional

import torch
import webdataset.autodecode as wds_decode

from energon_ray.decode.av_handler import (
    AV_EXTENSIONS,
    DEFAULT_MAX_AV_DURATION_S,
    DEFAULT_MAX_VIDEO_PIXELS,
    AVWebdatasetDecoder,
    check_limit,
)
from energon_ray.decode.image_handler import UNTRUSTED_WHERE, ImageHandler
from energon_ray.decode.part_limits import DEFAULT_MAX_PART_BYTES, BoundedBasicHandler, GzipPartHandler
from energon_ray.errors import untrusted

ImageDecoderType = Literal[
    "l8", "rgb8", "rgba8", "l", "rgb", "rgba",
    "torchl8", "torchrgb8", "torchrgba8", "torchl", "torchrgb", "torch", "torchrgba",
    "pill", "pil", "pilrgb", "pilrgba",
]  # fmt: skip
AVDecoderType = Literal["torch", "AVDecoder", "pyav"]

IMAGE_MODES = tuple(wds_decode.imagespecs.keys())
AV_MODES = ("torch", "AVDecoder", "pyav")

#: Parts webdataset would unpickle; ``pth`` (a torch checkpoint) is a pickle too.
PICKLE_EXTENSIONS = ("pyd", "pickle", "pkl")
CODE_EXTENSIONS = PICKLE_EXTENSIONS + ("pth",)

class _CodePartHandler:
    """Pickled parts and torch checkpoints: webdataset's loaders if trusted, else refused.

    Untrusted ``pth`` parts still load with ``torch.load(weights_only=True)``, which unpickles
    tensors and plain containers only. The extension is matched case-sensitively, as webdataset's
    basic handlers match it: a ``PKL`` or ``Pth`` part is never unpickled there (Energon keeps its
    bytes), so it stays bytes here too, trusted or not.
    """

    def __init__(self, trusted: bool):
        self.trusted = trusted

    def __call__(self, key: str, data: bytes) -> Any:
        ext = key.rsplit(".", 1)[-1]
        if ext not in CODE_EXTENSIONS:
            return None
        if self.trusted:
            return wds_decode.decoders[ext](data)
        part = key.lstrip(".")
        if ext != "pth":
            raise untrusted(f"pickled part {part!r}", UNTRUSTED_WHERE)
        try:
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as exc:
            raise untrusted(
                f"part {part!r}, a torch checkpoint holding objects other than tensors", UNTRUSTED_WHERE
            ) from exc


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
    AV handler (``av_decode``); ``txt``, ``json``, ``cls``, ``npy``, … through webdataset's basic
    handlers. Unknown extensions stay ``bytes``, and so do the basic ones in another case (``TXT``,
    ``PKL``: webdataset matches them case-sensitively); image and AV extensions match in any case.

    Safe by default: pickled parts (``pyd``, ``pickle``, ``pkl``, also inside ``.gz``) and PostScript
    images (EPS, which Pillow runs in Ghostscript to draw; whatever the part's extension)
    raise :class:`UntrustedCodeError` unless ``trust_dataset_code`` (with ``guess_content``, one
    whose bytes are an image, audio or video is decoded as that, as Energon's, nothing unpickled);
    untrusted ``pth`` parts load with ``torch.load(weights_only=True)``. Images, videos and audio
    whose headers promise more pixels or a longer duration than the limits raise
    :class:`MediaTooLargeError` before decoding, and so are parts over ``max_part_bytes``: a ``.gz`` part
    inflating past it (inflated in chunks, never whole), a ``json``/``txt``/``npy``/… part larger.

    Args:
        image_decode: one of webdataset's image specs (``torchrgb`` = float CHW in [0, 1]).
        av_decode: ``"AVDecoder"`` (lazy decoder object), ``"torch"`` (decoded tensors) or ``"pyav"``.
        video_decode_audio: with ``av_decode="torch"``, also decode a video's audio track (a video
            without one raises :class:`SampleException`, as Energon's asserts).
        guess_content: sniff the content type with ``filetype`` instead of trusting the extension.
        trust_dataset_code: unpickle ``pyd``/``pickle``/``pkl`` parts, fully ``torch.load`` ``pth`` and
            draw PostScript (EPS) images with Ghostscript.
        max_image_pixels: most pixels (width × height) an image may have; ``None`` follows
            ``PIL.Image.MAX_IMAGE_PIXELS`` when decoding (no limit if that is ``None``). PIL itself
            refuses images over twice its own value, whatever this limit.
        max_video_pixels: most pixels a video frame may have (default 7680×4320×2); ``None``: no limit.
        max_av_duration_s: longest duration of a video or audio part (default 6 h); ``None``: no limit.
        max_part_bytes: most bytes a ``.gz`` part inflates to, and most bytes of a part parsed by the
            basic handlers (``json``, ``txt``, ``cls``, ``mp``, ``npy``/``npz`` also by their headers'
            declared arrays); default 512 MiB; ``None``: no limit.

    Raises:
        ValueError: for an unknown ``image_decode`` or ``av_decode``, or a limit that is not positive.
        TypeError: for a non-bool ``trust_dataset_code`` or a limit that is not a number.

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
        trust_dataset_code: bool = False,
        max_image_pixels: Optional[int] = None,
        max_video_pixels: Optional[int] = DEFAULT_MAX_VIDEO_PIXELS,
        max_av_duration_s: Optional[float] = DEFAULT_MAX_AV_DURATION_S,
        max_part_bytes: Optional[int] = DEFAULT_MAX_PART_BYTES,
    ):
        if image_decode not in IMAGE_MODES:
            raise ValueError(f"SampleDecoder: image_decode={image_decode!r} is not one of {list(IMAGE_MODES)}")
        if av_decode not in AV_MODES:
            raise ValueError(f"SampleDecoder: av_decode={av_decode!r} is not one of {list(AV_MODES)}")
        _check_trust(trust_dataset_code)
        check_limit("SampleDecoder", "max_image_pixels", max_image_pixels)
        check_limit("SampleDecoder", "max_video_pixels", max_video_pixels)
        check_limit("SampleDecoder", "max_av_duration_s", max_av_duration_s, integer=False)
        check_limit("SampleDecoder", "max_part_bytes", max_part_bytes)
        self.image_decode = image_decode
        self.av_decode = av_decode
        self.video_decode_audio = video_decode_audio
        self.guess_content = guess_content
        self.trust_dataset_code = trust_dataset_code
        self.max_image_pixels = max_image_pixels
        self.max_video_pixels = max_video_pixels
        self.max_av_duration_s = max_av_duration_s
        self.max_part_bytes = max_part_bytes
        self._decoder: Optional[wds_decode.Decoder] = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_decoder"] = None  # handlers are rebuilt where the decoder runs
        return state

    def with_trust(self, trusted: bool) -> SampleDecoder:
        """A copy of this decoder with ``trust_dataset_code=trusted``.

        Raises:
            TypeError: when ``trusted`` is not a bool.
        """
        _check_trust(trusted)
        clone = copy.copy(self)
        clone.trust_dataset_code = trusted
        clone._decoder = None
        return clone

    def _build(self) -> wds_decode.Decoder:
        media: list = [
            ImageHandler(self.image_decode, self.max_image_pixels, self.trust_dataset_code),
            AVWebdatasetDecoder(
                av_decode=self.av_decode,
                video_decode_audio=self.video_decode_audio,
                max_video_pixels=self.max_video_pixels,
                max_av_duration_s=self.max_av_duration_s,
            ),
        ]
        if self.guess_content:
            media = [_GuessingHandler(h) for h in media]
        # Runs after the gz pre-handler and before the basic handlers, which never see pickles.
        # The media handlers go first, as in Energon, so guess_content decodes an image stored as
        # ``.pkl`` as an image, trusted or not: they read a pickle part only where its magic bytes say
        # image, audio or video, and then decode it as that, never unpickling it. Any other pickle part
        # reaches the code handler, which refuses it untrusted.
        # webdataset's own gz filter and basic handlers, with max_part_bytes (decode/part_limits.py).
        return wds_decode.Decoder(
            [*media, _CodePartHandler(self.trust_dataset_code)],
            pre=[GzipPartHandler(self.max_part_bytes)],
            post=[BoundedBasicHandler(self.max_part_bytes)],
        )

    def decode_part(self, part: str, data: bytes) -> Any:
        """Decode the bytes of one part (``jpg``, ``caption.txt``, ``json``, …)."""
        if self._decoder is None:
            self._decoder = self._build()
        return self._decoder.decode1(part, data)

    def decode(self, fname: str, raw: bytes) -> Any:
        """Decode a file by its name (``"images/0001.jpg"``), e.g. an auxiliary file of a crude sample."""
        return self.decode_part(file_part_name(fname), raw)

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
            "trust_dataset_code": self.trust_dataset_code,
            "max_image_pixels": self.max_image_pixels,
            "max_video_pixels": self.max_video_pixels,
            "max_av_duration_s": self.max_av_duration_s,
            "max_part_bytes": self.max_part_bytes,
        }

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"SampleDecoder({args})"

    @staticmethod
    def is_av_part(part: str) -> bool:
        """Whether a part name has an audio/video extension."""
        return part.rsplit(".", 1)[-1].lower() in AV_EXTENSIONS


def file_part_name(fname: str) -> str:
    """The part name (extension) of a file name as webdataset names a sample's files, or ``"."``.

    The part follows the first dot of the base name (``"a/b.c.json"`` -> ``"c.json"``); a base
    name that starts with a dot takes the folder before it as its key (``"d/.json"`` -> ``"json"``)
    when that folder's name has no dot. A name without a key or a part (``"json"``, ``".json"``)
    gets ``"."``, which no handler decodes by name (as Energon, it stays bytes unless the content
    is guessed).

    Example:
        >>> file_part_name("images/0001.jpg"), file_part_name("json"), file_part_name("d/.json")
        ('jpg', '.', 'json')
    """
    folder, slash, base = fname.rpartition("/")
    key, dot, part = base.partition(".")
    if not dot:
        return "."
    if key or (slash and "." not in folder.rpartition("/")[2]):
        return part
    return "."


def decodes_by_part(decoder: Any) -> bool:
    """Whether ``decoder`` decodes a sample part by part with :meth:`SampleDecoder.decode_part`.

    True for our ``SampleDecoder`` and subclasses that keep its ``__call__``. Anything else, e.g. a
    subclass overriding ``__call__`` or a decoder class of the user's own, is given the whole raw
    sample as Energon gives it (``decoder(sample)``), so its own decoding runs.

    Example:
        >>> decodes_by_part(SampleDecoder()), decodes_by_part(lambda sample: sample)
        (True, False)
    """
    return isinstance(decoder, SampleDecoder) and type(decoder).__call__ is SampleDecoder.__call__


def trusting(decoder: Any) -> Any:
    """``decoder`` allowed to run dataset code: ``with_trust(True)`` where it has that method (ours);
    a decoder of another kind is the user's own code and is returned as it is."""
    with_trust = getattr(decoder, "with_trust", None)
    return with_trust(True) if callable(with_trust) else decoder


def _check_trust(trusted: Any) -> None:
    if not isinstance(trusted, bool):
        raise TypeError(f"SampleDecoder: trust_dataset_code must be a bool, got {trusted!r}")


_ENERGON_DECODER_SETTINGS = ("image_decode", "av_decode", "video_decode_audio", "guess_content")


def as_sample_decoder(decoder: Any) -> Any:
    """Ours as it is; megatron.energon's own ``SampleDecoder`` (a task encoder written for Energon
    keeps its ``decoder = SampleDecoder(...)``) becomes ours with the same four settings, so it gets
    our media limits and trust rules. Anything else is returned unchanged.

    Example:
        >>> as_sample_decoder(SampleDecoder(image_decode="pil")).image_decode
        'pil'
    """
    if decoder is None or isinstance(decoder, SampleDecoder):
        return decoder
    settings = getattr(decoder, "_config", None)
    if (
        type(decoder).__name__ == "SampleDecoder"
        and type(decoder).__module__.startswith("megatron.energon")
        and isinstance(settings, dict)
        and set(settings) <= set(_ENERGON_DECODER_SETTINGS)
    ):
        return SampleDecoder(**settings)
    return decoder
