"""Composing the training configs with Hydra's compose API (what the command line does, from Python)."""

from __future__ import annotations

import difflib
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

#: The package that holds the primary config (``config.yaml``) and the shared groups.
CONFIG_MODULE = "energon_ray.conf"
CONFIG_NAME = "config"

#: The tasks that ship with energon_ray (their folders' conf/ roots are on the primary config's search path).
BUILTIN_TASKS = {
    "vision/captioning": "vision/captioning/synthetic",
    "vision/igpt": "vision/igpt/synthetic",
    "video/vqa": "video/vqa/synthetic",
    "text/lm_packing": "text/lm_packing/synthetic",
}


def quiet_foreign_config_sources() -> None:
    """Silence the multistorageclient Hydra plugin (installed with megatron-energon): on every
    composition it logs a traceback and warns that its ``msc://`` source (unused here) is unavailable."""
    logging.getLogger("multistorageclient.contrib.hydra").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message=r"provider=msc-universal, path= is not available")


def compose(overrides: Sequence[str] = (), config_name: str = CONFIG_NAME) -> DictConfig:
    """The training config for command-line style ``overrides`` (``"+task=vision/igpt"``, ``"trainer.max_steps=5"``).

    Raises:
        ConfigError: a choice of a config group that names none of its built-in options
            (``+task=vision/captionin``), as the command line says it (see :func:`check_group_args`).

    Example:
        >>> cfg = compose(["+task=vision/captioning", "+dataset=vision/captioning/synthetic", "tokenizer.max_length=32"])
        >>> cfg.backbone.max_positions
        32
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    check_group_args(overrides)
    quiet_foreign_config_sources()
    if GlobalHydra.instance().is_initialized():  # e.g. inside a @hydra.main app: compose on a fresh instance
        GlobalHydra.instance().clear()
    with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides))


#: config keys that may hold a local path (besides ``work_dir``): a relative one is taken from the
#: current directory where ``fit`` is called, not from a ray.train worker's (its run's folder)
PATH_KEYS = (
    "ckpt_path", "dataset.path", "dataset.val_path", "dataset.test_path", "trainer.default_root_dir",
    "trainer.ray.storage_path",
)  # fmt: skip
#: the key of a local path in an entry of ``trainer.callbacks`` (a ``ModelCheckpoint``'s folder)
CALLBACK_PATH_KEY = "dirpath"
#: ``ckpt_path`` values that ``Trainer.fit`` looks up itself (``last``: the newest of the configured
#: ``ModelCheckpoint``'s files), not paths; ``registry`` or ``registry:<name>`` too
LIGHTNING_CKPT_NAMES = ("last", "best", "hpc")


def is_lightning_ckpt_name(value: Any) -> bool:
    """Whether ``value`` of ``ckpt_path`` is one of Lightning's names rather than a path.

    Example:
        >>> [is_lightning_ckpt_name(v) for v in ("last", "registry:my-model", "ckpts/last.ckpt")]
        [True, True, False]
    """
    if not isinstance(value, str):
        return False
    return value in LIGHTNING_CKPT_NAMES or value.lower() == "registry" or value.lower().startswith("registry:")


def _path_keys(raw: Dict[str, Any]) -> List[str]:
    """``PATH_KEYS`` and each ``trainer.callbacks.<i>.dirpath`` of the config ``raw``."""
    callbacks = _lookup(raw, "trainer.callbacks")
    callbacks = callbacks if isinstance(callbacks, list) else []
    found = [f"trainer.callbacks.{i}.{CALLBACK_PATH_KEY}" for i, c in enumerate(callbacks) if isinstance(c, dict)]
    return [*PATH_KEYS, *found]


def _lookup(raw: Any, key: str) -> Any:
    """The value at dotted ``key`` (list entries by index) of the plain config ``raw``, or None."""
    for part in key.split("."):
        if isinstance(raw, dict):
            raw = raw.get(part)
        elif isinstance(raw, list) and part.isdigit() and int(part) < len(raw):
            raw = raw[int(part)]
        else:
            return None
    return raw


def with_absolute_paths(cfg: DictConfig, base: Optional[str] = None) -> DictConfig:
    """A copy of ``cfg`` whose ``work_dir`` and other local paths (``PATH_KEYS``, the callbacks'
    ``dirpath``) are absolute, so ``ray.train`` workers, whose current directory is their run's folder,
    find and write the same files; a path interpolating ``work_dir`` follows it, one interpolating a
    relative path (``${oc.env:DATA}``) is resolved here, an object store URL and Lightning's names for
    ``ckpt_path`` (``last``, ``best`` …) stay as they are."""
    base = base or os.getcwd()
    raw = OmegaConf.to_container(cfg, resolve=False)
    cfg = OmegaConf.create(raw)
    cfg.work_dir = os.path.abspath(os.path.join(base, os.path.expanduser(str(cfg.work_dir))))
    for key in _path_keys(raw):
        value = _local_path(cfg, _lookup(raw, key), key)
        if key == "ckpt_path" and is_lightning_ckpt_name(value):
            continue
        if value is not None:
            OmegaConf.update(cfg, key, os.path.abspath(os.path.join(base, value)), merge=False)
    return cfg


def _local_path(cfg: DictConfig, value: Any, key: str) -> Optional[str]:
    """``value`` of ``key`` as a local path to make absolute (``~`` expanded), or None: not a path, an
    object store URL, or an interpolation that resolves to an absolute path (it stays, following
    ``work_dir``); one that resolves to a relative path (``${oc.env:DATA}``) is resolved here."""
    if isinstance(value, str) and "${" in value:
        try:
            value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        except (OmegaConfBaseException, ValueError, KeyError):  # a resolver of another app (hydra:…): left to it
            return None
        if isinstance(value, str) and os.path.isabs(os.path.expanduser(value)):
            return None
    if not isinstance(value, str) or not value or "://" in value:
        return None
    return os.path.expanduser(value)


class ConfigError(ValueError):
    """A composed config's value that cannot work (the message names its key)."""


