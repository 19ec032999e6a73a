"""energon_ray.transforms against megatron.energon.transforms: the same seed gives the same pixels and
leaves torch's generator in the same state (each mapper alone and chains), on PIL images and tensors.

The comparisons are exact: both sides build the matrix with the same float64 products in the same
order and draw the same numbers, so there is no rounding to allow for.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import PIL.Image
import pytest
import torch
from tests.torchvision_cpu import import_torchvision_transforms

import energon_ray.transforms as ours

T = import_torchvision_transforms()
import megatron.energon.transforms as theirs  # noqa: E402  (needs torchvision imported first)

pytestmark = pytest.mark.parity

BILINEAR = T.InterpolationMode.BILINEAR


class Shift(ours.CustomTransform):
    """A custom step: a deterministic shift by 3 right, 2 down, plus one random 1-pixel nudge."""

    def apply_transform(self, matrix, dst_size):
        nudge = int(torch.randint(0, 2, ()))
        return self.translate(3 + nudge, 2) @ matrix, dst_size, ("Shift", nudge)


class EnergonShift(theirs.CustomTransform):
    """The same step on Energon's base class."""

    def apply_transform(self, matrix, dst_size):
        nudge = int(torch.randint(0, 2, ()))
        return self.translate(3 + nudge, 2) @ matrix, dst_size, ("Shift", nudge)


#: name -> a factory of the step list (fresh torchvision objects per side).
CASES = {
    "resize_short_edge": lambda: [T.Resize(20)],
    "resize_hw": lambda: [T.Resize((30, 17))],
    "resize_max_size": lambda: [T.Resize(20, max_size=25)],
    "random_resized_crop": lambda: [T.RandomResizedCrop((24, 16))],
    "random_resized_crop_fallback": lambda: [T.RandomResizedCrop(12, scale=(0.99, 1.0), ratio=(4.0, 5.0))],
    "center_crop": lambda: [T.CenterCrop(21)],
    "center_crop_larger_than_image": lambda: [T.CenterCrop((45, 60))],
    "random_crop": lambda: [T.RandomCrop(20)],
    "random_crop_padded": lambda: [T.RandomCrop((40, 60), pad_if_needed=True)],
    "hflip": lambda: [T.RandomHorizontalFlip()],
    "vflip": lambda: [T.RandomVerticalFlip(0.7)],
    "rotation": lambda: [T.RandomRotation(30)],
    "rotation_expand": lambda: [T.RandomRotation((-50, 50), expand=True)],
    "perspective": lambda: [T.RandomPerspective(p=1.0)],
    "resize_crop_flip_rotate_perspective": lambda: [
        T.Resize(32),
        T.RandomResizedCrop(24),
        T.RandomHorizontalFlip(),
        T.RandomRotation(20, interpolation=BILINEAR),
        T.RandomPerspective(p=0.9),
    ],
    "crop_rotate_expand_center_crop_vflip": lambda: [
        T.RandomCrop(30),
        T.RandomRotation(15, expand=True),
        T.CenterCrop(28),
        T.RandomVerticalFlip(),
    ],
}


@pytest.fixture(scope="module")
def images():
    """A 53x37 RGB PIL image (odd sizes: rounding matters) and a float (3, 37, 53) tensor."""
    rng = np.random.default_rng(7)
    pil = PIL.Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8))
    return {"pil": pil, "tensor": torch.from_numpy(rng.random((3, 37, 53), dtype=np.float32))}


def _run(merge, image, seed):
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):  # Energon prints "torch affine" on tensors
        out = merge(image)
    return out, torch.get_rng_state()


def _assert_same(mine, energons):
    (a, state_a), (b, state_b) = mine, energons
    assert type(a) is type(b)
    if isinstance(a, PIL.Image.Image):
        assert (a.size, a.mode) == (b.size, b.mode)
        assert np.array_equal(np.asarray(a), np.asarray(b))
    else:
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(a, b)
    assert torch.equal(state_a, state_b)


