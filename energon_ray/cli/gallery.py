"""The images of previewed samples as a PNG grid or an HTML page (``energon-ray preview --out``):
decoded images as they are, a video as a strip of frames, an audio track as its waveform."""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import logging
import math
from pathlib import Path
from typing import Any, List, Optional, Tuple

import numpy as np
import PIL.Image
import PIL.ImageDraw
import PIL.ImageFont
import PIL.ImageOps
import torch

#: Space around and between the grid's cells, and the height of the key under each image (pixels).
PAD = 4
LABEL_HEIGHT = 14
#: A video's frames in its strip (equally spaced over the video), and a waveform's size (pixels).
STRIP_FRAMES = 6
WAVE_SIZE = (512, 128)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class PreviewItem:
    """One previewed sample: its key and shard, its images by field, and one text line per field."""

    key: str
    shard: str
    images: List[Tuple[str, PIL.Image.Image]] = dataclasses.field(default_factory=list)
    lines: List[Tuple[str, str]] = dataclasses.field(default_factory=list)


def _array_image(array: np.ndarray) -> Optional[PIL.Image.Image]:
    """An HWC (C in 1, 3, 4) or HW array, float in [0, 1] or uint8, as an RGB image."""
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[-1] in (3, 4))) or 0 in array.shape:
        return None
    if np.issubdtype(array.dtype, np.floating):
        array = np.round(np.clip(array, 0.0, 1.0) * 255.0).astype(np.uint8)
    elif array.dtype != np.uint8:
        return None
    mode = {2: "L"}.get(array.ndim) or ("RGB" if array.shape[-1] == 3 else "RGBA")
    return PIL.Image.fromarray(np.ascontiguousarray(array), mode).convert("RGB")


def to_image(value: Any) -> Optional[PIL.Image.Image]:
    """A decoded image as an RGB PIL image, or None for anything that is no image.

    Images are what ``SampleDecoder`` makes of an image part: PIL images, CHW (or HW) tensors and HWC
    (or HW) arrays, float in [0, 1] or uint8. A 2-D float array counts only as a tensor ``torchl`` gives.

    Example:
        >>> to_image(torch.zeros(3, 4, 5)).size
        (5, 4)
    """
    if isinstance(value, PIL.Image.Image):
        return value.convert("RGB")
    if isinstance(value, torch.Tensor):
        if value.ndim == 3 and value.shape[0] in (1, 3, 4):
            return _array_image(value.detach().cpu().permute(1, 2, 0).numpy())
        if value.ndim == 2 and (value.dtype == torch.uint8 or value.is_floating_point()):
            return _array_image(value.detach().cpu().numpy())
        return None
    if isinstance(value, np.ndarray) and (value.ndim == 3 or value.dtype == np.uint8):
        return _array_image(value)
    return None


def waveform(audio: torch.Tensor, size: Tuple[int, int] = WAVE_SIZE) -> PIL.Image.Image:
    """A ``(channels, samples)`` clip (any sample type ``AVDecoder`` gives) drawn as its waveform: per
    column of pixels the lowest and highest sample of that stretch (channels averaged), scaled to the
    loudest sample, around a grey centre line."""
    from energon_ray.decode.av import audio_to_float

    width, height = size
    wave = audio_to_float(audio).float().mean(dim=0).numpy() if audio.numel() else np.zeros(1, np.float32)
    peak = float(np.abs(wave).max()) or 1.0
    edges = np.linspace(0, len(wave), width + 1).astype(int)
    image = PIL.Image.new("RGB", size, "white")
    draw = PIL.ImageDraw.Draw(image)
    middle = (height - 1) / 2
    draw.line([(0, middle), (width - 1, middle)], fill=(200, 200, 200))
    for x in range(width):
        part = wave[edges[x] : max(edges[x + 1], edges[x] + 1)]
        low, high = float(part.min()) / peak, float(part.max()) / peak
        draw.line([(x, middle - high * middle), (x, middle - low * middle)], fill=(31, 119, 180))
    return image


def av_images(field: str, decoder: Any, key: str = "?") -> List[Tuple[str, PIL.Image.Image]]:
    """``(label, image)`` of an ``AVDecoder`` field: its video as a strip of ``STRIP_FRAMES`` frames,
    its audio track as a waveform; a file that does not decode is left out with a warning naming the
    sample's ``key`` and the field."""
    from energon_ray.decode.av import get_single_frames_uniform
    from energon_ray.errors import SampleException

    out: List[Tuple[str, PIL.Image.Image]] = []
    try:
        if decoder.has_video_stream():
            frames = get_single_frames_uniform(decoder, STRIP_FRAMES)  # uint8 (n, 3, h, w)
            out.append((f"{field} (video)", to_image(torch.cat(list(frames), dim=2))))
        if decoder.has_audio_stream():
            clips = decoder.get_audio().audio_clips or []
            if clips:
                out.append((f"{field} (audio)", waveform(clips[0])))
    except SampleException as exc:
        logger.warning("energon_ray preview: sample %s, field %s: left out of the images: %s", key, field, exc)
    return out


