"""Safe by default (issue 12): SampleDecoder refuses pickled parts unless trusted, and refuses images,
videos and audio whose headers promise too many pixels or too long a duration, before decoding."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import shutil
import zipfile
from typing import List

import av
import numpy as np
import PIL.Image
import pytest
import torch

from energon_ray.decode.av import AVData, AVDecoder
from energon_ray.decode.av_handler import DEFAULT_MAX_AV_DURATION_S, DEFAULT_MAX_VIDEO_PIXELS, AVHandler
from energon_ray.decode.part_limits import DEFAULT_MAX_PART_BYTES, INFLATE_CHUNK
from energon_ray.decode.sample_decoder import SampleDecoder
from energon_ray.errors import MediaTooLargeError, SampleException, UntrustedCodeError

#: Calls made by unpickling a :class:`_Tripwire`; stays empty while nothing is unpickled.
TRIPPED: List[str] = []


def _trip(tag: str) -> str:
    TRIPPED.append(tag)
    return tag


class _Tripwire:
    """Unpickles by calling :func:`_trip`: code the dataset runs in the worker when unpickled."""

    def __reduce__(self):
        return _trip, ("ran",)


@pytest.fixture(autouse=True)
def _reset_tripwire() -> None:
    TRIPPED.clear()


def _image(size, fmt: str, mode: str = "RGB") -> bytes:
    """A real encoded image of ``size`` (width, height) with some structure in it."""
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width]
    pixels = np.stack([(xx * 7) % 256, (yy * 5) % 256, ((xx + yy) * 3) % 256], axis=2).astype(np.uint8)
    buf = io.BytesIO()
    PIL.Image.fromarray(pixels).convert(mode).save(buf, format=fmt)
    return buf.getvalue()


def _video(width: int = 64, height: int = 48, n_frames: int = 10, fps: int = 25) -> bytes:
    """A real H.264 mp4 of ``n_frames`` frames."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(n_frames):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), i * 20, np.uint8), format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return buf.getvalue()


def _audio(fmt: str, seconds: float, rate: int = 8000, chunk_s: float = 1.0) -> bytes:
    """A real mono ``wav`` (PCM) or ``flac`` file of a tone lasting ``seconds``."""
    buf = io.BytesIO()
    total, chunk = int(rate * seconds), int(rate * chunk_s)
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream("pcm_s16le" if fmt == "wav" else "flac", rate=rate)
        stream.layout = "mono"
        for start in range(0, total, chunk):
            t = np.arange(start, min(start + chunk, total)) / rate
            samples = (3000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)[None]
            frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, start
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return buf.getvalue()