@pytest.mark.parametrize("kind", ["pil", "tensor"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_pixels_and_rng_state_as_energon(images, case, kind):
    """Six seeds: our MergeTransform's output equals Energon's bit for bit, and both consumed the same draws."""
    for seed in range(6):
        _assert_same(_run(ours.MergeTransform(CASES[case]()), images[kind], seed),
                     _run(theirs.MergeTransform(CASES[case]()), images[kind], seed))  # fmt: skip


@pytest.mark.parametrize("kind", ["pil", "tensor"])
def test_custom_transform_in_the_middle_matches_energon(images, kind):
    """A CustomTransform between torchvision steps: its matrix and its draw fall in place, as in Energon."""
    def steps(custom):
        return [T.Resize(30), custom, T.RandomHorizontalFlip(), T.CenterCrop((26, 34))]

    for seed in range(4):
        _assert_same(_run(ours.MergeTransform(steps(Shift())), images[kind], seed),
                     _run(theirs.MergeTransform(steps(EnergonShift(None))), images[kind], seed))  # fmt: skip


def test_grayscale_pil_and_fill_match_energon():
    """An "L" image, rotated with expand (the corners filled with Energon's 0 per band)."""
    image = PIL.Image.fromarray(np.arange(31 * 45, dtype=np.uint8).reshape(31, 45))
    for seed in range(3):
        _assert_same(_run(ours.MergeTransform([T.RandomRotation(40, expand=True)]), image, seed),
                     _run(theirs.MergeTransform([T.RandomRotation(40, expand=True)]), image, seed))  # fmt: skip


def test_mappers_recognise_torchvision_classes_and_subclasses():
    """Each torchvision transform (and a subclass of one) gets its mapper; ``source_type`` is torchvision's class."""
    class MyResize(T.Resize):
        pass

    merge = ours.MergeTransform([MyResize(8), T.RandomCrop(4), T.RandomPerspective()])
    assert [type(m) for m in merge.transforms] == [ours.ResizeMapper, ours.RandomCropMapper, ours.RandomPerspectiveMapper]
    assert ours.ResizeMapper.source_type is T.Resize and ours.CenterCropMapper.source_type is T.CenterCrop
    assert merge.interpolation == BILINEAR and merge.fill_value == 0


def test_bad_torchvision_arguments_name_the_argument():
    """Settings a merged warp cannot honour are refused when the MergeTransform is built, naming them."""
    with pytest.raises(ValueError, match=r"RandomRotation: center=\(1, 2\) is not supported"):
        ours.MergeTransform([T.RandomRotation(10, center=(1, 2))])
    with pytest.raises(ValueError, match=r"RandomPerspective: fill=\[1, 1, 1\] is not supported"):
        ours.MergeTransform([T.RandomPerspective(fill=[1, 1, 1])])
    with pytest.raises(ValueError, match="the steps disagree on interpolation"):
        ours.MergeTransform([T.Resize(10), T.RandomRotation(10)])  # bilinear, then nearest
    with pytest.raises(ValueError, match="the steps disagree on fill"):
        ours.MergeTransform([T.RandomCrop(4, fill=3), T.RandomRotation(10, fill=0)])
    with pytest.raises(ValueError, match=r"transforms\[1\] is a torchvision.transforms.transforms.ColorJitter"):
        ours.MergeTransform([T.Resize(10), T.ColorJitter()])
    with pytest.raises(ValueError, match=r"Resize: max_size = 10 must be greater"):
        ours.MergeTransform([T.Resize(10, max_size=10)])(PIL.Image.new("RGB", (20, 30)))
    with pytest.raises(ValueError, match=r"RandomCrop: size \(40, 40\) is larger than the image \(30, 20\)"):
        ours.MergeTransform([T.RandomCrop(40)])(PIL.Image.new("RGB", (20, 30)))
