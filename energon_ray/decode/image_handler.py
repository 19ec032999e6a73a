"""Image parts: webdataset's image specs, each image refused before decoding if too large or in
PostScript (untrusted), torch specs converted with one pass over the pixels (``_pixels``: a view of
Pillow's memory through its Arrow export where it lends it)."""

from __future__ import annotations

import io
from typing import Any, Optional

import numpy as np
import PIL.Image
import torch
import webdataset.autodecode as wds_decode

from energon_ray.errors import MediaTooLargeError, untrusted

#: what an untrusted decoder's refusals name as the setting to change
UNTRUSTED_WHERE = "SampleDecoder(trust_dataset_code=False)"
#: Pillow formats whose decoding runs the file as a program (EPS/PS: Pillow draws it with Ghostscript).
CODE_IMAGE_FORMATS = frozenset({"EPS"})


def _pixels(image: PIL.Image.Image) -> np.ndarray:
    """The decoded image's pixels as an H×W(×C) uint8 array: a view of Pillow's own memory where
    Pillow lends it (its Arrow export, for an image whose rows lie in one block), else numpy's copy
    (``np.asarray`` copies them through ``tobytes``). Pillow keeps an RGB pixel in 4 bytes; the view
    leaves the fourth out."""
    channels = _ARROW_CHANNELS.get(image.mode)
    if channels is not None and hasattr(image, "__arrow_c_array__"):
        import pyarrow as pa

        try:
            array = pa.array(image)
        except ValueError:  # rows in several blocks (a large image): no single view
            return np.asarray(image)
        width, height = image.size
        if len(array) != width * height or array.offset:  # not the layout read below: let numpy copy
            return np.asarray(image)
        step = array.type.list_size if pa.types.is_fixed_size_list(array.type) else 1
        values = array.values if step > 1 else array
        flat = np.frombuffer(values.buffers()[1], dtype=np.uint8, count=height * width * step, offset=values.offset)
        return flat.reshape(height, width, step)[:, :, :channels] if step > 1 else flat.reshape(height, width)
    return np.asarray(image)


#: modes whose Arrow export ``_pixels`` reads, with their channels (the torch image specs' modes)
_ARROW_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}


class ImageHandler:
    """Images by webdataset's spec (``torchrgb``, ``rgb8``, ``pil``, …), refused first if too large.

    PostScript (``eps``/``ps`` parts, or any image part whose bytes are EPS) is refused unless
    ``trusted``: Pillow would run it in Ghostscript. The header's size is checked against
    ``max_pixels`` before any pixel is decoded
    (``max_pixels=None`` follows ``PIL.Image.MAX_IMAGE_PIXELS`` at decode time; ``None`` there: no
    limit). Torch specs are converted here, equal bit for bit to webdataset's ``ImageHandler`` (test:
    ``test_image_decode_matches_webdataset``), so that one ``PIL.Image.open`` serves the size check and
    the decode (webdataset's handler opens the image again; see benchmarks/README, stop 30).
    Numpy and PIL specs are webdataset's own.
    """

    def __init__(self, spec: str, max_pixels: Optional[int], trusted: bool = False):
        self.handler = wds_decode.imagehandler(spec)
        self.max_pixels = max_pixels
        self.trusted = trusted
        atype, etype, mode = wds_decode.imagespecs[spec]
        self.torch_spec = (etype, mode.upper()) if atype == "torch" else None

    def __call__(self, key: str, data: bytes) -> Any:
        if key.rsplit(".", 1)[-1].lower() not in self.handler.extensions:
            return None
        part = key.lstrip(".")
        with io.BytesIO(data) as stream:
            image = self._check(part, stream)
            if self.torch_spec is None:
                image.close()
                return self.handler(key, data)
            etype, mode = self.torch_spec
            image.load()
            if image.mode != mode:
                image = image.convert(mode)
            pixels = _pixels(image)  # H×W(×C) uint8, Pillow's memory where it lends it
            if pixels.ndim == 3:
                pixels = pixels.transpose(2, 0, 1)
            pixels = np.array(pixels, order="C")  # the one pass over the pixels: C×H×W, writable, our own
        if etype == "float":
            pixels = pixels.astype(np.float32)
            pixels /= 255.0  # as webdataset: float32 / 255.0 in float32
        return torch.from_numpy(pixels)

    def _check(self, part: str, stream: io.BytesIO) -> PIL.Image.Image:
        """The lazily opened image (header read only) after its size passed the limit."""
        limit, source = self.max_pixels, "SampleDecoder(max_image_pixels=...)"
        if limit is None:
            limit, source = PIL.Image.MAX_IMAGE_PIXELS, "PIL.Image.MAX_IMAGE_PIXELS"
        how = "raise it with SampleDecoder(max_image_pixels=...) or PIL.Image.MAX_IMAGE_PIXELS"
        try:
            image = PIL.Image.open(stream)
        except PIL.UnidentifiedImageError:
            # Pillow names its in-memory stream ("<_io.BytesIO object at 0x…>"); the bytes say more
            head = stream.getvalue()[:16]
            raise PIL.UnidentifiedImageError(f"{part}: not an image Pillow can identify (its first bytes: {head!r})") from None
        except PIL.Image.DecompressionBombError as exc:
            raise MediaTooLargeError(
                f"{part}: image refused before decoding, PIL says: {exc} (PIL refuses twice its "
                f"MAX_IMAGE_PIXELS; the decoder's limit is {limit:,} pixels from {source}); {how}"
            ) from exc
        if image.format in CODE_IMAGE_FORMATS and not self.trusted:
            image.close()
            raise untrusted(
                f"part {part!r}, an image in PostScript ({image.format}): a program, which Pillow would run in "
                "Ghostscript to draw it", UNTRUSTED_WHERE
            )
        width, height = image.size
        if limit is not None and width * height > limit:
            raise MediaTooLargeError(
                f"{part}: image of {width}×{height} = {width * height:,} pixels exceeds the limit of {limit:,} "
                f"pixels ({source}); refused before decoding; {how}"
            )
        return image