def _torch_file(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# ------------------------------------------------------------------ pickles


@pytest.mark.parametrize("part", ["pyd", "data.pyd", "pickle", "meta.pickle", "pkl"])
def test_pickled_parts_are_refused_by_default(part):
    """pyd/pickle/pkl parts raise UntrustedCodeError naming the part; nothing is unpickled."""
    with pytest.raises(UntrustedCodeError, match=f"pickled part '{part}'.*trust_dataset_code=True"):
        SampleDecoder().decode_part(part, pickle.dumps(_Tripwire()))
    assert TRIPPED == []


@pytest.mark.parametrize("trusted", [False, True])
@pytest.mark.parametrize("part", ["x.PKL", "state.Pyd", "PICKLE", "model.PTH", "w.Pth"])
def test_code_extensions_in_another_case_stay_bytes_as_in_energon(part, trusted):
    """webdataset unpickles only lower-case pyd/pickle/pkl/pth parts, so Energon keeps a PKL's or PTH's bytes: so do we, trusted or not."""
    data = _torch_file({"w": torch.ones(2)}) if part.lower().endswith("pth") else pickle.dumps(_Tripwire())
    assert SampleDecoder(trust_dataset_code=trusted).decode_part(part, data) == data
    assert TRIPPED == []


def test_gzipped_pickle_is_refused_by_default():
    """A pickle inside .gz is refused too, once webdataset's gz handler has unpacked it."""
    with pytest.raises(UntrustedCodeError, match="pickled part 'data.pyd'"):
        SampleDecoder().decode_part("data.pyd.gz", gzip.compress(pickle.dumps(_Tripwire())))
    assert TRIPPED == []


@pytest.mark.parametrize("part", ["pyd", "data.pickle", "pkl", "data.pyd.gz"])
def test_pickled_parts_unpickle_when_trusted(part):
    """With with_trust(True) the pickled parts unpickle as webdataset does (running their code)."""
    data = pickle.dumps({"x": (1, 2), "t": _Tripwire()})
    if part.endswith(".gz"):
        data = gzip.compress(data)
    assert SampleDecoder().with_trust(True).decode_part(part, data) == {"x": (1, 2), "t": "ran"}
    assert TRIPPED == ["ran"]


def test_trust_dataset_code_keyword_unpickles():
    """SampleDecoder(trust_dataset_code=True) is the same opt-in as with_trust(True)."""
    assert SampleDecoder(trust_dataset_code=True).decode_part("pickle", pickle.dumps([1, "a"])) == [1, "a"]


def test_pth_with_only_tensors_loads_untrusted():
    """An untrusted .pth of tensors and plain containers loads with torch.load(weights_only=True)."""
    state = {"w": torch.arange(6.0).reshape(2, 3), "meta": {"step": 3, "names": ["a", "b"]}}
    out = SampleDecoder().decode_part("model.pth", _torch_file(state))
    assert torch.equal(out["w"], state["w"]) and out["meta"] == state["meta"]


def test_pth_with_a_custom_object_is_refused_untrusted_and_loads_trusted():
    """A .pth that pickles a custom object is refused untrusted (nothing runs) and loads when trusted."""
    data = _torch_file({"w": torch.ones(2), "obj": _Tripwire()})
    with pytest.raises(UntrustedCodeError, match="part 'ckpt.pth', a torch checkpoint"):
        SampleDecoder().decode_part("ckpt.pth", data)
    assert TRIPPED == []
    out = SampleDecoder().with_trust(True).decode_part("ckpt.pth", data)
    assert torch.equal(out["w"], torch.ones(2)) and out["obj"] == "ran" and TRIPPED == ["ran"]


#: An EPS image: a PostScript program, which Pillow draws by running it in Ghostscript.
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nnewpath 0 0 moveto 8 8 lineto stroke\nshowpage\n"


@pytest.mark.parametrize("image_decode", ["torchrgb", "pil"])
@pytest.mark.parametrize("part", ["eps", "ps", "jpg", "photo.png"])
def test_postscript_images_are_refused_untrusted_whatever_their_extension(part, image_decode):
    """webdataset's image handler takes eps/ps parts and Pillow opens EPS bytes under any image name,
    then runs them in Ghostscript to draw them: untrusted, that is refused before any pixel is drawn."""
    with pytest.raises(UntrustedCodeError) as info:
        SampleDecoder(image_decode=image_decode).decode_part(part, EPS)
    assert str(info.value).startswith(
        f"SampleDecoder(trust_dataset_code=False): refusing to run code the dataset brings (part '{part}', an image "
        "in PostScript (EPS): a program, which Pillow would run in Ghostscript to draw it); "
    )


def test_postscript_images_go_to_pillow_when_trusted():
    """Trusted, an EPS part is drawn as Energon draws it (Pillow and Ghostscript; where Ghostscript is
    not installed, Pillow's own error says so)."""
    decoder = SampleDecoder(trust_dataset_code=True)
    if shutil.which("gs") is None:
        with pytest.raises(OSError, match="^Unable to locate Ghostscript on paths$"):
            decoder.decode_part("eps", EPS)
    else:
        assert decoder.decode_part("eps", EPS).shape == (3, 8, 8)


def test_with_trust_returns_a_copy():
    """with_trust sets the flag on a copy that keeps the other settings; the original is unchanged."""
    dec = SampleDecoder(image_decode="pil", max_image_pixels=500)
    dec.decode_part("txt", b"warm up")
    trusted = dec.with_trust(True)
    assert trusted is not dec and dec.trust_dataset_code is False and trusted.trust_dataset_code is True
    assert {**dec.config(), "trust_dataset_code": True} == trusted.config()
    assert trusted.with_trust(False).config() == dec.config()
    with pytest.raises(UntrustedCodeError):
        dec.decode_part("pyd", pickle.dumps(1))
    assert trusted.decode_part("pyd", pickle.dumps(1)) == 1


@pytest.mark.parametrize("value", [1, "yes", None])
def test_trust_must_be_a_bool(value):
    """trust_dataset_code and with_trust accept only True/False."""
    with pytest.raises(TypeError, match="trust_dataset_code must be a bool"):
        SampleDecoder(trust_dataset_code=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trust_dataset_code must be a bool"):
        SampleDecoder().with_trust(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("trusted", [False, True])
def test_pickling_the_decoder_keeps_trust_and_limits(trusted):
    """A decoder shipped to a worker (pickled after use) keeps its trust flag and its limits."""
    dec = SampleDecoder(
        trust_dataset_code=trusted, max_image_pixels=10_000, max_video_pixels=1000, max_av_duration_s=0.25
    )
    dec.decode_part("txt", b"warm up")
    clone = pickle.loads(pickle.dumps(dec))
    assert clone.config() == dec.config()
    assert (clone.trust_dataset_code, clone.max_image_pixels) == (trusted, 10_000)
    assert (clone.max_video_pixels, clone.max_av_duration_s) == (1000, 0.25)
    if trusted:
        assert clone.decode_part("pyd", pickle.dumps(7)) == 7
    else:
        with pytest.raises(UntrustedCodeError):
            clone.decode_part("pyd", pickle.dumps(7))
    with pytest.raises(MediaTooLargeError):
        clone.decode_part("png", _image((300, 300), "PNG"))
    with pytest.raises(MediaTooLargeError):
        clone.decode_part("mp4", _video())
    with pytest.raises(MediaTooLargeError):
        clone.decode_part("wav", _audio("wav", 1.0))


def test_config_names_trust_and_limits_with_their_defaults():
    """config() carries the safety settings, and SampleDecoder(**config()) rebuilds the same decoder."""
    config = SampleDecoder().config()
    assert config["trust_dataset_code"] is False and config["max_image_pixels"] is None
    assert config["max_video_pixels"] == DEFAULT_MAX_VIDEO_PIXELS == 7680 * 4320 * 2
    assert config["max_av_duration_s"] == DEFAULT_MAX_AV_DURATION_S == 6 * 3600
    assert config["max_part_bytes"] == DEFAULT_MAX_PART_BYTES == 512 * 1024 * 1024
    custom = SampleDecoder(
        trust_dataset_code=True, max_image_pixels=5, max_video_pixels=None, max_av_duration_s=2, max_part_bytes=9
    )
    assert SampleDecoder(**custom.config()).config() == custom.config()


# ------------------------------------------------------------------- images


@pytest.mark.parametrize("ext,fmt", [("jpg", "JPEG"), ("png", "PNG")])
def test_image_over_the_limit_is_refused_and_under_it_decodes(ext, fmt):
    """300×300 with max_image_pixels=10_000 raises MediaTooLargeError; 90×100 decodes."""
    dec = SampleDecoder(max_image_pixels=10_000)
    refused = rf"img\.{ext}: image of 300×300 = 90,000 pixels .* 10,000 .*max_image_pixels"
    with pytest.raises(MediaTooLargeError, match=refused):
        dec.decode_part(f"img.{ext}", _image((300, 300), fmt))
    assert dec.decode_part(f"img.{ext}", _image((90, 100), fmt)).shape == (3, 100, 90)
    assert dec.decode_part(f"img.{ext}", _image((100, 100), fmt)).shape == (3, 100, 100)  # the limit itself is allowed


def test_image_is_refused_from_its_header_before_decoding():
    """A JPEG cut after its header cannot be decoded, yet the limit refuses it: only the header was read."""
    truncated = _image((300, 300), "JPEG")[:700]
    with pytest.raises(OSError, match="truncated"):
        SampleDecoder(max_image_pixels=1_000_000).decode_part("jpg", truncated)
    with pytest.raises(MediaTooLargeError, match="300×300"):
        SampleDecoder(max_image_pixels=10_000).decode_part("jpg", truncated)


@pytest.mark.parametrize(
    "ext,fmt", [("webp", "WEBP"), ("gif", "GIF"), ("bmp", "BMP"), ("tiff", "TIFF"), ("ppm", "PPM"), ("tga", "TGA")]
)
def test_every_image_format_is_checked(ext, fmt):
    """The limit applies to every format the image handler decodes, not only JPEG/PNG."""
    with pytest.raises(MediaTooLargeError, match="200×150"):
        SampleDecoder(max_image_pixels=10_000).decode_part(f"x.{ext.upper()}", _image((200, 150), fmt))
    value = SampleDecoder(max_image_pixels=40_000).decode_part(f"x.{ext}", _image((200, 150), fmt))
    assert value.shape == (3, 150, 200)


def test_guessed_images_are_checked():
    """With guess_content an image under an unknown extension is checked too."""
    with pytest.raises(MediaTooLargeError, match="300×300"):
        SampleDecoder(guess_content=True, max_image_pixels=10_000).decode_part("bin", _image((300, 300), "PNG"))


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_default_limit_follows_pils_max_image_pixels_at_decode_time(monkeypatch):
    """Without max_image_pixels, PIL.Image.MAX_IMAGE_PIXELS as it is when decoding is the limit."""
    dec = SampleDecoder(image_decode="rgb8")
    png = _image((300, 300), "PNG")
    assert dec.decode_part("png", png).shape == (300, 300, 3)
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 50_000)
    refused = r"300×300 = 90,000 pixels .* 50,000 pixels \(PIL\.Image\.MAX_IMAGE_PIXELS\)"
    with pytest.raises(MediaTooLargeError, match=refused):
        dec.decode_part("png", png)
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 1000)  # PIL's own refusal (over twice its limit)
    with pytest.raises(MediaTooLargeError, match="png: image refused before decoding.*max_image_pixels"):
        dec.decode_part("png", png)
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", None)
    assert dec.decode_part("png", png).shape == (300, 300, 3)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_explicit_limit_overrides_pils(monkeypatch):
    """An explicit max_image_pixels is used whatever PIL's value (None included)."""
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", None)
    with pytest.raises(MediaTooLargeError, match="10,000"):
        SampleDecoder(max_image_pixels=10_000).decode_part("png", _image((300, 300), "PNG"))
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 80_000)
    assert SampleDecoder(max_image_pixels=100_000).decode_part("png", _image((300, 300), "PNG")).shape == (3, 300, 300)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_small_png_bomb_is_refused_with_the_default_limit():
    """A 10000×10000 one-bit PNG of a few KB (1.2 GB as torchrgb) is refused by default."""
    buf = io.BytesIO()
    PIL.Image.new("1", (10_000, 10_000)).save(buf, format="PNG")
    assert len(buf.getvalue()) < 100_000
    with pytest.raises(MediaTooLargeError, match="10000×10000 = 100,000,000 pixels"):
        SampleDecoder().decode_part("png", buf.getvalue())


