"""Rich display of samples and batches: inline PNG thumbnails and grids, texts, tensor shapes, never raising."""

from __future__ import annotations

import base64
import io
import re
from typing import List

import numpy as np
import torch
from IPython.core.formatters import DisplayFormatter
from PIL import Image

from energon_ray.samples import Batch, CaptioningSample, Sample, TextSample, edataclass
from energon_ray.samples.display import GRID_GAP, MAX_TILES, image_grid, to_html

IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def pictures(html: str) -> List[Image.Image]:
    """Every inline PNG of ``html``, decoded."""
    return [Image.open(io.BytesIO(base64.b64decode(data))) for data in IMG.findall(html)]


@edataclass
class FrameBatch(Batch):
    frames: torch.Tensor
    tokens: torch.Tensor
    captions: List[str]


@edataclass
class MixedSample(Sample):
    photo: np.ndarray
    picture: Image.Image
    crops: list
    audio: torch.Tensor


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_sample_image_caption_and_key():
    """A float CHW image in [0, 1] becomes one PNG of its size (pixels x255); key and caption are escaped text."""
    sample = CaptioningSample(__key__="shard/k<1>", image=torch.full((3, 40, 60), 0.5), caption="a <b>cat</b> & a dog")
    html = sample._repr_html_()
    (picture,) = pictures(html)
    assert picture.size == (60, 40) and picture.mode == "RGB"
    assert set(np.asarray(picture).reshape(-1).tolist()) == {128}
    assert "<code>shard/k&lt;1&gt;</code>" in html and "a &lt;b&gt;cat&lt;/b&gt; &amp; a dog" in html
    assert "float32 (3, 40, 60)" in html and html == to_html(sample)


def test_ipython_picks_the_html():
    """IPython's display formatter (what Jupyter calls) finds the text/html of a sample."""
    sample = CaptioningSample(__key__="k", image=torch.zeros(3, 8, 8), caption="c")
    data, _ = DisplayFormatter().format(sample)
    assert "<img src=\"data:image/png;base64," in data["text/html"] and "text/plain" in data


def test_large_image_is_shrunk_to_the_thumbnail_limit():
    """A 300x600 image shows as a 128x256 thumbnail (aspect kept, longer side 256)."""
    sample = CaptioningSample(__key__="big", image=torch.rand(3, 600, 300), caption="tall")
    (picture,) = pictures(sample._repr_html_())
    assert picture.size == (128, 256)


def test_batch_of_images_is_one_grid():
    """(5, 3, 16, 24) uint8 images: one row of 5 tiles, GRID_GAP apart; keys and caption list shown."""
    frames = torch.stack([torch.full((3, 16, 24), 40 * i, dtype=torch.uint8) for i in range(5)])
    batch = FrameBatch(__key__=[f"s{i}" for i in range(5)], frames=frames, tokens=torch.zeros(5, 7, dtype=torch.long),
                       captions=[f"caption {i}" for i in range(5)])
    html = batch._repr_html_()
    (picture,) = pictures(html)
    assert picture.size == (5 * 24 + 4 * GRID_GAP, 16)
    pixels = np.asarray(picture)
    assert [int(pixels[8, i * (24 + GRID_GAP) + 12, 0]) for i in range(5)] == [0, 40, 80, 120, 160]
    assert "<b>FrameBatch</b> &middot; 5 samples: <code>s0</code>, <code>s1</code>" in html
    assert "<li>caption 4</li>" in html and "int64 (5, 7)" in html


def test_video_batch_is_a_grid_of_samples_by_frames():
    """(2, 3, 3, 16, 20) video frames: 2 rows (samples) x 3 columns (frames), each tile at its place."""
    frames = torch.zeros(2, 3, 3, 16, 20, dtype=torch.uint8)
    for b in range(2):
        for t in range(3):
            frames[b, t] = 10 + 100 * b + 30 * t
    png, count = image_grid(frames)
    picture = Image.open(io.BytesIO(png))
    assert count == 6 and picture.size == (3 * 20 + 2 * GRID_GAP, 2 * 16 + GRID_GAP)
    pixels = np.asarray(picture)
    for b in range(2):
        for t in range(3):
            assert int(pixels[b * (16 + GRID_GAP) + 8, t * (20 + GRID_GAP) + 10, 1]) == 10 + 100 * b + 30 * t


def test_more_images_than_tiles_are_counted():
    """40 grayscale images: the first MAX_TILES drawn (8 columns), the note says how many there were."""
    batch = FrameBatch(__key__=["a"] * 40, frames=torch.rand(40, 1, 8, 8), tokens=torch.zeros(1), captions=[])
    html = batch._repr_html_()
    (picture,) = pictures(html)
    assert picture.size == (8 * 8 + 7 * GRID_GAP, (MAX_TILES // 8) * 8 + (MAX_TILES // 8 - 1) * GRID_GAP)
    assert f"first {MAX_TILES} of 40 images" in html and "(+32 more)" in html


def test_normalized_floats_are_stretched():
    """Float pixels outside [0, 255] (mean/std normalized) are stretched: -1 shows black, 1 white."""
    image = torch.cat([torch.full((3, 8, 4), -1.0), torch.full((3, 8, 4), 1.0)], dim=2)
    png, count = image_grid(image)
    pixels = np.asarray(Image.open(io.BytesIO(png)))
    assert count == 1 and pixels[:, :4].max() == 0 and pixels[:, 4:].min() == 255


def test_numpy_pil_lists_and_non_images():
    """HWC numpy, PIL and a list of differently sized images render; audio and tokens stay shapes."""
    photo = np.full((30, 20, 3), 200, dtype=np.uint8)
    sample = MixedSample(__key__="m", photo=photo, picture=Image.new("RGB", (12, 10), (1, 2, 3)),
                         crops=[torch.rand(3, 10, 20), torch.rand(3, 30, 12)], audio=torch.zeros(2, 1, 8000))
    html = sample._repr_html_()
    sizes = [p.size for p in pictures(html)]
    assert sizes == [(20, 30), (12, 10), (20 + GRID_GAP + 20, 30)]
    assert "float32 (2, 1, 8000)" in html and "PIL RGB 12x10" in html and "2 images" in html


def test_sample_without_images_renders_text_and_shapes():
    """A text sample has no <img>; its key and text come first, then the meta fields that are set."""
    sample = TextSample(__key__="doc_7", __restore_key__=("Webdataset", 7), __subflavors__={"kind": "doc"}, text="hello world")
    html = sample._repr_html_()
    assert "<img" not in html
    assert "<b>TextSample</b> <code>doc_7</code>" in html and "hello world" in html
    assert html.index(">text<") < html.index(">__restore_key__<") < html.index(">__subflavors__<")
    assert "&#x27;Webdataset&#x27;, 7" in html and ">__sources__<" not in html


def test_never_raises():
    """A field whose repr raises shows its default repr; a non-dataclass falls back to escaped <pre>."""
    sample = MixedSample(__key__="x", photo=np.zeros(3), picture=BadRepr(), crops=[], audio=torch.zeros(1))
    html = sample._repr_html_()
    assert "<b>MixedSample</b>" in html and "BadRepr object at 0x" in html
    assert to_html({"a": "<1>"}) == "<pre>{&#x27;a&#x27;: &#x27;&lt;1&gt;&#x27;}</pre>"
    assert to_html(BadRepr()).startswith("<pre>&lt;") and "BadRepr object at 0x" in to_html(BadRepr())
