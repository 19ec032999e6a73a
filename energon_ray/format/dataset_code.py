"""What a ``dataset.yaml`` names that is code: sample and factory classes (``{__module__, __class__}``),
``file.py:function`` loaders and ``{__module__, __function__}`` factories of loaders. Energon's and our
own classes resolve to ours; anything else is imported or executed only when the dataset is trusted
(``trust_dataset_code``: safe by default). A remote dataset's module is copied locally once (Python
imports files).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from energon_ray.errors import DatasetConfigError, untrusted
from energon_ray.samples import SAMPLE_TYPES, CrudeSample
from energon_ray.storage import RemotePath, StorageError, read_optional
from energon_ray.storage.cache import private_folder, user_temp_folder

#: Modules whose sample classes we provide under the same names.
_COMPATIBLE_MODULES = ("megatron.energon", "energon_ray")


def resolve_class(spec: Any, file: str, what: str, trusted: bool = False) -> type:
    """Resolve ``{__module__, __class__}`` (or a bare class name) to a class.

    A module other than energon_ray / megatron.energon is imported only when ``trusted``.

    Raises:
        DatasetConfigError: naming the file and the unknown value.
        UntrustedCodeError: another module without the opt-in.
    """
    if isinstance(spec, str):
        module, name = "energon_ray", spec
    elif isinstance(spec, dict) and "__class__" in spec:
        module, name = spec.get("__module__", "energon_ray"), spec["__class__"]
        _check_names(file, what, module, name)
    else:
        raise DatasetConfigError(f"{file}: {what} must be a class name or {{__module__, __class__}}, got {spec!r}")
    if module in _COMPATIBLE_MODULES or module.startswith("megatron.energon"):
        if name in SAMPLE_TYPES:
            return SAMPLE_TYPES[name]
        if name in ("CrudeSample", "CrudeWebdataset"):
            return CrudeSample
        raise DatasetConfigError(
            f"{file}: unknown {what} {name!r}; known: {sorted(SAMPLE_TYPES) + ['CrudeWebdataset']}"
        )
    if not trusted:
        raise untrusted(f"{what} {module}.{name} would import module {module!r}", file)
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise DatasetConfigError(f"{file}: cannot import {what} {module}.{name}: {exc}") from None


def _check_names(file: str, what: str, module: Any, name: Any) -> None:
    """A config's ``__module__`` and ``__class__`` are names (strings)."""
    for key, value in (("__module__", module), ("__class__", name)):
        if not isinstance(value, str) or not value:
            raise DatasetConfigError(f"{file}: {what} {key} must be a name, got {type(value).__name__} {value!r}")


def factory_sample_type(module: str, name: str, file: str, trusted: bool) -> type:
    """The ``__sample_type__`` of a user's dataset factory class (``__class__: MyWebdataset`` of module
    ``module``, e.g. ``class MyWebdataset(DefaultDecoderWebdatasetFactory[MySample])``); imported only when trusted.

    Raises:
        UntrustedCodeError: without the opt-in. DatasetConfigError: not importable, or no sample type.
    """
    factory = resolve_class({"__module__": module, "__class__": name}, file, "dataset class", trusted)
    sample_type = getattr(factory, "__sample_type__", None)
    if not isinstance(sample_type, type):
        raise DatasetConfigError(f"{file}: dataset class {module}.{name} has no __sample_type__ (a Sample subclass)")
    if sample_type.__name__ == "CrudeSample" or issubclass(sample_type, CrudeSample):
        return CrudeSample
    if sample_type.__module__.startswith("megatron.energon") and sample_type.__name__ in SAMPLE_TYPES:
        return SAMPLE_TYPES[sample_type.__name__]  # an Energon factory subclass: the same type of ours
    return sample_type


class RemoteFiles:
    """The bytes of a remote dataset's config files, each fetched once (None: the file does not exist)."""

    def __init__(self, files: Optional[Dict[str, Optional[bytes]]] = None):
        self.files: Dict[str, Optional[bytes]] = dict(files or {})

    def read(self, path: RemotePath) -> Optional[bytes]:
        if str(path) not in self.files:
            self.files[str(path)] = read_optional(path)
        return self.files[str(path)]


def _local_code_copy(source: RemotePath, data: bytes) -> Path:
    """A local copy of a remote dataset module (Python imports files), named by its URL and content, in
    a folder of this user's own; a file there that holds other bytes is replaced before it is imported."""
    import hashlib

    digest = hashlib.sha256(str(source).encode() + b"\0" + data).hexdigest()[:24]
    try:
        folder = Path(private_folder(user_temp_folder("energon_ray_dataset_code"))) / digest
    except StorageError as exc:
        raise DatasetConfigError(f"{source}: cannot keep a local copy to import: {exc}") from None
    folder.mkdir(mode=0o700, exist_ok=True)
    local = folder / source.name
    if not (local.is_file() and not local.is_symlink() and local.read_bytes() == data):
        tmp = folder / f".{source.name}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, local)
    return local