def check_choices(cfg: DictConfig) -> None:
    """Raise a clear error when the task or the dataset was not chosen.

    Raises:
        ConfigError: ``task`` or ``dataset`` missing (with the built-in choices).
    """
    missing = [group for group in ("task", "dataset") if group not in cfg or cfg[group] is None]
    if missing:
        choices = ", ".join(f"+task={task} +dataset={dataset}" for task, dataset in BUILTIN_TASKS.items())
        raise ConfigError(f"choose {' and '.join(missing)} on the command line; built in: {choices}")


#: the config groups a command line chooses from (``+task=…``), whose built-in options are checked
CHOICE_GROUPS = ("task", "dataset", "backbone", "tokenizer")
#: command-line options that add config folders of the user's own: then any option may exist
OWN_CONFIG_OPTIONS = ("--config-dir", "-cd", "--config-path", "-cp", "hydra.searchpath", "+hydra.searchpath")


def builtin_options(group: str) -> List[str]:
    """The options of config ``group`` that ship with energon_ray (the primary config's and each
    task folder's ``conf/<group>/``), as a command line names them (``vision/captioning``)."""
    root = Path(__file__).resolve().parents[1]
    found = set()
    for conf in [root / "conf", *root.glob("tasks/*/*/conf")]:
        base = conf / group
        found.update(p.relative_to(base).with_suffix("").as_posix() for p in base.rglob("*.yaml"))
    return sorted(found)


