"""SampleDecoder: every webdataset image mode on real JPEG/PNG bytes, the basic handlers, errors,
pickling and content guessing (Energon 7.4.1's decoder is the oracle for image modes)."""

from __future__ import annotations

import gzip
import io
import json
import pickle

import numpy as np
import pytest
import torch
from megatron.energon.flavors.webdataset.sample_decoder import SampleDecoder as EnergonSampleDecoder
from PIL import Image

from energon_ray.cache.stores import DecodeFileStore, SystemFileStore
from energon_ray.decode.sample_decoder import IMAGE_MODES, SampleDecoder
from energon_ray.errors import SampleException, UntrustedCodeError
from energon_ray.synthetic import encode_image, sample_image

W, H = 10, 6
IMAGE = sample_image(5, (W, H))
ENCODED = {"jpg": encode_image(IMAGE, "JPEG"), "png": encode_image(IMAGE, "PNG")}

#: mode -> (container, shape, dtype, max value bound)
EXPECTED = {
    "l8": (np.ndarray, (H, W), np.uint8, 255),
    "rgb8": (np.ndarray, (H, W, 3), np.uint8, 255),
    "rgba8": (np.ndarray, (H, W, 4), np.uint8, 255),
    "l": (np.ndarray, (H, W), np.float32, 1.0),
    "rgb": (np.ndarray, (H, W, 3), np.float32, 1.0),
    "rgba": (np.ndarray, (H, W, 4), np.float32, 1.0),
    "torchl8": (torch.Tensor, (H, W), torch.uint8, 255),
    "torchrgb8": (torch.Tensor, (3, H, W), torch.uint8, 255),
    "torchrgba8": (torch.Tensor, (4, H, W), torch.uint8, 255),
    "torchl": (torch.Tensor, (H, W), torch.float32, 1.0),
    "torchrgb": (torch.Tensor, (3, H, W), torch.float32, 1.0),
    "torch": (torch.Tensor, (3, H, W), torch.float32, 1.0),
    "torchrgba": (torch.Tensor, (4, H, W), torch.float32, 1.0),
    "pill": (Image.Image, "L", None, None),
    "pil": (Image.Image, "RGB", None, None),
    "pilrgb": (Image.Image, "RGB", None, None),
    "pilrgba": (Image.Image, "RGBA", None, None),
}


def _pil_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_every_webdataset_image_mode_is_listed():
    """IMAGE_MODES holds exactly Energon's/webdataset's 17 image_decode values."""
    assert set(IMAGE_MODES) == set(EXPECTED)


@pytest.mark.parametrize("ext", ["jpg", "png"])
@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_image_mode_gives_the_documented_type_shape_and_dtype(mode, ext):
    """Each image_decode mode decodes a real JPEG/PNG to its container, shape, dtype and value range."""
    value = SampleDecoder(image_decode=mode).decode_part(ext, ENCODED[ext])
    kind, shape, dtype, bound = EXPECTED[mode]
    assert isinstance(value, kind)
    if kind is Image.Image:
        assert value.mode == shape and value.size == (W, H)
        return
    assert tuple(value.shape) == shape
    assert value.dtype == dtype
    assert 0 <= float(value.min()) and float(value.max()) <= bound


@pytest.mark.parametrize("ext", ["jpg", "png"])
@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_image_mode_matches_energons_decoder(mode, ext):
    """Each image mode decodes to exactly what Energon 7.4.1's SampleDecoder produces."""
    ours = SampleDecoder(image_decode=mode).decode_part(ext, ENCODED[ext])
    theirs = EnergonSampleDecoder(image_decode=mode).decode(f"key.{ext}", ENCODED[ext])
    if isinstance(theirs, Image.Image):
        assert (ours.mode, ours.size, ours.tobytes()) == (theirs.mode, theirs.size, theirs.tobytes())
    elif isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    else:
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_torchrgb_is_pillows_pixels_over_255_in_chw(ext):
    """torchrgb (the default) is float32 CHW equal to Pillow's RGB pixels / 255."""
    value = SampleDecoder().decode_part(ext, ENCODED[ext])
    expected = torch.from_numpy(_pil_rgb(ENCODED[ext]).astype(np.float32) / 255.0).permute(2, 0, 1)
    assert torch.allclose(value, expected, atol=1e-6)


def test_png_decodes_losslessly_in_rgb8():
    """rgb8 of a PNG is the original image's pixels, uint8 HWC."""
    value = SampleDecoder(image_decode="rgb8").decode_part("png", ENCODED["png"])
    assert np.array_equal(value, np.asarray(IMAGE))