@pytest.mark.parametrize(
    "kwargs,error",
    [
        (dict(max_image_pixels=0), ValueError),
        (dict(max_image_pixels=-5), ValueError),
        (dict(max_image_pixels=1.5), TypeError),
        (dict(max_video_pixels=0), ValueError),
        (dict(max_video_pixels=True), TypeError),
        (dict(max_av_duration_s=0), ValueError),
        (dict(max_av_duration_s=-1.0), ValueError),
        (dict(max_av_duration_s=float("nan")), ValueError),
        (dict(max_av_duration_s="1h"), TypeError),
        (dict(max_part_bytes=0), ValueError),
        (dict(max_part_bytes=2.0**20), TypeError),
    ],
)
def test_invalid_limits_raise_in_init(kwargs, error):
    """Zero, negative or non-numeric limits raise when the decoder is built, naming the keyword."""
    (name,) = kwargs
    with pytest.raises(error, match=f"{name} must be"):
        SampleDecoder(**kwargs)


# ------------------------------------------------- parts that inflate: gzip, json, npy/npz (max_part_bytes)

MiB = 1024 * 1024


def test_a_gzip_bomb_is_refused_naming_part_sizes_and_limit():
    """16 MiB of JSON whitespace in a gzip part of a few KiB: refused past max_part_bytes=1 MiB."""
    bomb = gzip.compress(b"[" + b" " * (16 * MiB) + b"]")
    assert len(bomb) < 40_000
    message = (
        rf"^json\.gz: gzip of {len(bomb):,} bytes inflates to more than 1,048,576 bytes, over the limit of "
        r"1,048,576 bytes per part \(max_part_bytes\); raise it with SampleDecoder\(max_part_bytes=\.\.\.\)"
    )
    with pytest.raises(MediaTooLargeError, match=message):
        SampleDecoder(max_part_bytes=MiB).decode_part("json.gz", bomb)
    assert SampleDecoder(max_part_bytes=17 * MiB).decode_part("json.gz", bomb) == []
    assert SampleDecoder().decode_part("json.gz", bomb) == []


