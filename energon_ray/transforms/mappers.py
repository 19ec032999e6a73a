"""Geometric steps as 3x3 matrices: one mapper per supported torchvision transform.

A mapper turns its torchvision transform into a change of the running homography (pixel
coordinates of the input to pixel coordinates of the output, ``x`` right, ``y`` down) and of the
output size ``(height, width)``, drawing the transform's random numbers from torch's generator in
the order Energon's mappers draw them. :class:`~energon_ray.transforms.merge.MergeTransform`
collects the steps and warps the image once.

torchvision is never imported here: a built-in mapper recognises its transform by the class names
in the transform's MRO, so this module (and a Ray worker unpickling it) works without torchvision.
``ResizeMapper.source_type`` and the like import it when read.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, List, Optional, Tuple, TypeVar, Union

import numpy as np
import torch

FillValue = Optional[Union[int, float, Tuple[Union[int, float], ...], List[Union[int, float]]]]
Step = Tuple[np.ndarray, np.ndarray, Any]
TTransform = TypeVar("TTransform")

_TORCHVISION_MODULES = ("torchvision.transforms.transforms", "torchvision.transforms")


class _TorchvisionClass:
    """Class attribute that names a torchvision transform class and imports it only when read."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, instance, owner):
        from torchvision import transforms  # optional dependency: read only by users who have it

        return getattr(transforms, self.name)

    def matches(self, transform: object) -> bool:
        """Whether ``transform`` is an instance of that torchvision class (or of a subclass)."""
        return any(
            klass.__name__ == self.name and klass.__module__ in _TORCHVISION_MODULES
            for klass in type(transform).__mro__
        )


def _eye() -> np.ndarray:
    return np.eye(3, dtype=np.float64)


class TransformMapper(ABC, Generic[TTransform]):
    """One step of a :class:`MergeTransform`: wraps a transform and states it as a matrix.

    Subclasses set ``source_type`` (the transform class they stand for) and implement
    :meth:`apply_transform`. Calling a mapper applies the wrapped transform on its own.
    """

    source_type: ClassVar[type]
    transform: TTransform

    #: Mapper classes that name a ``source_type``, in definition order (MergeTransform picks from these).
    registered: ClassVar[List[type]] = []

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "source_type" in cls.__dict__:
            TransformMapper.registered.append(cls)

    @classmethod
    def accepts(cls, transform: object) -> bool:
        """Whether this mapper stands for ``transform`` (an instance of its ``source_type``)."""
        source = cls.__dict__.get("source_type")
        if isinstance(source, _TorchvisionClass):
            return source.matches(transform)
        return isinstance(transform, cls.source_type)

    def __init__(self, transform: TTransform):
        self.transform = transform

    def __call__(self, sample):
        return self.transform(sample)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.transform!r})"

    # The elementary matrices, for subclasses (and CustomTransform authors) to compose.
    @staticmethod
    def translate(x: float, y: float) -> np.ndarray:
        """Shift by ``(x, y)`` pixels."""
        out = _eye()
        out[:2, 2] = (x, y)
        return out

    @staticmethod
    def rotate(angle: float) -> np.ndarray:
        """Rotate by ``angle`` radians, counter-clockwise on screen (the y axis points down)."""
        cos, sin = np.cos(angle), np.sin(angle)
        out = _eye()
        out[0, 0], out[0, 1] = cos, sin
        out[1, 0], out[1, 1] = -sin, cos
        return out

    @staticmethod
    def scale(x: float, y: float) -> np.ndarray:
        """Stretch by ``x`` horizontally and ``y`` vertically."""
        return np.diag((x, y, 1.0)).astype(np.float64)

    @staticmethod
    def shear(x: float, y: float) -> np.ndarray:
        """Shear: ``x`` is the x-offset per unit of y, ``y`` the y-offset per unit of x."""
        out = _eye()
        out[0, 1], out[1, 0] = x, y
        return out

    @staticmethod
    def hflip() -> np.ndarray:
        """Mirror the x axis (follow with a translation by the width to stay in the image)."""
        return np.diag((-1.0, 1.0, 1.0))

    @staticmethod
    def vflip() -> np.ndarray:
        """Mirror the y axis (follow with a translation by the height to stay in the image)."""
        return np.diag((1.0, -1.0, 1.0))

    @abstractmethod
    def apply_transform(self, matrix: np.ndarray, dst_size: np.ndarray) -> Step:
        """Compose this step onto ``matrix`` for an image of ``dst_size`` ``(height, width)``.

        Returns:
            ``(matrix, dst_size, params)``: the new matrix (this step's matrix times ``matrix``),
            the size after this step and what was drawn (for inspection).
        """

    def fill(self) -> FillValue:
        """The value for pixels outside the source, if this step has an opinion."""
        return None

    def interpolation(self) -> Optional[Any]:
        """The resampling mode (torchvision ``InterpolationMode`` or its name), if any."""
        return None


