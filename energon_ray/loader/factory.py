"""``get_train_dataset`` / ``get_val_dataset``: Energon's entry points, same arguments."""

from __future__ import annotations

import os
import warnings
from typing import Any, Mapping, Optional

from energon_ray.decode.sample_decoder import SampleDecoder, as_sample_decoder, trusting
from energon_ray.errors import resolve_trust, users_stacklevel
from energon_ray.format.dataset import PreparedDataset
from energon_ray.storage import as_path
from energon_ray.blend.base import Composition
from energon_ray.blend.metadataset import is_metadataset_path
from energon_ray.blend.metadataset_values import MULTIPLIER_VALUES, is_multiplier
from energon_ray.loader.dataset import EnergonDataset, PlanOptions
from energon_ray.loader.metadataset_leaves import check_parts, metadataset_composition
from energon_ray.task_encoder.base import DefaultTaskEncoder, TaskEncoder
from energon_ray.worker import WorkerConfig

_LEGACY_DECODE_KWARGS = ("auto_decode", "image_decode", "av_decode", "video_decode_audio", "guess_content", "handler")
_UNSET: Any = object()


def _decoder(task_encoder: TaskEncoder, kwargs: dict) -> Optional[SampleDecoder]:
    legacy = {k: kwargs.pop(k) for k in _LEGACY_DECODE_KWARGS if k in kwargs}
    decoder = as_sample_decoder(getattr(task_encoder, "decoder", SampleDecoder()))
    if not legacy:
        return decoder
    warnings.warn(
        f"{sorted(legacy)} are deprecated arguments of get_train_dataset/get_val_dataset; set "
        "`decoder = SampleDecoder(...)` (or `decoder = None`) as a class attribute of your task encoder",
        FutureWarning,  # Energon's category: shown by default, where a DeprecationWarning would be hidden
        stacklevel=users_stacklevel(),
    )
    legacy.pop("handler", None)
    if legacy.pop("auto_decode", True) is False:
        return None
    base = decoder.config() if decoder is not None else {}
    base.update({k: v for k, v in legacy.items() if k in ("image_decode", "av_decode", "video_decode_audio", "guess_content")})
    return SampleDecoder(**base)


def _check_positive(name: str, value: Any, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, got {value!r}")


def val_limit(limit: Any) -> Optional[int]:
    """``limit`` as the plan takes it: ``None`` for no limit, which Energon also reads from 0 and -1."""
    if limit is None or (type(limit) is int and limit in (0, -1)):
        return None
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        raise ValueError(f"limit must be a positive int, or None, 0 or -1 for no limit, got {limit!r}")
    return limit


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):  # "no" or 0.0 read as a flag would silently mean True or False
        raise TypeError(f"{name} must be a bool, got {value!r}")


def _pop_subflavors(kwargs: dict) -> Optional[Mapping[str, Any]]:
    """``subflavors`` of ``kwargs``: a mapping of names to values (a list gave a bare "not a mapping")."""
    subflavors = kwargs.pop("subflavors", None)
    if subflavors is not None and not isinstance(subflavors, Mapping):
        raise TypeError(f"subflavors must be a mapping of names to values or None, got {subflavors!r}")
    return subflavors


