"""MergeTransform: a chain of geometric transforms applied as one warp.

Each step (a torchvision transform through its mapper, or a :class:`CustomTransform`) multiplies
a running 3x3 matrix; the image is then resampled once, so a resize followed by crops, flips and a
rotation blurs it once instead of at every step. The random numbers are drawn step by step from
torch's generator, as Energon's ``MergeTransform`` draws them, so the same seed gives the same
image.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

import numpy as np
import PIL.Image
import torch

from energon_ray.transforms.mappers import FillValue, TransformMapper

_PIL_FILTERS = {
    "nearest": PIL.Image.Resampling.NEAREST,
    "nearest-exact": PIL.Image.Resampling.NEAREST,
    "bilinear": PIL.Image.Resampling.BILINEAR,
    "bicubic": PIL.Image.Resampling.BICUBIC,
}
_TORCH_MODES = ("nearest", "bilinear", "bicubic")


def _mode_name(mode: Any) -> str:
    """``InterpolationMode.BILINEAR`` or ``"bilinear"`` -> ``"bilinear"``."""
    return str(getattr(mode, "value", mode))


def _default_interpolation() -> Any:
    """Bilinear, by its name (Energon's attribute holds torchvision's enum): never a torchvision
    object, so a merge of ``CustomTransform`` steps unpickles where torchvision is not installed
    (a Ray worker on a CPU node), also when the trainer has loaded torchvision."""
    return "bilinear"


def _as_mapper(transform: Any, position: int) -> TransformMapper:
    if isinstance(transform, TransformMapper):  # CustomTransform (or a mapper built by hand): used as it is
        return transform
    for mapper in TransformMapper.registered:
        if mapper.accepts(transform):
            return mapper(transform)
    supported = ", ".join(m.__name__.removesuffix("Mapper") for m in TransformMapper.registered)
    raise ValueError(
        f"MergeTransform: transforms[{position}] is a {type(transform).__module__}.{type(transform).__qualname__}, "
        f"which has no mapper; supported: torchvision's {supported}, or a CustomTransform subclass"
    )


def _agreed(mappers: List[TransformMapper], what: str, same) -> Tuple[Any, Optional[TransformMapper]]:
    """The one value of ``what`` (``fill`` or ``interpolation``) the steps that state it agree on."""
    value, owner = None, None
    for mapper in mappers:
        mine = getattr(mapper, what)()
        if mine is None:
            continue
        if owner is None:
            value, owner = mine, mapper
        elif not same(mine, value):
            raise ValueError(f"MergeTransform: the steps disagree on {what}: {value!r} ({owner!r}) != {mine!r} ({mapper!r})")
    return value, owner


class MergeTransform(torch.nn.Module):
    """Apply ``transforms`` (torchvision geometric transforms and CustomTransforms) as one resampling.

    Args:
        transforms: the steps in order: ``Resize``, ``RandomResizedCrop``, ``CenterCrop``,
            ``RandomCrop``, ``RandomHorizontalFlip``, ``RandomVerticalFlip``, ``RandomRotation``,
            ``RandomPerspective`` (or subclasses), or :class:`CustomTransform` instances. The steps
            that state an interpolation or fill must agree on it.

    Calling it on a PIL image returns a PIL image (PIL's affine or perspective transform); on a
    float ``(C, H, W)`` tensor, a tensor (``grid_sample``, zero fill).
    """

    transforms: List[TransformMapper]

    def __init__(self, transforms: Iterable[Any]):
        super().__init__()
        if isinstance(transforms, (str, bytes)) or not isinstance(transforms, Iterable):
            raise TypeError(f"MergeTransform: transforms must be a list of transforms, got {type(transforms).__name__}")
        self.transforms = [_as_mapper(t, i) for i, t in enumerate(transforms)]
        self.fill_value: FillValue = _agreed(self.transforms, "fill", lambda a, b: a == b)[0]
        mode, _ = _agreed(self.transforms, "interpolation", lambda a, b: _mode_name(a) == _mode_name(b))
        self.interpolation = _default_interpolation() if mode is None else mode

    def extra_repr(self) -> str:
        return ", ".join(repr(m) for m in self.transforms)

    def matrix(self, height: int, width: int) -> Tuple[np.ndarray, np.ndarray]:
        """Draw every step's parameters for a ``height`` x ``width`` input.

        Returns:
            The forward matrix (input pixel coordinates to output ones) and the output
            ``(height, width)``.
        """
        matrix = np.eye(3, dtype=np.float64)
        size = np.array((height, width), dtype=np.int64)
        for mapper in self.transforms:
            matrix, size, _params = mapper.apply_transform(matrix, size)
        return matrix, size

    def forward(self, image):
        if isinstance(image, PIL.Image.Image):
            return self._warp_pil(image, *self.matrix(image.height, image.width))
        if isinstance(image, torch.Tensor):
            if image.dim() != 3:
                raise ValueError(f"MergeTransform: a tensor image must be (C, H, W), got shape {tuple(image.shape)}")
            if not image.is_floating_point():
                raise TypeError(f"MergeTransform: a tensor image must be floating point, got {image.dtype} (convert it first)")
            return self._warp_tensor(image, *self.matrix(image.shape[-2], image.shape[-1]))
        raise TypeError(f"MergeTransform: expected a PIL image or a (C, H, W) tensor, got {type(image).__name__}")

    def _warp_pil(self, image: PIL.Image.Image, matrix: np.ndarray, size: np.ndarray) -> PIL.Image.Image:
        name = _mode_name(self.interpolation)
        if name not in _PIL_FILTERS:
            raise ValueError(f"MergeTransform: interpolation {name!r} is not supported on PIL images (use one of {sorted(_PIL_FILTERS)})")
        backward = np.linalg.inv(matrix)  # PIL asks, for each output pixel, where to sample the input
        backward /= backward[2, 2]
        fill = self.fill_value
        if isinstance(fill, (int, float)):
            fill = (fill,) * len(image.getbands())
        elif fill is not None:
            fill = tuple(fill)
        out_size = (int(size[1]), int(size[0]))
        if np.allclose(backward[2, :2], [0, 0]):
            method, coeffs = PIL.Image.Transform.AFFINE, backward.flatten()[:6]
        else:
            method, coeffs = PIL.Image.Transform.PERSPECTIVE, backward.flatten()[:8]
        return image.transform(out_size, method, tuple(float(c) for c in coeffs), _PIL_FILTERS[name], fillcolor=fill)

    def _warp_tensor(self, image: torch.Tensor, matrix: np.ndarray, size: np.ndarray) -> torch.Tensor:
        name = _mode_name(self.interpolation)
        if name not in _TORCH_MODES:
            raise ValueError(f"MergeTransform: interpolation {name!r} is not supported on tensors (use one of {list(_TORCH_MODES)})")
        if self.fill_value is not None and self.fill_value != 0:
            raise ValueError(f"MergeTransform: fill={self.fill_value!r} is not supported on tensors (only 0)")
        out_h, out_w = int(size[0]), int(size[1])
        in_h, in_w = image.shape[-2], image.shape[-1]
        # grid_sample's coordinates run from -1 to 1 across the image: conjugate the pixel matrix
        normalised = (
            TransformMapper.translate(-1, -1)
            @ TransformMapper.scale(2 / size[1], 2 / size[0])
            @ matrix
            @ TransformMapper.scale(in_w / 2, in_h / 2)
            @ TransformMapper.translate(1, 1)
        )
        backward = np.linalg.inv(normalised)
        if np.allclose(backward[2, :2], [0, 0]):
            theta = torch.as_tensor(backward[None, :2, :], dtype=torch.float32)
            grid = torch.nn.functional.affine_grid(theta, [1, image.shape[0], out_h, out_w], align_corners=False)
        else:
            # Energon samples this case on a grid from -1 to 1 inclusive (pixel edges, not centres); so do we
            xs = torch.linspace(-1, 1, out_w, dtype=torch.float32)
            ys = torch.linspace(-1, 1, out_h, dtype=torch.float32)
            points = torch.stack(
                (xs.expand(out_h, out_w), ys[:, None].expand(out_h, out_w), torch.ones(out_h, out_w)), dim=-1
            )  # (H, W, 3): x, y, 1
            mapped = torch.as_tensor(backward, dtype=torch.float32)[None, None] @ points[..., None]
            grid = (mapped[:, :, :2, 0] / mapped[:, :, 2:3, 0])[None]
        grid = grid.to(image.dtype)
        return torch.nn.functional.grid_sample(image[None], grid, name, padding_mode="zeros", align_corners=False)[0]