class CustomTransform(TransformMapper[torch.nn.Module]):
    """Base for user steps: subclass it and implement ``apply_transform`` with the matrix helpers."""

    def __init__(self, transform: Any = None):
        super().__init__(transform)


def _pair(size) -> Tuple[int, int]:
    """A torchvision size argument (number, 1- or 2-sequence) as ``(height, width)``."""
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    if len(size) == 1:
        return size[0], size[0]
    return size[0], size[1]


class ResizeMapper(TransformMapper[Any]):
    """``torchvision.transforms.Resize`` (``size`` as an int or 1-sequence: the shorter edge; ``max_size``)."""

    source_type = _TorchvisionClass("Resize")

    def _target(self, height: int, width: int) -> Tuple[int, int]:
        size = self.transform.size
        size = [size] if isinstance(size, int) else list(size)
        if len(size) != 1:
            return size[0], size[1]
        short_edge = size[0]
        landscape = width > height
        short, long = (height, width) if landscape else (width, height)
        new_short, new_long = short_edge, int(short_edge * long / short)
        max_size = self.transform.max_size
        if max_size is not None:
            if max_size <= short_edge:
                raise ValueError(
                    f"Resize: max_size = {max_size} must be greater than the shorter edge's size {size}"
                )
            if new_long > max_size:
                new_short, new_long = int(max_size * new_short / new_long), max_size
        return (new_short, new_long) if landscape else (new_long, new_short)

    def apply_transform(self, matrix: np.ndarray, dst_size: np.ndarray) -> Step:
        new_h, new_w = self._target(dst_size[0], dst_size[1])
        matrix = self.scale(new_w / dst_size[1], new_h / dst_size[0]) @ matrix
        size = self.transform.size
        return matrix, np.array((new_h, new_w), dtype=dst_size.dtype), ("Resize", [size] if isinstance(size, int) else size)

    def interpolation(self):
        return self.transform.interpolation


class RandomResizedCropMapper(TransformMapper[Any]):
    """``torchvision.transforms.RandomResizedCrop``: a random box (area ``scale``, aspect ``ratio``) resized to ``size``."""

    source_type = _TorchvisionClass("RandomResizedCrop")

    def _box(self, height: int, width: int) -> Tuple[int, int, int, int]:
        """``(top, left, box_height, box_width)``, drawn as torchvision draws them from the image's size."""
        lo_scale, hi_scale = self.transform.scale
        ratios = self.transform.ratio
        log_lo, log_hi = torch.log(torch.tensor(ratios))
        area = height * width
        for _attempt in range(10):
            area_share = torch.empty(1).uniform_(lo_scale, hi_scale).item()
            aspect = torch.exp(torch.empty(1).uniform_(log_lo, log_hi)).item()
            box_w = int(round(math.sqrt(area * area_share * aspect)))
            box_h = int(round(math.sqrt(area * area_share / aspect)))
            if 0 < box_w <= width and 0 < box_h <= height:
                top = torch.randint(0, height - box_h + 1, size=(1,)).item()
                left = torch.randint(0, width - box_w + 1, size=(1,)).item()
                return top, left, box_h, box_w
        # no fitting box in ten draws: the largest centred box of a ratio within bounds
        aspect = float(width) / float(height)
        box_h, box_w = height, width
        if aspect < min(ratios):
            box_h = int(round(width / min(ratios)))
        elif aspect > max(ratios):
            box_w = int(round(height * max(ratios)))
        return (height - box_h) // 2, (width - box_w) // 2, box_h, box_w

    def apply_transform(self, matrix: np.ndarray, dst_size: np.ndarray) -> Step:
        top, left, box_h, box_w = self._box(dst_size[0], dst_size[1])
        out_h, out_w = self.transform.size
        matrix = self.translate(-left, -top) @ matrix
        box = np.array((box_h, box_w), dtype=dst_size.dtype)
        matrix = self.scale(out_w / box[1], out_h / box[0]) @ matrix
        return matrix, np.array(self.transform.size, dtype=dst_size.dtype), ("RandomResizedCrop", (top, left, box_h, box_w))

    def interpolation(self):
        return self.transform.interpolation