def _segment_samples(value: Any) -> Any:
    """``samples_per_segment``: a positive int, or ``(first, later)`` positive ints (as a tuple)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"samples_per_segment must be a positive int or (first, later), got {value!r}")
        for part in value:
            _check_positive("each of samples_per_segment's (first, later)", part, allow_none=False)
        return tuple(value)
    _check_positive("samples_per_segment", value, allow_none=False)
    return value


def _open(path: Any, split_part: str, kwargs: dict, trusted: bool) -> PreparedDataset:
    for name in ("split_config", "dataset_config"):
        value = kwargs.get(name)
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a file name in .nv-meta (or a path), got {value!r}")
    prepared = PreparedDataset.open(
        as_path(path), split_part, split_config=kwargs.pop("split_config", None),
        dataset_config=kwargs.pop("dataset_config", None), trusted=trusted,
    )
    check_parts(prepared)
    return prepared


def _refuse_unknown(options: PlanOptions, kwargs: dict) -> None:
    """Keywords no step took: a ``TypeError`` naming the function called (a misspelling must not pass)."""
    if kwargs:
        what = "get_train_dataset" if options.training else "get_val_dataset"
        raise TypeError(f"{what}() got unexpected keyword argument(s) {sorted(kwargs)}")


def _build(path, *, split_part, worker_config, task_encoder, options: PlanOptions, trusted: bool, kwargs: dict) -> Composition:
    if worker_config is None:
        worker_config = WorkerConfig.default_worker_config()
    if not isinstance(worker_config, WorkerConfig):
        raise TypeError(f"worker_config must be an energon_ray.WorkerConfig, got {type(worker_config).__name__}")
    if task_encoder is None:
        task_encoder = DefaultTaskEncoder()
    if not isinstance(task_encoder, TaskEncoder):
        raise TypeError(f"task_encoder must be a TaskEncoder, got {type(task_encoder).__name__}")
    _check_bool("repeat", options.repeat)
    _check_bool("batch_drop_last", options.drop_last)
    _check_positive("batch_size", options.batch_size)
    size = options.shuffle_buffer_size
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):  # 0 and 1: no buffer, as Energon's
        raise ValueError(f"shuffle_buffer_size must be an int >= 0 or None (0 or 1: no shuffle buffer), got {size!r}")
    _check_positive("max_samples_per_sequence", options.max_samples_per_sequence)
    length = options.virtual_epoch_length
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:  # 2.5 gave 3 batches per iter()
        raise ValueError(f"virtual_epoch_length must be an int >= 0 (0: one pass / endless), got {length!r}")
    if options.limit is not None:
        _check_positive("limit", options.limit)
    decoder = _decoder(task_encoder, kwargs)
    if decoder is not None and trusted:
        decoder = trusting(decoder)
    subflavors = _pop_subflavors(kwargs)
    options.parallel_shard_iters = kwargs.pop("parallel_shard_iters", None)
    _check_positive("parallel_shard_iters", options.parallel_shard_iters)  # 0 read as the default 16, -1 as 1
    samples_per_segment = kwargs.pop("samples_per_segment", None)
    if samples_per_segment is not None:
        options.segment_samples = _segment_samples(samples_per_segment)
    if is_metadataset_path(path):
        kwargs.pop("packing_buffer_size", None)
        options.blend_samples = kwargs.pop("blend_samples", None)
        if options.blend_samples is not None and not isinstance(options.blend_samples, bool):
            raise TypeError(f"blend_samples must be a bool or None, got {options.blend_samples!r}")
        _refuse_unknown(options, kwargs)
        common = dict(worker_config=worker_config, task_encoder=task_encoder, decoder=decoder)
        return metadataset_composition(path, split_part, options, common, trusted, subflavors)
    dataset = _open(path, split_part, kwargs, trusted)
    kwargs.pop("sample_type", None)
    _refuse_unknown(options, kwargs)
    return EnergonDataset(
        dataset, worker_config=worker_config, task_encoder=task_encoder, options=options, decoder=decoder,
        subflavors=subflavors,
    )  # fmt: skip


def _head_start() -> None:
    """If Ray is already up, start its workers' imports now (the user builds a model next; the
    loader's first batch then finds them ready). Never starts Ray itself. The feeder actor starts
    with the loader's first execution, not here (its process start would compete with the imports)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    from energon_ray.ray_env import warm_up

    warm_up()  # the workers' imports (torch, the stages): the first batch's critical path


