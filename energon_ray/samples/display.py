"""Rich display of samples and batches in Jupyter: images as inline PNG thumbnails, texts, tensor shapes.

``Sample._repr_html_`` and ``Batch._repr_html_`` call :func:`to_html`, so the last expression of a
notebook cell that is a sample or a batch shows as a small table: the class and ``__key__`` on top,
then one row per field. A field that looks like an image — a tensor or array ``(C, H, W)`` or
``(H, W, C)`` with 1, 3 or 4 channels, float or uint8, or a PIL image — shows as a thumbnail; a
stack of them (``(N, C, H, W)``, a list of images, or video ``(B, T, C, H, W)``) as one grid, a row
per sample and a column per frame. Strings show as text, other tensors as dtype and shape, lists
summarised.

It is cheap (at most :data:`MAX_TILES` images are converted, each shrunk to :data:`TILE_MAX` pixels,
or :data:`THUMB_MAX` for a lone image) and never raises: whatever fails falls back to the text
``repr``.

Example:
    >>> import torch
    >>> from energon_ray.samples import CaptioningSample
    >>> html = to_html(CaptioningSample(__key__="k1", image=torch.zeros(3, 8, 8), caption="a cat"))
    >>> "k1" in html and "a cat" in html and html.count('src="data:image/png;base64,') == 1
    True
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

#: Largest side, in pixels, of a lone image's thumbnail.
THUMB_MAX = 256
#: Largest side, in pixels, of each image in a grid.
TILE_MAX = 96
#: Pixels between the images of a grid.
GRID_GAP = 2
#: Most images converted for one field; the rest are counted, not drawn.
MAX_TILES = 32
#: Columns of a grid of single images (a video grid has a column per frame, up to MAX_TILES).
GRID_COLUMNS = 8
#: Smallest height and width that count as an image (a thinner tensor is data, not pixels).
MIN_SIDE = 4
#: Largest ratio of the longer to the shorter side that counts as an image.
MAX_ASPECT = 16
#: Characters of a text or repr shown before it is cut.
MAX_TEXT = 400
#: Items of a list shown before the rest are counted.
MAX_ITEMS = 8

_CHANNELS = (1, 3, 4)
_META = ("__key__", "__restore_key__", "__subflavors__", "__sources__")


def to_html(obj: Any) -> str:
    """HTML for a sample or batch dataclass; never raises (falls back to the escaped text repr).

    Args:
        obj: usually a ``Sample`` or ``Batch``; any dataclass instance works.

    Returns:
        An HTML fragment with images embedded as ``data:image/png;base64`` URIs.
    """
    try:
        if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
            return _fallback(obj)
        rows, meta_rows = [], []
        for field in dataclasses.fields(obj):
            if field.name == "__key__" or not hasattr(obj, field.name):
                continue
            value = getattr(obj, field.name)
            if field.name in _META and _empty(value):
                continue
            (meta_rows if field.name in _META else rows).append(_row(field.name, value))
        return (f"<div class='energon-ray-sample'>{_header(obj)}"
                f"<table>{''.join(rows + meta_rows)}</table></div>")
    except Exception:
        return _fallback(obj)


def image_grid(value: Any) -> Optional[Tuple[bytes, int]]:
    """PNG bytes of an image-like value and how many images it holds, or ``None`` if it is not one.

    A lone image is shrunk to fit :data:`THUMB_MAX`; several are tiled into a grid, each shrunk to
    fit :data:`TILE_MAX`, :data:`GRID_GAP` pixels apart, at most :data:`MAX_TILES` of them.

    Example:
        >>> png, count = image_grid(torch.zeros(5, 3, 10, 20))
        >>> count, png[:4]
        (5, b'\\x89PNG')
    """
    found = _picture_of(value)
    if found is None:
        return None
    return _png(found[0]), found[1]


def _picture_of(value: Any) -> Optional[Tuple[Any, int]]:
    """``(PIL image, images in total)`` of an image-like value: one thumbnail or a grid of them."""
    found = _images_of(value)
    if found is None:
        return None
    tiles, columns, total = found
    limit = THUMB_MAX if total == 1 else TILE_MAX
    pictures = [_to_picture(tile, limit) for tile in tiles]
    return (pictures[0] if total == 1 else _grid(pictures, columns)), total


def _png(picture: Any) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def _header(obj: Any) -> str:
    name = _esc(type(obj).__name__)
    key = getattr(obj, "__key__", None)
    if isinstance(key, (list, tuple)):
        shown = ", ".join(f"<code>{_esc(k)}</code>" for k in key[:MAX_ITEMS])
        more = f" (+{len(key) - MAX_ITEMS} more)" if len(key) > MAX_ITEMS else ""
        return f"<b>{name}</b> &middot; {len(key)} samples: {shown}{more}"
    return f"<b>{name}</b> <code>{_esc(key)}</code>"


def _row(name: str, value: Any) -> str:
    return (f"<tr><th style='text-align:left;vertical-align:top'>{_esc(name)}</th>"
            f"<td style='text-align:left'>{_field_html(value)}</td></tr>")


def _field_html(value: Any) -> str:
    try:
        found = _picture_of(value)
        if found is not None:
            return _img_html(found[0], found[1], value)
        return _value_html(value)
    except Exception:
        return f"<code>{_esc(_cut(_safe_repr(value)))}</code>"


def _img_html(picture: Any, count: int, value: Any) -> str:
    width, height = picture.size
    # Tiny images are drawn larger (pixelated), so a 16x12 thumbnail is still visible.
    scale = max(1, 64 // max(width, height, 1))
    shown = f"first {MAX_TILES} of {count} images, " if count > MAX_TILES else ""
    data = base64.b64encode(_png(picture)).decode("ascii")
    about = _esc(_describe(value))
    return (f"<img src=\"data:image/png;base64,{data}\" width=\"{width * scale}\" height=\"{height * scale}\" "
            f"style='image-rendering:pixelated' alt='{about}'/><br><small>{shown}{about}</small>")


def _value_html(value: Any) -> str:
    if isinstance(value, str):
        return _esc(_cut(value))
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"<code>{_esc(_describe(value))}</code>"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        items = "".join(f"<li>{_esc(_cut(v, MAX_TEXT // 2))}</li>" for v in value[:MAX_ITEMS])
        more = f"<small>(+{len(value) - MAX_ITEMS} more)</small>" if len(value) > MAX_ITEMS else ""
        return f"<small>{len(value)} texts</small><ol style='margin:0'>{items}</ol>{more}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (torch.Tensor, np.ndarray)) for v in value):
        shapes = ", ".join(_describe(v) for v in value[:MAX_ITEMS])
        more = f", +{len(value) - MAX_ITEMS} more" if len(value) > MAX_ITEMS else ""
        return f"<code>{_esc(f'{len(value)} arrays: {shapes}{more}')}</code>"
    return f"<code>{_esc(_cut(_safe_repr(value)))}</code>"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        text = f"{str(value.dtype).replace('torch.', '')} {tuple(value.shape)}"
        if value.device.type != "cpu":
            text += f" on {value.device}"
        if value.numel() <= MAX_ITEMS:
            text += f" = {value.tolist()}"
        return text
    if isinstance(value, np.ndarray):
        text = f"numpy {value.dtype} {value.shape}"
        return text + f" = {value.tolist()}" if value.size <= MAX_ITEMS else text
    if isinstance(value, (list, tuple)):
        return f"{len(value)} images"
    if hasattr(value, "size") and hasattr(value, "mode"):
        return f"PIL {value.mode} {value.size[0]}x{value.size[1]}"
    return type(value).__name__


def _images_of(value: Any) -> Optional[Tuple[List[np.ndarray], int, int]]:
    """``(HWC uint8 tiles, grid columns, images in total)`` of an image-like value, else ``None``."""
    if _is_pil(value):
        return [np.asarray(value.convert("RGBA" if "A" in value.mode else "RGB"))], 1, 1
    if isinstance(value, (list, tuple)) and value:
        items = list(value[:MAX_TILES])
        if not all(_is_pil(v) or (_is_array(v) and _layout(v.shape) is not None) for v in items):
            return None
        tiles = [_images_of(v)[0][0] for v in items]
        return tiles, min(len(value), GRID_COLUMNS), len(value)
    if not _is_array(value):
        return None
    shape = tuple(value.shape)
    for lead in range(0, 3):  # (C,H,W) / (N,C,H,W) / (B,T,C,H,W), or channels last
        layout = _layout(shape[lead:]) if len(shape) == lead + 3 else None
        if layout is not None:
            return _stack_tiles(value, lead, layout)
    return None


def _stack_tiles(value: Any, lead: int, layout: str) -> Tuple[List[np.ndarray], int, int]:
    shape = tuple(value.shape)
    if lead == 0:
        flat, columns = value[None], 1
    elif lead == 1:
        flat, columns = value, min(shape[0], GRID_COLUMNS)
    else:
        columns = max(1, min(shape[1], MAX_TILES))
        rows = max(1, min(shape[0], MAX_TILES // columns))
        flat = value[:rows, :columns].reshape(rows * columns, *shape[2:])
    total = int(np.prod(shape[:lead])) if lead else 1
    flat = flat[:MAX_TILES]
    height, width = (shape[-2], shape[-1]) if layout == "chw" else (shape[-3], shape[-2])
    step = max(1, max(height, width) // (2 * THUMB_MAX))  # skip pixels before copying a huge image
    if layout == "chw":
        flat = flat[:, :, ::step, ::step]
    else:
        flat = flat[:, ::step, ::step, :]
    pixels = _to_uint8(flat)
    if layout == "chw":
        pixels = pixels.transpose(0, 2, 3, 1)
    return list(pixels), columns, total


def _layout(shape: Sequence[int]) -> Optional[str]:
    """``"chw"`` or ``"hwc"`` for a 3-d shape that is one image, else ``None`` (channels first wins)."""
    if len(shape) != 3:
        return None
    for layout, channels, height, width in (("chw", shape[0], shape[1], shape[2]), ("hwc", shape[2], shape[0], shape[1])):
        if channels in _CHANNELS and min(height, width) >= MIN_SIDE and max(height, width) <= MAX_ASPECT * min(height, width):
            return layout
    return None


def _is_array(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.uint8 or value.is_floating_point()
    if isinstance(value, np.ndarray):
        return value.dtype == np.uint8 or np.issubdtype(value.dtype, np.floating)
    return False


def _is_pil(value: Any) -> bool:
    module = type(value).__module__ or ""
    return module.startswith("PIL.") and hasattr(value, "convert") and hasattr(value, "mode")


def _to_uint8(array: Any) -> np.ndarray:
    """uint8 pixels; floats in [0, 1] are scaled by 255, in [0, 255] kept, anything else stretched."""
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu()
        array = array.numpy() if array.dtype == torch.uint8 else array.float().numpy()
    array = np.asarray(array)
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    array = np.nan_to_num(array.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    low, high = (float(array.min()), float(array.max())) if array.size else (0.0, 1.0)
    if low >= 0 and high <= 1:
        array = array * 255
    elif low < 0 or high > 255:  # normalized (mean/std) pixels: stretch to the full range for display
        array = (array - low) * (255 / (high - low) if high > low else 0.0)
    return np.clip(np.rint(array), 0, 255).astype(np.uint8)


def _to_picture(pixels: np.ndarray, limit: int) -> Any:
    from PIL import Image

    if pixels.shape[-1] == 1:
        picture = Image.fromarray(pixels[..., 0], "L")
    else:
        picture = Image.fromarray(np.ascontiguousarray(pixels), "RGBA" if pixels.shape[-1] == 4 else "RGB")
    picture.thumbnail((limit, limit))
    return picture


def _grid(pictures: List[Any], columns: int) -> Any:
    from PIL import Image

    columns = max(1, min(columns, len(pictures)))
    rows = math.ceil(len(pictures) / columns)
    cell_w = max(p.size[0] for p in pictures)
    cell_h = max(p.size[1] for p in pictures)
    canvas = Image.new("RGB", (columns * cell_w + (columns - 1) * GRID_GAP, rows * cell_h + (rows - 1) * GRID_GAP), "white")
    for i, picture in enumerate(pictures):
        row, column = divmod(i, columns)
        canvas.paste(picture.convert("RGB"), (column * (cell_w + GRID_GAP), row * (cell_h + GRID_GAP)))
    return canvas


def _empty(value: Any) -> bool:
    """A meta field not worth a row: unset, empty, or a batch's list of unset values."""
    if isinstance(value, list) and all(v is None for v in value):
        return True
    return value is None or (isinstance(value, (tuple, dict)) and not value)


def _fallback(obj: Any) -> str:
    return f"<pre>{_esc(_safe_repr(obj))}</pre>"


def _safe_repr(obj: Any) -> str:
    try:
        return repr(obj)
    except Exception:
        return object.__repr__(obj)


def _cut(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)
