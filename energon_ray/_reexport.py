"""Lazy re-exports for Energon's documented submodule paths (``energon_ray.flavors``, ``energon_ray.media``…).

A re-export module lists the names Energon's module of the same path offers and resolves each on first
use from ``energon_ray``'s top level, so names added there later appear here too; a name we do not
have raises ``AttributeError`` (``ImportError`` in ``from … import``) pointing at docs/compatibility.md.

Example:
    >>> __getattr__ = lazy_names("energon_ray.example", "megatron.energon.example", ("WorkerConfig",))
    >>> __getattr__("WorkerConfig").__name__
    'WorkerConfig'
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable


def lazy_names(module: str, energon_module: str, names: Iterable[str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that fetches ``names`` from ``energon_ray`` when asked.

    Args:
        module: the re-export module's own name (for messages).
        energon_module: the Energon module it stands for (for messages).
        names: the names it may offer.

    Returns:
        The function to assign to the re-export module's ``__getattr__``.
    """
    offered = tuple(names)

    def __getattr__(name: str) -> Any:
        if name not in offered:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        top = importlib.import_module("energon_ray")
        try:
            return getattr(top, name)
        except AttributeError:
            raise AttributeError(
                f"{module}.{name} ({energon_module}.{name}) is not available in energon_ray; "
                "see docs/compatibility.md"
            ) from None

    return __getattr__
