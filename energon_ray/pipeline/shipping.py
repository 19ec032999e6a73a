"""Send an object to Ray tasks as cloudpickle bytes and unpickle it once per worker process.

User code (a task encoder defined in the training script or in a module next to it) is pickled
by value, so Ray workers on other nodes need not be able to import it; installed packages are
pickled by reference as usual.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from typing import Any, Dict, Iterable

import cloudpickle

from energon_ray.errors import FatalSampleError

_CACHE: Dict[str, Any] = {}
_INSTALLED = tuple(
    os.path.realpath(p)
    for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], sysconfig.get_paths()["stdlib"], sys.prefix}
)


def _user_modules(obj: Any) -> Iterable[Any]:
    """Modules of ``obj``'s class hierarchy that are plain files outside the installed packages."""
    for cls in type(obj).__mro__:
        module = sys.modules.get(cls.__module__)
        path = getattr(module, "__file__", None)
        if module is None or path is None or cls.__module__ == "__main__":
            continue
        if cls.__module__.split(".")[0] in ("energon_ray", "megatron", "torch", "builtins"):
            continue
        if not os.path.realpath(path).startswith(_INSTALLED):
            yield module


class Shipped:
    """A picklable handle whose ``get()`` returns the object, decoded once per process.

    Example:
        >>> Shipped([1, 2]).get()
        [1, 2]
    """

    def __init__(self, obj: Any, what: str = "object"):
        modules = list({id(m): m for m in _user_modules(obj)}.values())
        for module in modules:
            cloudpickle.register_pickle_by_value(module)
        try:
            self.blob = cloudpickle.dumps(obj)
        except Exception as exc:
            raise TypeError(f"the {what} cannot be sent to Ray workers (it must be picklable): {exc}") from exc
        finally:
            for module in modules:
                cloudpickle.unregister_pickle_by_value(module)
        self.key = hashlib.sha1(self.blob).hexdigest()
        self.what = what
        _CACHE.setdefault(self.key, obj)

    def get(self) -> Any:
        obj = _CACHE.get(self.key)
        if obj is None:
            try:
                obj = _CACHE[self.key] = cloudpickle.loads(self.blob)
            except Exception as exc:
                raise FatalSampleError(
                    f"cannot load the {self.what} in a Ray worker: {type(exc).__name__}: {exc}. Make the code "
                    "it needs importable on every node (pip install it, or pass runtime_env={'py_modules': [...]} "
                    "or {'working_dir': ...} to ray.init)"
                ) from exc
        return obj

    def __getstate__(self) -> Dict[str, Any]:
        return {"blob": self.blob, "key": self.key, "what": self.what}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.blob, self.key, self.what = state["blob"], state["key"], state.get("what", "object")