def test_text_json_cls_npy_and_pickle_parts():
    """txt → str, json → object, cls → int, npy → array, trusted pickle → object, also in a compound name."""
    dec = SampleDecoder(trust_dataset_code=True)
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.int32).reshape(2, 3))
    assert dec.decode_part("txt", "héllo".encode()) == "héllo"
    assert dec.decode_part("caption.txt", b"a cat") == "a cat"
    assert dec.decode_part("json", json.dumps({"a": [1, 2], "b": None}).encode()) == {"a": [1, 2], "b": None}
    assert dec.decode_part("cls", b"7") == 7
    arr = dec.decode_part("npy", buf.getvalue())
    assert isinstance(arr, np.ndarray) and arr.dtype == np.int32 and arr.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert dec.decode_part("pickle", pickle.dumps({"x": (1, 2)})) == {"x": (1, 2)}


def test_unknown_extension_stays_bytes():
    """A part with an extension no handler knows is returned as the raw bytes."""
    assert SampleDecoder().decode_part("weird", b"\x00\x01xyz") == b"\x00\x01xyz"


def test_call_decodes_parts_and_passes_meta_keys_through():
    """Calling the decoder on a raw sample decodes byte parts and leaves __meta__ keys and non-bytes alone."""
    raw = {"__key__": "k", "__restore_key__": ("Webdataset", 1), "jpg": ENCODED["jpg"], "txt": b"cap", "done": 3}
    out = SampleDecoder(image_decode="rgb8")(raw)
    assert out["__key__"] == "k" and out["__restore_key__"] == ("Webdataset", 1)
    assert out["jpg"].shape == (H, W, 3) and out["txt"] == "cap" and out["done"] == 3


def test_invalid_image_decode_raises_naming_the_value():
    """An unknown image_decode raises ValueError naming the value given."""
    with pytest.raises(ValueError, match="rgb16"):
        SampleDecoder(image_decode="rgb16")  # type: ignore[arg-type]


def test_invalid_av_decode_raises_naming_the_value():
    """An unknown av_decode raises ValueError naming the value given."""
    with pytest.raises(ValueError, match="ffmpeg"):
        SampleDecoder(av_decode="ffmpeg")  # type: ignore[arg-type]


@pytest.mark.parametrize("used_before", [False, True])
def test_decoder_pickles_and_still_decodes(used_before):
    """A decoder survives pickling (before or after first use) with its settings and still decodes."""
    dec = SampleDecoder(image_decode="torchrgb8", guess_content=False)
    if used_before:
        dec.decode_part("jpg", ENCODED["jpg"])
    clone = pickle.loads(pickle.dumps(dec))
    assert clone.config() == dec.config()
    value = clone.decode_part("png", ENCODED["png"])
    assert value.dtype == torch.uint8 and value.shape == (3, H, W)
    assert clone.decode_part("txt", b"x") == "x"


def test_guess_content_decodes_images_stored_under_unknown_extensions():
    """With guess_content=True a JPEG under .bin and a PNG under .dat are decoded as images."""
    dec = SampleDecoder(guess_content=True)
    jpg = dec.decode_part("bin", ENCODED["jpg"])
    png = dec.decode_part("dat", ENCODED["png"])
    assert isinstance(jpg, torch.Tensor) and jpg.shape == (3, H, W)
    assert torch.allclose(png, SampleDecoder().decode_part("png", ENCODED["png"]))


