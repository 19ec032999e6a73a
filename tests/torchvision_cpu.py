"""Import torchvision's transforms on a CPU-only torch build.

The torchvision wheels on PyPI are CUDA builds: on the CPU-only torch this project installs, their
compiled operator library fails to load (torchvision catches that) and ``torchvision/__init__``
then stops at registering shapes for its ``nms``/``qnms`` operators, which that library would have
declared. Declaring those two schemas lets the import finish; nothing here calls them. The
transforms the tests use are pure Python over torch and PIL.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import torch

_DECLARED = []


def import_torchvision_transforms() -> ModuleType:
    """``torchvision.transforms``, importable here whether or not torchvision's operators load."""
    try:
        return importlib.import_module("torchvision.transforms")
    except RuntimeError as error:
        if "torchvision::nms" not in str(error):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        if name != "torchvision.extension":  # keeps its record that the operators did not load
            del sys.modules[name]
    library = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _DECLARED.append(library)  # a Library's definitions last as long as the object
    return importlib.import_module("torchvision.transforms")