class _RandomFlip(TransformMapper[Any]):
    """Shared by the two flips: one ``torch.rand(1)`` draw against ``p``."""

    _axis: ClassVar[int]  # 1: mirror x (horizontal flip), 0: mirror y (vertical flip)
    _name: ClassVar[str]

    def apply_transform(self, matrix: np.ndarray, dst_size: np.ndarray) -> Step:
        flipped = torch.rand(1) < self.transform.p
        if flipped:
            if self._axis == 1:
                matrix = self.translate(dst_size[1], 0) @ (self.hflip() @ matrix)
            else:
                matrix = self.translate(0, dst_size[0]) @ (self.vflip() @ matrix)
        return matrix, dst_size, (self._name, flipped)


class RandomHorizontalFlipMapper(_RandomFlip):
    """``torchvision.transforms.RandomHorizontalFlip``."""

    source_type = _TorchvisionClass("RandomHorizontalFlip")
    _axis = 1
    _name = "RandomHorizontalFlip"


class RandomVerticalFlipMapper(_RandomFlip):
    """``torchvision.transforms.RandomVerticalFlip``."""

    source_type = _TorchvisionClass("RandomVerticalFlip")
    _axis = 0
    _name = "RandomVerticalFlip"


class RandomRotationMapper(TransformMapper[Any]):
    """``torchvision.transforms.RandomRotation`` about the image centre (``expand`` grows the canvas as PIL does)."""

    source_type = _TorchvisionClass("RandomRotation")

    def __init__(self, transform):
        if transform.center is not None:
            raise ValueError(f"RandomRotation: center={transform.center!r} is not supported (only None, the image centre)")
        super().__init__(transform)

    def apply_transform(self, matrix: np.ndarray, dst_size: np.ndarray) -> Step:
        degrees = self.transform.get_params(self.transform.degrees)
        angle = degrees * np.pi / 180
        in_h, in_w = dst_size[0], dst_size[1]
        out_size = dst_size
        if self.transform.expand:
            sin, cos = np.abs(np.sin(angle)), np.abs(np.cos(angle))
            span_w = sin * in_h + cos * in_w
            span_h = sin * in_w + cos * in_h
            # PIL's expand: the rotated corners' bounding box, its edges rounded outwards from the centre
            out_w = np.ceil(in_w / 2 + span_w / 2) - np.floor(in_w / 2 - span_w / 2)
            out_h = np.ceil(in_h / 2 + span_h / 2) - np.floor(in_h / 2 - span_h / 2)
            out_size = np.array((int(out_h), int(out_w)), dtype=dst_size.dtype)
        about_centre = (
            self.translate(out_size[1] / 2, out_size[0] / 2) @ self.rotate(angle) @ self.translate(-in_w / 2, -in_h / 2)
        )
        return about_centre @ matrix, out_size, ("RandomRotation", degrees)

    def fill(self) -> FillValue:
        return self.transform.fill

    def interpolation(self):
        return self.transform.interpolation