def get_train_dataset(
    path: Any,
    *,
    split_part: str = "train",
    worker_config: Optional[WorkerConfig] = None,
    batch_size: Optional[int] = _UNSET,
    batch_drop_last: bool = False,
    packing_buffer_size: Optional[int] = None,
    shuffle_buffer_size: Optional[int] = None,
    max_samples_per_sequence: Optional[int] = None,
    virtual_epoch_length: int = 0,
    shuffle_over_epochs_multiplier: Optional[int] = 1,
    task_encoder: Optional[TaskEncoder] = None,
    repeat: bool = True,
    trust_dataset_code: Optional[bool] = None,
    **kwargs: Any,
) -> EnergonDataset:
    """The training dataset: shuffled per epoch, endless unless ``repeat=False``.

    Args:
        path: a prepared dataset folder, a metadataset YAML or a ``.jsonl`` file (local, ``s3://`` or ``msc://``).
        split_part: which split part to read.
        worker_config: rank/world/streams; default: rank and world from ``ray.train``, torch.distributed or
            ``$RANK``/``$WORLD_SIZE`` (else 0 of 1), 4 streams.
        batch_size: samples per batch (``None``: no batching).
        batch_drop_last: drop each stream's final short batch.
        packing_buffer_size: samples per packing buffer (``select_samples_to_pack`` / ``pack_selected_samples``).
        shuffle_buffer_size: sample shuffle buffer size.
        max_samples_per_sequence: longest run of consecutive samples of a shard.
        virtual_epoch_length: batches per ``iter()`` of the loader (0: one pass / endless).
        shuffle_over_epochs_multiplier: slices are shuffled over this many passes (``None``: no shuffle,
            ``-1``: slices drawn with replacement).
        task_encoder: the user's hooks.
        repeat: endless stream of epochs (``False``: one epoch per ``iter()``).
        trust_dataset_code: run the code a dataset brings (its ``sample_loader.py`` and ``part_filter``,
            ``sample_type`` classes outside energon_ray/megatron.energon, pickled parts); ``None``: only if
            the environment sets ``ENERGON_RAY_TRUST_DATASET_CODE=1``. Applies to every dataset of a
            metadataset.
        **kwargs: ``split_config``, ``dataset_config``, ``subflavors``, ``parallel_shard_iters``,
            ``samples_per_segment`` (samples one Ray task processes, rounded up to whole batches;
            default: 64 for each worker's first segment, 128 after, 64 with packing; an int makes
            every segment that long — lower it for large media; ``(first, later)`` sets both), ``blend_samples`` (a batched, or unbatched
            and packed, train metadataset: ``None``, the default, blends samples, then packs (with ``packing_buffer_size``)
            and batches them in Ray tasks, as Energon does, so batches and packs mix datasets, except
            with ``batch_group_criterion`` (grouping runs before blending here: whole per-dataset
            batches); ``False``: each batch is one dataset's, drawn by weight (a faster start);
            ``True`` with ``batch_group_criterion``: ``ValueError``), and the deprecated decoder arguments
            (``image_decode``, ``auto_decode``, …).

    Raises:
        DatasetConfigError: bad dataset files (before any Ray task runs).
        ValueError: bad argument values (e.g. ``batch_size <= 0``).
    """
    if batch_size is _UNSET:
        raise TypeError("get_train_dataset() needs batch_size= (an int, or None for no batching)")
    _check_positive("packing_buffer_size", packing_buffer_size)
    if not is_multiplier(shuffle_over_epochs_multiplier):  # 0 or -2 would shuffle as 1 does, 2.5 fail in the plan
        raise ValueError(f"shuffle_over_epochs_multiplier must be {MULTIPLIER_VALUES}, got {shuffle_over_epochs_multiplier!r}")
    options = PlanOptions(
        packing_buffer_size=packing_buffer_size,
        training=True,
        repeat=repeat,
        batch_size=batch_size,
        drop_last=batch_drop_last,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        shuffle_over_epochs=shuffle_over_epochs_multiplier,
        virtual_epoch_length=virtual_epoch_length,
    )
    dataset = _build(path, split_part=split_part, worker_config=worker_config, task_encoder=task_encoder, options=options,
                     trusted=resolve_trust(trust_dataset_code), kwargs=kwargs)
    _head_start()
    return dataset