def check_group_args(args: Sequence[str]) -> None:
    """Refuse a command-line choice of a config group (``+task=vision/captionin``) that names none of
    its built-in options, with the closest one and the list: Hydra's own message lists only the
    group's top level (\"Available options in 'task': default\"). Not checked where the command line
    adds config folders of the user's own (``--config-dir``, ``hydra.searchpath``).

    Raises:
        ConfigError: naming the argument, the closest option and the built-in ones.
    """
    if any(arg.split("=", 1)[0] in OWN_CONFIG_OPTIONS for arg in args):
        return
    for arg in args:
        key, sep, value = arg.partition("=")
        group = key.lstrip("+")
        if not sep or key.startswith("~") or group not in CHOICE_GROUPS or value in ("", "null"):
            continue
        options = builtin_options(group)
        if value not in options:
            close = difflib.get_close_matches(value, options, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{arg}: no {group} config of that name{hint}; built in: {', '.join(options)}")


#: ``trainer`` keys that are not arguments of the Trainer class (``make_trainer`` takes them out)
TRAINER_OWN_KEYS = ("_target_", "ray", "callbacks")


def check_trainer(cfg: DictConfig) -> None:
    """Refuse ``trainer.*`` values that the Trainer class would take and fail on later, naming the key:
    an argument it does not have (with the closest one), or text, a list … where its signature wants
    a whole number, a number or a flag (``trainer.max_steps=abc`` failed deep in Lightning with
    "'<' not supported between instances of 'str' and 'int'", naming no key).

    Raises:
        ConfigError: naming the key, the value and what the Trainer wants.
    """
    import inspect
    import typing

    from hydra.utils import get_class

    options = OmegaConf.to_container(cfg.trainer, resolve=True) if "trainer" in cfg else {}
    try:
        target = get_class(str(options.get("_target_", "lightning.pytorch.Trainer")))
        params = inspect.signature(target.__init__).parameters
        hints = typing.get_type_hints(target.__init__)
    except Exception:  # a Trainer class of the user's that cannot be inspected: left to it
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        params = {}
    for name, value in options.items():
        if name in TRAINER_OWN_KEYS:
            continue
        if params and name not in params:
            close = difflib.get_close_matches(name, list(params), n=1)
            hint = f" (did you mean trainer.{close[0]}?)" if close else ""
            raise ConfigError(f"trainer.{name}: not an argument of {target.__name__}{hint}")
        kinds = _plain_kinds(hints.get(name))
        if kinds and not _is_kind(value, kinds):
            names = {bool: "a flag", int: "a whole number", float: "a number"}
            wanted = " or ".join(sorted({names[k] for k in kinds if k in names and not (k is int and float in kinds)}))
            raise ConfigError(f"trainer.{name} must be {wanted}{' (or null)' if type(None) in kinds else ''}, got {value!r}")


def _plain_kinds(hint: Any) -> Optional[tuple]:
    """The types of a hint made only of ``int``, ``float``, ``bool`` and ``None`` (``Optional[int]``),
    else None (a hint that allows text or anything else is not checked)."""
    import typing

    args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    kinds = tuple(a for a in args if a in (int, float, bool, type(None)))
    return kinds if kinds and len(kinds) == len(args) else None


def _is_kind(value: Any, kinds: tuple) -> bool:
    """Whether ``value`` is of one of ``kinds`` (a whole number is a number too; a flag is no number)."""
    if value is None or isinstance(value, bool):
        return type(value) in kinds
    if isinstance(value, int):
        return int in kinds or float in kinds
    return isinstance(value, float) and float in kinds


def check_run(cfg: DictConfig) -> None:
    """Refuse a ``seed`` that is not a whole number (``int()`` failed on it with no key, after the
    config was composed) and a ``test`` that is not a flag (``test=maybe`` ran the test split).

    Raises:
        ConfigError: naming the key and its value.
    """
    seed = cfg.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be a whole number, got {seed!r}")
    test = cfg.get("test")
    if test is not None and not isinstance(test, bool):
        raise ConfigError(f"test must be true or false, got {test!r}")


def check_loader(cfg: DictConfig) -> None:
    """Refuse ``loader.*`` values that ``get_loader`` would refuse only once the data module built its
    loaders (in a Hydra traceback naming the keyword, not the config key), naming the key: one the
    loader does not take (with the closest one), a bad ``num_workers``, ``prefetch_batches``,
    ``pin_memory``, ``object_store_limit``, ``executor`` or ``ray_remote_args``.

    Raises:
        ConfigError: naming ``loader.<key>``, the value and what is wanted.
    """
    from energon_ray.loader.feed import check_executor
    from energon_ray.loader.options import check_object_store_limit, check_pin_memory, check_prefetch_batches
    from energon_ray.pipeline.remote_args import check_remote_args
    from energon_ray.tasks.datamodule import LOADER_KEYS

    options = OmegaConf.to_container(cfg.loader, resolve=True) if cfg.get("loader") is not None else {}
    if not isinstance(options, dict):
        raise ConfigError(f"loader must be a mapping of {', '.join(LOADER_KEYS)}, got {options!r}")
    for key in options:
        if key not in LOADER_KEYS:
            close = difflib.get_close_matches(str(key), LOADER_KEYS, n=1)
            hint = f" (did you mean loader.{close[0]}?)" if close else ""
            raise ConfigError(f"loader.{key}: not a loader option{hint}; the loader takes {', '.join(LOADER_KEYS)}")
    workers = options.get("num_workers", 2)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"loader.num_workers must be a whole number >= 0, got {workers!r}")
    checks = (
        ("prefetch_batches", check_prefetch_batches), ("pin_memory", check_pin_memory),
        ("object_store_limit", check_object_store_limit), ("executor", check_executor),
        ("ray_remote_args", check_remote_args),
    )  # fmt: skip
    for key, check in checks:
        if key in options:
            try:
                check(options[key], name=f"loader.{key}")
            except (TypeError, ValueError) as exc:
                raise ConfigError(str(exc)) from None