class RandomCropMapper(TransformMapper[Any]):
    """``torchvision.transforms.RandomCrop`` (``pad_if_needed`` pads both sides; ``padding`` is not applied, as in Energon)."""

    source_type = _TorchvisionClass("RandomCrop")

    def apply_transform(self, matrix: np.ndarray, dst_size: np.ndarray) -> Step:
        crop_h, crop_w = self.transform.size
        height, width = int(dst_size[0]), int(dst_size[1])
        if self.transform.pad_if_needed:
            if width < crop_w:  # pad by the shortfall on the left and on the right
                matrix = self.translate(crop_w - width, 0) @ matrix
                width += 2 * (crop_w - width)
            if height < crop_h:
                matrix = self.translate(0, crop_h - height) @ matrix
                height += 2 * (crop_h - height)
        if height < crop_h or width < crop_w:
            raise ValueError(
                f"RandomCrop: size {(crop_h, crop_w)} is larger than the image {(height, width)} "
                "(set pad_if_needed=True to pad it)"
            )
        top = left = 0
        if (height, width) != (crop_h, crop_w):
            top = torch.randint(0, height - crop_h + 1, size=(1,)).item()
            left = torch.randint(0, width - crop_w + 1, size=(1,)).item()
            matrix = self.translate(-left, -top) @ matrix
        return matrix, np.array((crop_h, crop_w), dtype=dst_size.dtype), ("RandomCrop", (left, top, crop_h, crop_w))

    def fill(self) -> FillValue:
        return self.transform.fill


def _homography(src: List[List[int]], dst: List[List[int]]) -> np.ndarray:
    """The projective map taking the four ``src`` points onto ``dst``, solved as torchvision does (float32 least squares)."""
    rows = []
    for (sx, sy), (dx, dy) in zip(src, dst):
        rows.append([sx, sy, 1, 0, 0, 0, -dx * sx, -dx * sy])
        rows.append([0, 0, 0, sx, sy, 1, -dy * sx, -dy * sy])
    system = torch.tensor(rows, dtype=torch.float)
    targets = torch.tensor(dst, dtype=torch.float).view(8)
    coeffs = torch.linalg.lstsq(system, targets, driver="gels").solution
    out = np.ones(9, dtype=np.float32)
    out[:8] = coeffs.numpy()
    return out.reshape(3, 3)


class RandomPerspectiveMapper(TransformMapper[Any]):
    """``torchvision.transforms.RandomPerspective`` (``fill`` 0 only)."""

    source_type = _TorchvisionClass("RandomPerspective")

    def __init__(self, transform):
        if transform.fill != 0:
            raise ValueError(f"RandomPerspective: fill={transform.fill!r} is not supported (only 0)")
        super().__init__(transform)

    def apply_transform(self, matrix: np.ndarray, dst_size: np.ndarray) -> Step:
        corners = moved = None
        if torch.rand(1) <= self.transform.p:
            height, width = int(dst_size[0]), int(dst_size[1])
            corners, moved = self.transform.get_params(width, height, self.transform.distortion_scale)
            matrix = _homography(corners, moved) @ matrix
        return matrix, dst_size, ("RandomPerspective", corners, moved)

    def fill(self) -> FillValue:
        return self.transform.fill

    def interpolation(self):
        return self.transform.interpolation


class CenterCropMapper(TransformMapper[Any]):
    """``torchvision.transforms.CenterCrop`` (a crop larger than the image pads with the fill)."""

    source_type = _TorchvisionClass("CenterCrop")

    def apply_transform(self, matrix: np.ndarray, dst_size: np.ndarray) -> Step:
        crop_h, crop_w = _pair(self.transform.size)
        down = round(float(crop_h - dst_size[0]) / 2)
        right = round(float(crop_w - dst_size[1]) / 2)
        matrix = self.translate(right, down) @ matrix
        return matrix, np.array((crop_h, crop_w), dtype=dst_size.dtype), ("CenterCrop", (down, right, crop_h, crop_w))