def test_a_gzip_part_is_refused_before_its_end_is_inflated():
    """Inflated in chunks: a truncated gzip of 8 MiB is refused at the limit, before the missing end
    is reached (inflating it whole first would fail on the truncation instead)."""
    truncated = gzip.compress(bytes(8 * MiB))[:-100]
    with pytest.raises(EOFError):
        SampleDecoder(max_part_bytes=None).decode_part("bin.gz", truncated)
    with pytest.raises(MediaTooLargeError, match=r"^bin\.gz: gzip of .* inflates to more than 2,097,152 bytes"):
        SampleDecoder(max_part_bytes=2 * MiB).decode_part("bin.gz", truncated)
    assert INFLATE_CHUNK <= MiB


@pytest.mark.parametrize("part, value", [("txt.gz", "héllo"), ("json.gz", {"a": [1, 2]}), ("cls.gz", 7), ("bin.gz", None)])
def test_gzip_parts_under_the_limit_decode_as_webdatasets_filter_decodes_them(part, value):
    """Under the limit a .gz part decodes by the rest of its name, as webdataset's gz filter does;
    a limit of exactly the inflated size is allowed."""
    import webdataset.autodecode as wds_decode

    raw = {"txt.gz": "héllo".encode(), "json.gz": b'{"a": [1, 2]}', "cls.gz": b"7", "bin.gz": b"\x00\x01raw"}[part]
    data = gzip.compress(raw) + gzip.compress(b"")  # a second (empty) member, as gzip reads it
    ours = SampleDecoder(max_part_bytes=len(raw)).decode_part(part, data)
    assert ours == wds_decode.Decoder([]).decode1(part, data) == (raw if value is None else value)


