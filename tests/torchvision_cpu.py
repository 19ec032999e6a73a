"""torchvision's transforms for the parity tests, from a folder beside the virtualenv.

torchvision is not a dependency: the wheels on PyPI are CUDA builds, and installed next to this
project's CPU-only torch they break ``import torchmetrics``/``lightning`` (which import torchvision
when it is installed). The README's set-up puts it in a side folder instead,
``pip install --no-deps --target .venv/torchvision torchvision==0.28.0`` (torch 2.13's release; set
``ENERGON_RAY_TEST_TORCHVISION`` to use another folder), which only the tests that ask for it see.

There its compiled operator library does not load (it needs CUDA's libraries; torchvision catches
that) and ``torchvision/__init__`` then stops at registering shapes for its ``nms``/``qnms``
operators, which that library would have declared. Declaring those two schemas lets the import
finish; nothing calls them. The transforms the tests use are pure Python over torch and PIL.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

SIDE_FOLDER = Path(os.environ.get("ENERGON_RAY_TEST_TORCHVISION", Path(__file__).resolve().parents[1] / ".venv" / "torchvision"))
_DECLARED = []


def _import() -> ModuleType:
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


def import_torchvision_transforms() -> ModuleType:
    """``torchvision.transforms`` from :data:`SIDE_FOLDER` (the folder is on ``sys.path`` only while importing)."""
    if "torchvision.transforms" in sys.modules:
        return sys.modules["torchvision.transforms"]
    if not (SIDE_FOLDER / "torchvision").is_dir():
        raise RuntimeError(
            f"no torchvision in {SIDE_FOLDER}: run `.venv/bin/pip install --no-deps --target {SIDE_FOLDER} "
            "torchvision==0.28.0` (the README's set-up does), or set ENERGON_RAY_TEST_TORCHVISION to such a folder"
        )
    sys.path.insert(0, str(SIDE_FOLDER))
    try:
        return _import()
    finally:
        sys.path.remove(str(SIDE_FOLDER))