class _Tripwire:
    """Unpickling this creates a file: proof that a pickle was executed."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("trusted", [False, True])
@pytest.mark.parametrize("ext", ["pkl", "pickle", "pyd", "pkl.gz"])
def test_guess_content_decodes_an_image_stored_as_a_pickle_as_energon_trusted_or_not(ext, trusted):
    """guess_content=True: a pickle part whose bytes are a PNG is that image, as Energon's, also
    untrusted (its magic bytes say image; nothing is unpickled); without guess_content it stays refused."""
    data = gzip.compress(ENCODED["png"]) if ext.endswith(".gz") else ENCODED["png"]
    theirs = EnergonSampleDecoder(guess_content=True).decode(f"k1.{ext}", data)
    ours = SampleDecoder(guess_content=True, trust_dataset_code=trusted).decode(f"k1.{ext}", data)
    assert isinstance(ours, torch.Tensor) and ours.shape == (3, H, W) and torch.equal(ours, theirs)
    if not trusted:
        part = ext.split(".")[0]
        with pytest.raises(UntrustedCodeError, match=rf"pickled part '{part}'.*trust_dataset_code=True"):
            SampleDecoder().decode(f"k1.{ext}", data)


@pytest.mark.parametrize("ext", ["pkl", "pickle", "pyd"])
def test_guess_content_still_refuses_a_real_pickle_untrusted_without_unpickling_it(ext, tmp_path):
    """guess_content=True, untrusted: a real pickle in a pickle part raises UntrustedCodeError naming the
    part and the opt-in, and is never unpickled."""
    trip = tmp_path / "unpickled"
    with pytest.raises(UntrustedCodeError, match=rf"pickled part '{ext}'.*trust_dataset_code=True"):
        SampleDecoder(guess_content=True).decode_part(ext, pickle.dumps(_Tripwire(str(trip))))
    assert not trip.exists()


@pytest.mark.parametrize("ext", ["pkl", "pickle", "pyd"])
def test_guess_content_trusted_unpickles_a_real_pickle_as_energon(ext):
    """guess_content=True, trusted: a real pickle in a pickle part is unpickled, as Energon's."""
    real = pickle.dumps({"a": [1, 2]})
    trusted = SampleDecoder(guess_content=True, trust_dataset_code=True)
    assert trusted.decode(f"k1.{ext}", real) == EnergonSampleDecoder(guess_content=True).decode(f"k1.{ext}", real) == {"a": [1, 2]}


def test_guess_content_keeps_text_and_unknown_bytes():
    """With guess_content=True text parts still decode as text and unrecognised bytes stay bytes."""
    dec = SampleDecoder(guess_content=True)
    assert dec.decode_part("txt", b"hello") == "hello"
    assert dec.decode_part("bin", b"zzz") == b"zzz"


def test_without_guess_content_an_image_under_an_unknown_extension_stays_bytes():
    """Without guess_content the extension decides: a JPEG under .bin is left as bytes."""
    assert SampleDecoder().decode_part("bin", ENCODED["jpg"]) == ENCODED["jpg"]


def test_config_matches_energons_config():
    """config() has Energon's keys and values for the same arguments, plus the safety settings."""
    kwargs = dict(image_decode="pil", av_decode="torch", video_decode_audio=True, guess_content=True)
    ours, theirs = SampleDecoder(**kwargs).config(), EnergonSampleDecoder(**kwargs).config()
    assert {k: ours[k] for k in theirs} == theirs
    safety = {"trust_dataset_code", "max_image_pixels", "max_video_pixels", "max_av_duration_s", "max_part_bytes"}
    assert set(ours) - set(theirs) == safety


def test_repr_shows_the_settings():
    """The repr names the class and the image_decode setting."""
    text = repr(SampleDecoder(image_decode="pil"))
    assert text.startswith("SampleDecoder(") and "image_decode='pil'" in text


def test_decode_by_file_name_for_aux_files():
    """decode(fname, raw) decodes by the file name's extension, as Energon's decoder does for aux files."""
    dec = SampleDecoder(image_decode="rgb8")
    assert dec.decode("captions/0001.txt", b"hi") == "hi"
    assert dec.decode("images/0001.jpg", ENCODED["jpg"]).shape == (H, W, 3)


def test_a_decoded_file_store_names_the_store_and_the_file_that_fails(tmp_path):
    """DecodeFileStore (a cooker's aux store) raises SampleException naming store, file and cause; a refused pickle names the file and the opt-in."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "bad.jpg").write_bytes(b"garbage!")
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"a": 1}))
    store = DecodeFileStore(SystemFileStore(tmp_path), decoder=SampleDecoder())
    with pytest.raises(SampleException) as bad:
        store["images/bad.jpg"]
    assert str(bad.value).startswith(f"{tmp_path}: cannot decode file 'images/bad.jpg' (8 bytes): UnidentifiedImageError: jpg: ")
    with pytest.raises(UntrustedCodeError) as refused:
        store["meta.pkl"]
    assert str(refused.value).startswith(f"{tmp_path}: file 'meta.pkl': SampleDecoder(trust_dataset_code=False): ")
    assert "trust_dataset_code=True" in str(refused.value)
    assert DecodeFileStore(SystemFileStore(tmp_path), decoder=SampleDecoder(trust_dataset_code=True))["meta.pkl"][0] == {"a": 1}


@pytest.mark.parametrize(
    "fname", ["json", ".json", "dir/json", "a.b/.json", "..json", "a/b.c/d", "a.", "x.JSON", "d/.json", "a..json"]
)
def test_decode_by_file_name_splits_the_name_as_energon(fname):
    """decode(fname, raw) keeps bytes for names without a key or extension ("json", ".json") and decodes the rest, as Energon's decoder."""
    raw = json.dumps({"a": 1}).encode()
    assert SampleDecoder().decode(fname, raw) == EnergonSampleDecoder().decode(fname, raw)