def test_parts_parsed_by_the_basic_handlers_are_refused_over_the_limit():
    """A json/txt part of more bytes than max_part_bytes is refused before parsing; at the limit it parses."""
    doc = json.dumps({"caption": "x" * 1000}).encode()
    dec = SampleDecoder(max_part_bytes=len(doc) - 1)
    with pytest.raises(MediaTooLargeError, match=rf"^json: {len(doc):,} bytes, over the limit of {len(doc) - 1:,} bytes"):
        dec.decode_part("json", doc)
    with pytest.raises(MediaTooLargeError, match=r"^caption\.txt: 1,100 bytes, over the limit"):
        dec.decode_part("caption.txt", b"y" * 1100)
    assert SampleDecoder(max_part_bytes=len(doc)).decode_part("json", doc) == {"caption": "x" * 1000}
    assert dec.decode_part("bin", b"z" * 2000) == b"z" * 2000  # not parsed: stays bytes, no limit


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_npy_and_npz_parts_are_refused_by_the_arrays_their_headers_declare():
    """A forged npy header declaring a 2**40-byte array (numpy would allocate it before reading), a
    compressed npz of 4 MiB of zeros and a zip of 3 MiB of other members are refused at
    max_part_bytes=1 MiB; real small ones decode."""
    small = _npy(np.arange(6, dtype=np.int64))
    forged = small.replace(b"(6,)", b"(137438953472,)".ljust(4))
    forged = forged[:8] + (int.from_bytes(forged[8:10], "little") + len(forged) - len(small)).to_bytes(2, "little") + forged[10:]
    dec = SampleDecoder(max_part_bytes=MiB)
    with pytest.raises(MediaTooLargeError, match=r"^npy: 1,099,511,627,776 bytes once decoded \(as its headers declare\), over the limit"):
        dec.decode_part("npy", forged)
    buf = io.BytesIO()
    np.savez_compressed(buf, a=np.zeros(4 * MiB, np.uint8))
    assert len(buf.getvalue()) < 20_000
    with pytest.raises(MediaTooLargeError, match=r"^feats\.npz: 4,194,\d{3} bytes once decoded \(as its headers declare\)"):
        dec.decode_part("feats.npz", buf.getvalue())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:  # members that are no npy count too
        archive.writestr("notes.txt", b"x" * 100)
        archive.writestr("big.bin", bytes(3 * MiB))
    with pytest.raises(MediaTooLargeError, match=r"^npz: 3,145,828 bytes once decoded"):
        dec.decode_part("npz", buf.getvalue())
    assert dec.decode_part("npy", small).tolist() == list(range(6))
    buf = io.BytesIO()
    np.savez_compressed(buf, a=np.arange(3))
    assert dec.decode_part("npz", buf.getvalue())["a"].tolist() == [0, 1, 2]