def load_function(
    ref: str, meta: Path | RemotePath, file: str, what: str, trusted: bool, files: Optional[RemoteFiles] = None
) -> Callable:
    if ":" not in ref:
        raise DatasetConfigError(f"{file}: {what} must look like 'file.py:function', got {ref!r}")
    module_file, fn_name = ref.split(":", 1)
    source = meta / module_file
    if not trusted:
        raise untrusted(f"{what} {ref!r} would execute {source}", file)
    if isinstance(source, RemotePath):
        data = (files or RemoteFiles()).read(source)
        if data is None:
            raise DatasetConfigError(f"{file}: {what} module {source} does not exist")
        source = _local_code_copy(source, data)
    if not source.is_file():
        raise DatasetConfigError(f"{file}: {what} module {source} does not exist")
    mod_name = f"_energon_ray_dsmod_{abs(hash(str(source.resolve())))}"
    module = sys.modules.get(mod_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(mod_name, source)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as exc:
            raise DatasetConfigError(f"{source}: cannot import {what} module: {exc}") from None
        sys.modules[mod_name] = module
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise DatasetConfigError(f"{file}: {what} {ref!r}: {source} has no function {fn_name!r}")
    return fn


def load_callable(
    value: Any, meta: Path | RemotePath, file: str, what: str, trusted: bool, files: Optional[RemoteFiles] = None
) -> Callable:
    """A ``sample_loader``/``part_filter`` of a dataset config: ``'file.py:function'`` (see
    :func:`load_function`) or, as Energon's config reader makes one, ``{__module__, __function__ (or
    __class__), **kwargs}``: that function called (class made) with the kwargs, giving the callable.
    Either is imported only when ``trusted``.

    Raises:
        UntrustedCodeError: without the opt-in. DatasetConfigError: another kind of value, or the
            mapping's call fails or gives no callable.
    """
    if isinstance(value, str):
        return load_function(value, meta, file, what, trusted, files)
    if not (isinstance(value, dict) and ("__function__" in value or "__class__" in value)):
        raise DatasetConfigError(
            f"{file}: {what} must be 'file.py:function' or a mapping of __module__ and __function__ (or __class__) "
            f"with its arguments, got {type(value).__name__} {value!r}"
        )
    kwargs = dict(value)
    module, name = kwargs.pop("__module__", None), kwargs.pop("__function__", None) or kwargs.pop("__class__", None)
    _check_names(file, what, module, name)
    if not trusted:
        raise untrusted(f"{what} {module}.{name} would import module {module!r}", file)
    try:
        made = getattr(importlib.import_module(module), name)(**kwargs)
    except (ImportError, AttributeError) as exc:
        raise DatasetConfigError(f"{file}: cannot import {what} {module}.{name}: {exc}") from None
    except Exception as exc:
        raise DatasetConfigError(f"{file}: {what} {module}.{name}(**{kwargs!r}) failed: {type(exc).__name__}: {exc}") from None
    if not callable(made):
        raise DatasetConfigError(f"{file}: {what} {module}.{name}(**{kwargs!r}) gave {made!r}, which is not callable")
    return made


def named_sample_type(data: Dict[str, Any], fname: str, trusted: bool) -> type:
    """The sample class a dataset config names (``__class__``/``__module__`` or ``sample_type``),
    taken out of ``data``; code outside energon_ray's and Energon's modules only when ``trusted``."""
    if "__class__" in data:
        cls_name = data.pop("__class__")
        module = data.pop("__module__", None)
        _check_names(fname, "dataset", "megatron.energon" if module is None else module, cls_name)
        if module is not None and module not in _COMPATIBLE_MODULES and not module.startswith(_COMPATIBLE_MODULES):
            return factory_sample_type(module, cls_name, fname, trusted)
        if cls_name == "CrudeWebdataset":
            return CrudeSample
        if cls_name.endswith("Webdataset") and cls_name[: -len("Webdataset")] + "Sample" in SAMPLE_TYPES:
            # legacy factories: CaptioningWebdataset → CaptioningSample, VQAOCRWebdataset → VQAOCRSample
            return SAMPLE_TYPES[cls_name[: -len("Webdataset")] + "Sample"]
        raise DatasetConfigError(f"{fname}: unknown dataset class {cls_name!r}")
    if "sample_type" in data:
        return resolve_class(data.pop("sample_type"), fname, "sample_type", trusted)
    raise DatasetConfigError(f"{fname}: needs 'sample_type' (or a top-level '__class__')")
