"""Audio/video part handler for ``SampleDecoder``: lazy decoder, decoded tensors or a PyAV container."""

from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING, Any, Optional

from energon_ray.errors import SampleException

if TYPE_CHECKING:
    from energon_ray.decode.av import AVDecoder

# PyAV (and with it FFmpeg's libraries: ~16 MiB and ~80 ms per process) is imported at the first
# audio or video part, not with the decoder: most datasets have none, and every Ray worker that
# decodes images would otherwise load it.

VIDEO_EXTENSIONS = ("mp4", "mkv", "avi", "mov", "webm", "flv")
AUDIO_EXTENSIONS = ("wav", "flac", "mp3", "ogg")
AV_EXTENSIONS = VIDEO_EXTENSIONS + AUDIO_EXTENSIONS

AV_DECODE_MODES = ("AVDecoder", "torch", "pyav")

#: Default per-frame pixel limit: two 8K UHD frames (7680×4320×2 = 66,355,200 pixels).
DEFAULT_MAX_VIDEO_PIXELS = 7680 * 4320 * 2
#: Default duration limit: 6 hours.
DEFAULT_MAX_AV_DURATION_S = 6 * 3600.0


def check_limit(owner: str, name: str, value: Any, integer: bool = True) -> None:
    """Validate a size limit: ``None`` (no limit) or a positive number (an int if ``integer``).

    Raises:
        TypeError: for a value of another type.
        ValueError: for zero, a negative value or NaN.
    """
    if value is None:
        return
    kinds = (int,) if integer else (Real,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an int" if integer else "a number"
        raise TypeError(f"{owner}: {name} must be {kind} or None, got {value!r}")
    if not value > 0:  # also NaN
        raise ValueError(f"{owner}: {name} must be positive (None for no limit), got {value!r}")


class AVHandler:
    """webdataset-style handler ``(key, data) -> decoded | None`` for audio and video parts.

    The part's last extension decides whether the handler applies (``"mp4"``, ``".mp4"`` and
    ``"clip.video.mp4"`` all do); other parts get ``None`` so the next handler can try. Before
    anything is decoded, the container's headers are checked against the limits (in every mode,
    also the lazy one); media whose headers cannot be read are refused once decoded.

    Args:
        av_decode: ``"AVDecoder"`` returns a lazy :class:`AVDecoder` (nothing decoded yet);
            ``"torch"`` decodes the whole file to an :class:`AVData` of tensors; ``"pyav"`` returns
            the opened ``av.container.InputContainer`` (the caller closes it).
        video_decode_audio: with ``"torch"``, also decode a video's audio track (a video without one
            raises :class:`SampleException`, as Energon's asserts).
        max_video_pixels: most pixels (width × height) a video frame may have; ``None``: no limit.
        max_av_duration_s: longest duration in seconds the headers may state; ``None``: no limit.

    Raises:
        ValueError: for an unknown ``av_decode`` or a limit that is not positive.
        TypeError: for a limit that is not a number.

    Example:
        >>> AVHandler()("caption.txt", b"hello") is None
        True
        >>> AVHandler()("clip.mp4", b"\\x00\\x01")
        AVDecoder(key='clip.mp4', bytes=2)
    """

    def __init__(
        self,
        av_decode: str = "AVDecoder",
        video_decode_audio: bool = False,
        max_video_pixels: Optional[int] = DEFAULT_MAX_VIDEO_PIXELS,
        max_av_duration_s: Optional[float] = DEFAULT_MAX_AV_DURATION_S,
    ):
        if av_decode not in AV_DECODE_MODES:
            raise ValueError(f"AVHandler: av_decode={av_decode!r} is not one of {list(AV_DECODE_MODES)}")
        check_limit("AVHandler", "max_video_pixels", max_video_pixels)
        check_limit("AVHandler", "max_av_duration_s", max_av_duration_s, integer=False)
        self.av_decode = av_decode
        self.video_decode_audio = video_decode_audio
        self.max_video_pixels = max_video_pixels
        self.max_av_duration_s = max_av_duration_s

    def __call__(self, key: str, data: bytes) -> Optional[Any]:
        """Decode ``data`` if ``key`` names an audio/video part, else return ``None``.

        Raises:
            MediaTooLargeError: when the headers promise larger frames or a longer duration than allowed.
            SampleException: in ``"torch"`` and ``"pyav"`` modes, when the media cannot be read.
        """
        ext = key.rsplit(".", 1)[-1].lower()
        if ext not in AV_EXTENSIONS:
            return None
        key = key.lstrip(".")  # webdataset passes ".mp4"; messages should name the part as "mp4"
        from energon_ray.decode.av import AVDecoder
        from energon_ray.decode.av._container import open_container
        from energon_ray.decode.av._metadata import check_limits

        try:
            container = open_container(bytes(data), key)
        except SampleException:
            if self.av_decode == "AVDecoder":
                return AVDecoder(data, key=key)  # lazy: the same error comes when it is decoded
            raise
        try:
            check_limits(container, key, self.max_video_pixels, self.max_av_duration_s)
        except BaseException:
            container.close()
            raise
        if self.av_decode == "pyav":
            return container
        container.close()
        decoder = AVDecoder(data, key=key)
        if self.av_decode == "torch":
            return decoder.get_frames(video_decode_audio=self.video_decode_audio)
        return decoder

    def __repr__(self) -> str:
        return (
            f"AVHandler(av_decode={self.av_decode!r}, video_decode_audio={self.video_decode_audio!r}, "
            f"max_video_pixels={self.max_video_pixels!r}, max_av_duration_s={self.max_av_duration_s!r})"
        )


class AVWebdatasetDecoder(AVHandler):
    """Energon's name and signature for the audio/video handler: ``(key, data) -> decoded | None``.

    The handler :class:`~energon_ray.SampleDecoder` uses for audio and video parts; Energon users
    who put ``AVWebdatasetDecoder(...)`` in a webdataset handler list get the same behaviour as
    :class:`AVHandler`, with the same limits.

    Args:
        video_decode_audio: with ``av_decode="torch"``, also decode the audio track of videos.
        av_decode: ``"AVDecoder"`` (lazy decoder), ``"torch"`` (an ``AVData`` of tensors) or
            ``"pyav"`` (the opened container).
        max_video_pixels / max_av_duration_s: as in :class:`AVHandler`.

    Example:
        >>> AVWebdatasetDecoder(video_decode_audio=False)("sample.mp4", b"\\x00")
        AVDecoder(key='sample.mp4', bytes=1)
        >>> AVWebdatasetDecoder(False)("txt", b"hi") is None
        True
    """

    def __init__(
        self,
        video_decode_audio: bool,
        av_decode: str = "AVDecoder",
        max_video_pixels: Optional[int] = DEFAULT_MAX_VIDEO_PIXELS,
        max_av_duration_s: Optional[float] = DEFAULT_MAX_AV_DURATION_S,
    ):
        super().__init__(
            av_decode=av_decode, video_decode_audio=video_decode_audio,
            max_video_pixels=max_video_pixels, max_av_duration_s=max_av_duration_s,
        )  # fmt: skip

    def read_av_data(self, data: bytes) -> AVDecoder:
        """A lazy :class:`AVDecoder` over ``data`` (nothing decoded, no limits checked)."""
        from energon_ray.decode.av import AVDecoder

        return AVDecoder(data)

    def __repr__(self) -> str:
        return super().__repr__().replace("AVHandler(", "AVWebdatasetDecoder(", 1)