def get_val_dataset(
    path: Any,
    *,
    split_part: str = "val",
    worker_config: Optional[WorkerConfig] = None,
    batch_size: Optional[int] = _UNSET,
    batch_drop_last: bool = False,
    packing_buffer_size: Optional[int] = None,
    limit: Optional[int] = None,
    task_encoder: Optional[TaskEncoder] = None,
    trust_dataset_code: Optional[bool] = None,
    **kwargs: Any,
) -> EnergonDataset:
    """The validation dataset: one unshuffled pass per ``iter()``, in Energon's exact order.

    Args:
        path: as in ``get_train_dataset``.
        split_part: which split part to read.
        worker_config: rank/world/streams (default as in ``get_train_dataset``).
        batch_size: samples per batch (``None``: no batching).
        batch_drop_last: drop each stream's final short batch.
        packing_buffer_size: samples per packing buffer.
        limit: at most this many batches per rank and pass (the same ones every pass); ``None``,
            ``0`` or ``-1``: no limit, as Energon's.
        task_encoder: the user's hooks.
        trust_dataset_code: as in ``get_train_dataset``.
        **kwargs: as in ``get_train_dataset``; ``max_samples_per_sequence`` is accepted and changes
            nothing (as in Energon, whose validation order does not depend on it).
    """
    if batch_size is _UNSET:
        raise TypeError("get_val_dataset() needs batch_size= (an int, or None for no batching)")
    _check_positive("packing_buffer_size", packing_buffer_size)
    # Energon's factories take it for validation too, where it changes nothing (its validation order
    # is the same with or without it; checked): accepted, checked, and without effect here as there
    _check_positive("max_samples_per_sequence", kwargs.pop("max_samples_per_sequence", None))
    options = PlanOptions(
        training=False, repeat=False, batch_size=batch_size, drop_last=batch_drop_last, limit=val_limit(limit),
        packing_buffer_size=packing_buffer_size,
    )  # fmt: skip
    dataset = _build(path, split_part=split_part, worker_config=worker_config, task_encoder=task_encoder, options=options,
                     trusted=resolve_trust(trust_dataset_code), kwargs=kwargs)
    _head_start()
    return dataset


#: Arguments that only mean something for one of the two passes (get_dataset refuses them for the other).
_TRAINING_ONLY = ("shuffle_buffer_size", "virtual_epoch_length", "shuffle_over_epochs_multiplier", "repeat")
_VALIDATION_ONLY = ("limit",)


def get_dataset(path: Any, *, training: bool, split_part: Optional[str] = None, **kwargs: Any) -> Composition:
    """The dataset for training or for validation: the general form of the two entry points.

    Energon's documents call ``get_train_dataset`` and ``get_val_dataset`` simplified aliases of
    ``get_dataset``; here it is exactly that: ``training=True`` returns what ``get_train_dataset``
    returns for the same arguments (shuffled, endless unless ``repeat=False``), ``training=False``
    what ``get_val_dataset`` returns (one unshuffled pass in Energon's order). Every argument,
    ``trust_dataset_code`` (off by default) included, means what it means there.

    Args:
        path: a prepared dataset folder, a ``.jsonl`` file or a metadataset YAML.
        training: ``True`` for the training pass, ``False`` for validation/test; no default, so a
            validation set is never shuffled by accident.
        split_part: the split part to read (default ``"train"`` when training, else ``"val"``).
        **kwargs: the arguments of ``get_train_dataset`` (``training=True``) or ``get_val_dataset``
            (``training=False``); ``batch_size`` is required by both.

    Returns:
        The dataset, for ``get_loader`` / ``get_savable_loader``.

    Raises:
        TypeError: ``training`` is not a bool, or an argument of the other pass is given
            (``shuffle_buffer_size``, ``virtual_epoch_length``,
            ``shuffle_over_epochs_multiplier``, ``repeat`` are for training, ``limit`` for validation).

    Example:
        >>> get_dataset("/data/ds", training=False, batch_size=8, shuffle_buffer_size=100)
        Traceback (most recent call last):
        ...
        TypeError: get_dataset(training=False): shuffle_buffer_size only applies to training (training=True)
    """
    if not isinstance(training, bool):
        raise TypeError(f"get_dataset() needs training=True or training=False, got {training!r}")
    if "batch_size" not in kwargs:
        raise TypeError("get_dataset() needs batch_size= (an int, or None for no batching)")
    other = _VALIDATION_ONLY if training else _TRAINING_ONLY
    wrong = [name for name in other if name in kwargs]
    if wrong:
        where = "validation (training=False)" if training else "training (training=True)"
        raise TypeError(f"get_dataset(training={training}): {', '.join(wrong)} only applies to {where}")
    if training:
        return get_train_dataset(path, split_part="train" if split_part is None else split_part, **kwargs)
    return get_val_dataset(path, split_part="val" if split_part is None else split_part, **kwargs)