def check_loader_fits(cfg: DictConfig) -> None:
    """Refuse ``loader.ray_remote_args`` that no node of this Ray could run a segment task with, naming
    the option as the command line writes it (``get_loader`` names only its keyword, and inside a
    ray.train worker its refusal came wrapped in Ray Train's error). Starts or joins Ray only when
    the option is given.

    Raises:
        UnschedulableError: on a private local Ray, naming ``loader.ray_remote_args`` and the nodes.
    """
    args = OmegaConf.to_container(cfg.loader, resolve=True).get("ray_remote_args") if cfg.get("loader") is not None else None
    if not args:
        return
    from energon_ray.pipeline.remote_args import task_needs
    from energon_ray.ray_env import check_resources, ensure_ray

    ensure_ray()
    check_resources(task_needs(args), "loader.ray_remote_args: a segment task")


def ray_options(cfg: DictConfig) -> Dict[str, Any]:
    """``cfg.trainer.ray`` checked: ``num_workers`` and ``max_failures`` whole numbers (``max_failures``
    -1: without end, as Ray's), ``cpus_per_worker`` a number >= 0, ``use_gpu`` a bool.

    Raises:
        ConfigError: naming the key and its value (``int("two")`` named neither, and ``use_gpu=no`` was true).
    """
    raw = cfg.trainer.get("ray") or {}
    out: Dict[str, Any] = {"name": raw.get("name"), "storage_path": raw.get("storage_path")}
    for key, default, least in (("num_workers", 0, 0), ("max_failures", 0, -1)):
        value = raw.get(key)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"trainer.ray.{key} must be a whole number >= {least}, got {value!r}")
        out[key] = value
    cpus = raw.get("cpus_per_worker")
    cpus = 0.25 if cpus is None else cpus
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not cpus >= 0:
        raise ConfigError(f"trainer.ray.cpus_per_worker must be a number >= 0, got {cpus!r}")
    out["cpus_per_worker"] = float(cpus)
    use_gpu = raw.get("use_gpu")
    use_gpu = False if use_gpu is None else use_gpu
    if not isinstance(use_gpu, bool):
        raise ConfigError(f"trainer.ray.use_gpu must be true or false, got {use_gpu!r}")
    out["use_gpu"] = use_gpu
    return out


def check_ray_trainer(cfg: DictConfig) -> None:
    """Refuse ``trainer.*`` values that ``trainer.ray.num_workers > 0`` would replace without a word (a
    ray.train worker sets them itself, ``LightningOnRay``):
    ``accelerator`` other than ``auto`` (or the one ``trainer.ray.use_gpu`` picks), ``devices`` other
    than 1 or ``auto`` (each worker is one rank with one device), any ``strategy`` or ``plugins``
    (Ray's DDP strategy and environment). ``trainer.accelerator=gpu`` trained on CPUs.

    Raises:
        ConfigError: naming the key, its value and the ``trainer.ray`` option to use instead.
    """
    options = OmegaConf.to_container(cfg.trainer, resolve=True) if "trainer" in cfg else {}
    use_gpu = ray_options(cfg)["use_gpu"]
    workers = f"trainer.ray.num_workers={ray_options(cfg)['num_workers']}"
    accelerator = options.get("accelerator")
    wanted = ("auto", "gpu", "cuda") if use_gpu else ("auto", "cpu")
    if accelerator is not None and str(accelerator).lower() not in wanted:
        flag = "false" if use_gpu else "true"
        raise ConfigError(f"trainer.accelerator={accelerator}: with {workers} the workers' device comes from "
                          f"trainer.ray.use_gpu (now {str(use_gpu).lower()}); set trainer.ray.use_gpu={flag} "
                          "and leave trainer.accelerator=auto")  # fmt: skip
    devices = options.get("devices")
    if devices is not None and devices not in (1, "1", "auto"):
        raise ConfigError(f"trainer.devices={devices}: with {workers} each ray.train worker is one rank with one "
                          "device; set trainer.ray.num_workers to the number of ranks and leave trainer.devices=1")  # fmt: skip
    for key in ("strategy", "plugins"):
        if options.get(key) is not None:
            raise ConfigError(f"trainer.{key}: with {workers} the workers use Ray's DDP strategy and environment "
                              f"(RayDDPStrategy, RayLightningEnvironment); drop trainer.{key}")  # fmt: skip