def find_images(field: str, value: Any, key: str = "?") -> List[Tuple[str, PIL.Image.Image]]:
    """``(label, image)`` of a field's image, of each image in a list field (``sequence[2]``), or of
    a video or audio field (``av_images``; ``key``: the sample's)."""
    from energon_ray.decode.av import AVDecoder

    if isinstance(value, AVDecoder):
        return av_images(field, value, key)
    image = to_image(value)
    if image is not None:
        return [(field, image)]
    if isinstance(value, (list, tuple)):
        return [(f"{field}[{i}]", img) for i, item in enumerate(value) for img in [to_image(item)] if img is not None]
    return []


def grid_size(cells: int, columns: int, thumb: int) -> Tuple[int, int]:
    """``(width, height)`` of a grid of ``cells`` images, ``columns`` per row, each in a ``thumb`` square.

    Example:
        >>> grid_size(8, 4, 128)
        (532, 296)
    """
    cols = max(1, min(cells, columns))
    rows = max(1, math.ceil(cells / cols))
    return cols * (thumb + PAD) + PAD, rows * (thumb + LABEL_HEIGHT + PAD) + PAD


def _fit(draw: PIL.ImageDraw.ImageDraw, font: Any, text: str, width: int) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def render_grid(items: List[PreviewItem], columns: int = 4, thumb: int = 128) -> PIL.Image.Image:
    """Every image of the items, scaled to fit a ``thumb`` square, in rows of ``columns``, key under each.

    The image of cell ``n`` has its top left corner at ``x = PAD + (n % cols) * (thumb + PAD) +
    (thumb - w) // 2``, ``y = PAD + (n // cols) * (thumb + LABEL_HEIGHT + PAD) + thumb - h`` (``w``, ``h``:
    its size after ``ImageOps.contain``); :func:`grid_size` gives the canvas size.

    Raises:
        ValueError: the items hold no image.
    """
    cells = [(item.key, label, image) for item in items for label, image in item.images]
    if not cells:
        raise ValueError("the previewed samples hold no images to put in a grid")
    cols = max(1, min(len(cells), columns))
    canvas = PIL.Image.new("RGB", grid_size(len(cells), columns, thumb), "white")
    draw = PIL.ImageDraw.Draw(canvas)
    font = PIL.ImageFont.load_default()
    for n, (key, label, image) in enumerate(cells):
        x = PAD + (n % cols) * (thumb + PAD)
        y = PAD + (n // cols) * (thumb + LABEL_HEIGHT + PAD)
        fitted = PIL.ImageOps.contain(image, (thumb, thumb))
        # centred across, on the cell's bottom edge, so the key sits right under the image
        canvas.paste(fitted, (x + (thumb - fitted.width) // 2, y + thumb - fitted.height))
        text = key if len(items) == len(cells) else f"{key} {label}"
        draw.text((x, y + thumb + 1), _fit(draw, font, text, thumb), fill="black", font=font)
    return canvas


def _png_base64(image: PIL.Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def render_html(items: List[PreviewItem], title: str, thumb: int = 256) -> str:
    """A self-contained HTML page: per sample its images (inline PNGs, at most ``thumb`` pixels a side)
    and a caption with the key, the shard and every field."""
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif} figure{display:inline-block;vertical-align:top;margin:8px;"
        "max-width:%dpx} figcaption{font-size:12px;white-space:pre-wrap;word-break:break-word}</style>" % max(thumb, 256),
        f"</head><body><h1>{html.escape(title)}</h1>",
    ]
    for item in items:
        parts.append("<figure>")
        for label, image in item.images:
            image = PIL.ImageOps.contain(image, (thumb, thumb)) if max(image.size) > thumb else image
            parts.append(
                f'<img src="data:image/png;base64,{_png_base64(image)}" alt="{html.escape(item.key)} {html.escape(label)}">'
            )
        caption = [f"<b>{html.escape(item.key)}</b> ({html.escape(item.shard)})"]
        caption += [f"{html.escape(field)}: {html.escape(text)}" for field, text in item.lines]
        parts.append("<figcaption>" + "\n".join(caption) + "</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_output(items: List[PreviewItem], out: Path, title: str, columns: int, thumb: int) -> str:
    """Write ``out`` (``.png``: grid, ``.html``: page) and return a one-line description.

    Raises:
        ValueError: another suffix, or a grid without images.
    """
    suffix = out.suffix.lower()
    if suffix == ".png":
        grid = render_grid(items, columns, thumb)
        grid.save(out, format="PNG")
        return f"Wrote {out} ({grid.width}x{grid.height} grid)"
    if suffix in (".html", ".htm"):
        out.write_text(render_html(items, title), encoding="utf-8")
        return f"Wrote {out} ({sum(len(i.images) for i in items)} images, {len(items)} samples)"
    raise ValueError(f"--out {out}: expected a .png or .html file")