def test_decode_by_file_name_guesses_content_of_names_without_extension():
    """With guess_content, a file named only "png" (no key) is decoded from its content, as Energon's."""
    assert SampleDecoder(guess_content=True, image_decode="rgb8").decode("png", ENCODED["png"]).shape == (H, W, 3)
    assert SampleDecoder(image_decode="rgb8").decode("png", ENCODED["png"]) == ENCODED["png"]


def test_is_av_part_recognises_audio_and_video_extensions():
    """is_av_part is True for mp4/wav style names (any case) and False for images and text."""
    assert SampleDecoder.is_av_part("clip.mp4") and SampleDecoder.is_av_part("WAV")
    assert not SampleDecoder.is_av_part("jpg") and not SampleDecoder.is_av_part("caption.txt")


@pytest.mark.parametrize("rows_in_blocks", [False, True], ids=["one_block", "several_blocks"])
@pytest.mark.parametrize("source_mode", ["L", "RGB", "RGBA"])
def test_image_decode_matches_webdataset_however_pillow_lays_out_the_rows(source_mode, rows_in_blocks):
    """An odd-sized image (151×89) decodes to webdataset's result for every torch spec, both when
    Pillow keeps its rows in one block (read through Pillow's Arrow export, no copy) and when it
    spreads them over several (a large image; read with numpy's copy)."""
    import pyarrow as pa
    from webdataset.autodecode import imagehandler

    pixels = np.random.default_rng(3).integers(0, 256, (89, 151, 4), dtype=np.uint8)
    image = Image.fromarray(pixels[..., :3]).convert(source_mode) if source_mode != "RGBA" else Image.fromarray(pixels, "RGBA")
    data = encode_image(image, "PNG")
    block_size = Image.core.get_block_size()
    if rows_in_blocks:
        Image.core.set_block_size(4096)  # 6 rows of 151 pixels × 4 bytes a block (Pillow's default: 16 MiB)
    try:
        decoded = Image.open(io.BytesIO(data))
        decoded.load()
        if hasattr(decoded, "__arrow_c_array__"):
            if rows_in_blocks:
                with pytest.raises(ValueError):
                    pa.array(decoded)
            else:
                assert len(pa.array(decoded)) == 89 * 151
        for mode in sorted(m for m in EXPECTED if m.startswith("torch")):
            ours = SampleDecoder(image_decode=mode).decode_part("png", data)
            theirs = imagehandler(mode)("png", data)
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), mode
            assert ours.is_contiguous()
    finally:
        Image.core.set_block_size(block_size)


def _all_values_image(source_mode: str) -> bytes:
    """A PNG in ``source_mode`` whose channels hold every uint8 value (so every division by 255 is seen)."""
    ramp = np.arange(256, dtype=np.uint8).reshape(16, 16)
    channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "P": 1}[source_mode]
    stack = np.stack([np.roll(ramp, 37 * c) for c in range(channels)], axis=-1)
    image = Image.fromarray(stack[..., 0] if channels == 1 else stack, "L" if source_mode == "P" else source_mode)
    if source_mode == "P":
        image = image.convert("P", palette=Image.Palette.ADAPTIVE, colors=200)
    return encode_image(image, "PNG")


@pytest.mark.parametrize("source_mode", ["L", "LA", "RGB", "RGBA", "P"])
@pytest.mark.parametrize("mode", sorted(m for m in EXPECTED if m.startswith("torch")))
def test_image_decode_matches_webdataset(mode, source_mode):
    """The torch specs, converted by our own code (one PIL open serves the size check and the decode),
    equal webdataset's ImageHandler bit for bit: every pixel value 0..255, every source mode, same
    dtype, shape and a contiguous result of its own."""
    from webdataset.autodecode import imagehandler

    data = _all_values_image(source_mode)
    ours = SampleDecoder(image_decode=mode).decode_part("png", data)
    theirs = imagehandler(mode)("png", data)
    assert ours.dtype == theirs.dtype and tuple(ours.shape) == tuple(theirs.shape)
    assert torch.equal(ours, theirs)
    assert ours.is_contiguous()
    ours.add_(1)  # a tensor of its own, not a view of Pillow's read-only buffer
