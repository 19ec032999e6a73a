"""energon_ray.transforms on its own (no torchvision): CustomTransform steps warp as their matrices
say, the package never imports torchvision, and bad input is refused with the argument named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch

from energon_ray.transforms import CustomTransform, MergeTransform, TransformMapper


class Mirror(CustomTransform):
    """Mirror left-right, sampled nearest (so the warp is exact)."""

    def apply_transform(self, matrix, dst_size):
        return self.translate(dst_size[1], 0) @ self.hflip() @ matrix, dst_size, ("Mirror",)

    def interpolation(self):
        return "nearest"


class Crop(CustomTransform):
    """Keep the ``height`` x ``width`` box whose top-left corner is at ``(top, left)``."""

    def __init__(self, top, left, height, width):
        super().__init__()
        self.box = (top, left, height, width)

    def apply_transform(self, matrix, dst_size):
        top, left, height, width = self.box
        return self.translate(-left, -top) @ matrix, np.array((height, width)), ("Crop", self.box)


class RandomMirror(Mirror):
    """Mirror when ``torch.rand(1) < 0.5``."""

    def apply_transform(self, matrix, dst_size):
        return super().apply_transform(matrix, dst_size) if torch.rand(1) < 0.5 else (matrix, dst_size, None)


@pytest.fixture(scope="module")
def pixels():
    return np.random.default_rng(3).integers(0, 256, (9, 14, 3), dtype=np.uint8)


def test_custom_steps_on_pil_are_exact_flips_and_crops(pixels):
    """Mirror then crop a PIL image: the output is the numpy mirror-and-slice, pixel for pixel."""
    out = MergeTransform([Mirror(), Crop(2, 3, 5, 7)])(PIL.Image.fromarray(pixels))
    assert out.size == (7, 5) and out.mode == "RGB"
    assert np.array_equal(np.asarray(out), pixels[:, ::-1][2:7, 3:10])


def test_custom_steps_on_tensors_are_exact_flips_and_crops(pixels):
    """The same on a float (C, H, W) tensor through grid_sample: exact at pixel centres, nearest."""
    image = torch.from_numpy(pixels).permute(2, 0, 1).float()
    out = MergeTransform([Mirror(), Crop(2, 3, 5, 7)])(image)
    assert out.shape == (3, 5, 7) and out.dtype == torch.float32
    assert torch.equal(out, image.flip(-1)[:, 2:7, 3:10])


def test_draws_come_from_torchs_generator(pixels):
    """A random step replays with the same torch seed; the steps draw in order, nothing else draws."""
    image = PIL.Image.fromarray(pixels)
    merge = MergeTransform([RandomMirror(), RandomMirror(), RandomMirror()])
    torch.manual_seed(5)
    expected_flips = int(sum(bool(torch.rand(1) < 0.5) for _ in range(3)))
    after = torch.get_rng_state()
    torch.manual_seed(5)
    out = np.asarray(merge(image))
    assert torch.equal(torch.get_rng_state(), after)
    assert np.array_equal(out, pixels[:, ::-1] if expected_flips % 2 else pixels)


def test_matrix_helpers_and_interpolation_default():
    """The public matrix helpers compose as documented; no step with an opinion leaves bilinear."""
    point = np.array([2.0, 1.0, 1.0])
    assert np.allclose(TransformMapper.translate(3, -1) @ point, [5, 0, 1])
    assert np.allclose(TransformMapper.scale(2, 3) @ point, [4, 3, 1])
    assert np.allclose(TransformMapper.rotate(np.pi / 2) @ point, [1, -2, 1])
    assert np.allclose(TransformMapper.shear(1, 0) @ point, [3, 1, 1])
    assert np.allclose(TransformMapper.hflip() @ point, [-2, 1, 1]) and np.allclose(TransformMapper.vflip() @ point, [2, -1, 1])
    merge = MergeTransform([Crop(0, 0, 2, 2)])
    assert str(merge.interpolation).lower().endswith("bilinear") and merge.fill_value is None


def test_the_package_does_not_import_torchvision():
    """Importing and using energon_ray.transforms loads no torchvision (a Ray worker may not have it)."""
    code = (
        "import sys, PIL.Image; import energon_ray.transforms as t; from tests.unit.test_transforms import Mirror;"
        "t.MergeTransform([Mirror()])(PIL.Image.new('RGB', (4, 3))); print('torchvision' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert done.stdout.strip() == "False"


def test_bad_input_names_the_argument():
    """Wrong types and shapes are refused with the argument named, never an assert."""
    with pytest.raises(TypeError, match="transforms must be a list of transforms, got Mirror"):
        MergeTransform(Mirror())
    with pytest.raises(ValueError, match=r"transforms\[1\] is a builtins.str, which has no mapper"):
        MergeTransform([Mirror(), "flip"])
    merge = MergeTransform([Mirror()])
    with pytest.raises(TypeError, match="got ndarray"):
        merge(np.zeros((3, 4, 4), dtype=np.float32))
    with pytest.raises(TypeError, match=r"must be floating point, got torch.uint8"):
        merge(torch.zeros(3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"must be \(C, H, W\), got shape \(2, 3, 4, 4\)"):
        merge(torch.zeros(2, 3, 4, 4))

    class Lanczos(Crop):
        def interpolation(self):
            return "lanczos"

    with pytest.raises(ValueError, match="interpolation 'lanczos' is not supported on PIL images"):
        MergeTransform([Lanczos(0, 0, 2, 2)])(PIL.Image.new("RGB", (4, 4)))

    class Grey(Crop):
        def fill(self):
            return 128

    with pytest.raises(ValueError, match="fill=128 is not supported on tensors"):
        MergeTransform([Grey(0, 0, 2, 2)])(torch.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="the steps disagree on interpolation: 'nearest'"):
        MergeTransform([Mirror(), Lanczos(0, 0, 2, 2)])