# ------------------------------------------------------------ video and audio


@pytest.mark.parametrize("mode", ["AVDecoder", "torch", "pyav"])
def test_video_frames_over_the_limit_are_refused(mode):
    """A 64×48 mp4 with max_video_pixels=1000 is refused in every av_decode mode, also the lazy one."""
    with pytest.raises(MediaTooLargeError, match="clip.mp4: video frames of 64×48 = 3,072 pixels .* 1,000 pixels"):
        SampleDecoder(av_decode=mode, max_video_pixels=1000).decode_part("clip.mp4", _video())


@pytest.mark.parametrize("mode", ["AVDecoder", "torch", "pyav"])
def test_video_longer_than_the_limit_is_refused(mode):
    """A 0.4 s mp4 with max_av_duration_s=0.1 is refused in every av_decode mode."""
    with pytest.raises(MediaTooLargeError, match=r"clip.mp4: media of 0\.4\d* s exceeds the limit of 0\.1 s"):
        SampleDecoder(av_decode=mode, max_av_duration_s=0.1).decode_part("clip.mp4", _video())


def test_video_within_the_limits_decodes():
    """At or under both limits the video is returned as before, in each mode."""
    data = _video()
    limits = dict(max_video_pixels=64 * 48, max_av_duration_s=1.0)
    assert isinstance(SampleDecoder(**limits).decode_part("mp4", data), AVDecoder)
    out = SampleDecoder(av_decode="torch", **limits).decode_part("mp4", data)
    assert isinstance(out, AVData) and out.video_clips[0].shape == (10, 3, 48, 64)
    container = SampleDecoder(av_decode="pyav", **limits).decode_part("mp4", data)
    try:
        assert container.streams.video[0].width == 64
    finally:
        container.close()


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_audio_longer_than_the_limit_is_refused(fmt):
    """A 1 s wav/flac is refused with max_av_duration_s=0.5 and decodes with 2 s."""
    data = _audio(fmt, 1.0)
    with pytest.raises(MediaTooLargeError, match=rf"a\.{fmt}: media of 1\.000 s exceeds the limit of 0\.5 s"):
        SampleDecoder(max_av_duration_s=0.5).decode_part(f"a.{fmt}", data)
    out = SampleDecoder(av_decode="torch", max_av_duration_s=2).decode_part(f"a.{fmt}", data)
    assert out.audio_clips[0].shape == (1, 8000)


def test_six_hours_of_audio_are_refused_by_default():
    """A 1000 Hz flac of 6 h 1 min (under 2 MB) is over the default duration limit."""
    data = _audio("flac", 6 * 3600 + 60, rate=1000, chunk_s=600)
    with pytest.raises(MediaTooLargeError, match="21,660.000 s exceeds the limit of 21,600.0 s"):
        SampleDecoder().decode_part("long.flac", data)
    assert isinstance(SampleDecoder(max_av_duration_s=None).decode_part("long.flac", data), AVDecoder)


def test_av_handler_checks_limits_and_stays_lazy_for_unreadable_media():
    """AVHandler takes the limits itself; bytes no header can be read from still fail only when decoded."""
    with pytest.raises(MediaTooLargeError):
        AVHandler(max_video_pixels=1000)("mp4", _video())
    lazy = AVHandler(max_video_pixels=1000)("mp4", b"not a video")
    with pytest.raises(SampleException, match="cannot open media"):
        lazy.get_video()
    with pytest.raises(ValueError, match="max_av_duration_s"):
        AVHandler(max_av_duration_s=0)


@pytest.mark.parametrize("spec", ["torchrgb", "pil", "rgb8"])
def test_bytes_that_are_no_image_are_named_by_their_first_bytes(spec):
    """A .jpg that holds text: Pillow's UnidentifiedImageError named its stream ("<_io.BytesIO object at
    0x…>"); it names the part and the bytes it starts with, same exception type for every spec."""
    with pytest.raises(PIL.UnidentifiedImageError) as raised:
        SampleDecoder(image_decode=spec).decode_part("jpg", b"caption text, not a JPEG")
    assert str(raised.value) == "jpg: not an image Pillow can identify (its first bytes: b'caption text, no')"
