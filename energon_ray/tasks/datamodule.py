"""``EnergonDataModule``: energon_ray's loaders as a Lightning ``LightningDataModule``.

Train, validation and test loaders come from a prepared dataset folder (or a metadataset YAML, or a
``.jsonl`` corpus) and a task encoder; each rank's ``WorkerConfig`` comes from the trainer (global
rank and world size), so the same module runs in one process, under Lightning's DDP or in
``ray.train``. The training loader's state — every rank's, gathered on rank 0 — is part of every
Lightning checkpoint (``state_dict``/``load_state_dict``): ``trainer.fit(ckpt_path=…)`` continues
with exactly the batches the interrupted run would have trained on next (on another world size: the
rest of the epoch, shared out anew). Usable in any Lightning project on its own:

Example:
    >>> from energon_ray.tasks.captioning import CaptioningTaskEncoder
    >>> data = EnergonDataModule("/data/captions", CaptioningTaskEncoder(), batch_size=32)  # doctest: +SKIP
    >>> lightning.pytorch.Trainer(max_steps=100).fit(my_module, datamodule=data)          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Dict, List, Mapping, Optional

import lightning.pytorch as pl

from energon_ray.errors import DatasetConfigError
from energon_ray.task_encoder import TaskEncoder
from energon_ray.worker import WorkerConfig

logger = logging.getLogger("energon_ray")

#: ``loader`` keys besides ``get_loader``'s keywords.
_LOADER_OWN_KEYS = ("num_workers",)
_GET_LOADER_KEYS = ("prefetch_batches", "pin_memory", "ray_remote_args", "object_store_limit", "executor")
#: every key the ``loader`` mapping (the training config's ``loader`` group) may hold
LOADER_KEYS = _LOADER_OWN_KEYS + _GET_LOADER_KEYS
#: the evaluation splits each Lightning stage reads, checked by ``setup``
_EVAL_SPLITS_OF_STAGE = {"fit": ("val",), "validate": ("val",), "test": ("test",)}


class EnergonDataModule(pl.LightningDataModule):
    """Train/val/test loaders of energon_ray for Lightning, with their state in checkpoints.

    Args:
        path: a prepared dataset folder, a metadataset YAML or a ``.jsonl`` file.
        task_encoder: the task encoder of every split (an Energon ``TaskEncoder``).
        batch_size: samples per training batch, per rank.
        val_batch_size: per validation/test batch (default: ``batch_size``).
        val_path, test_path: other datasets for validation and test (default: ``path``).
        train_split, val_split, test_split: split parts to read; ``None`` turns a loader off.
        shuffle_buffer_size, max_samples_per_sequence, packing_buffer_size, virtual_epoch_length:
            ``get_train_dataset``'s (``packing_buffer_size`` also for validation and test).
        val_limit: at most this many validation/test batches per rank and pass.
        seed_offset: ``WorkerConfig.seed_offset`` (changes the order and the hooks' random draws).
        loader: ``num_workers`` (logical sample streams per rank, ``WorkerConfig.num_workers``) and
            ``get_loader`` keywords (``prefetch_batches``, ``pin_memory``, ``ray_remote_args``,
            ``object_store_limit``, ``executor``).
        dataset_options: more keywords for every ``get_*_dataset`` call (``samples_per_segment``,
            ``trust_dataset_code``, ``subflavors`` …).
        prepare: called once per node before the loaders are built (Lightning's ``prepare_data``),
            e.g. to generate or download the dataset into ``path``.
        model_data_kwargs: what the model needs to know about the data (``num_classes`` …), as in
            Lightning Transformers; task configs interpolate it (``${dataset.model_data_kwargs.num_classes}``).

    Raises:
        TypeError: ``task_encoder`` is not a ``TaskEncoder``.
        ValueError: an unknown ``loader`` key, or a non-positive ``batch_size``.
        DatasetConfigError: at ``setup``, a validation or test split the stage reads cannot be read
            (a split part with no shards), naming the path and the split.
    """

    def __init__(
        self,
        path: Any,
        task_encoder: TaskEncoder,
        batch_size: int,
        *,
        val_batch_size: Optional[int] = None,
        val_path: Any = None,
        test_path: Any = None,
        train_split: Optional[str] = "train",
        val_split: Optional[str] = "val",
        test_split: Optional[str] = "test",
        shuffle_buffer_size: Optional[int] = None,
        max_samples_per_sequence: Optional[int] = None,
        packing_buffer_size: Optional[int] = None,
        virtual_epoch_length: int = 0,
        val_limit: Optional[int] = None,
        seed_offset: int = 0,
        loader: Optional[Mapping[str, Any]] = None,
        dataset_options: Optional[Mapping[str, Any]] = None,
        prepare: Optional[Callable[[], Any]] = None,
        model_data_kwargs: Optional[Mapping[str, Any]] = None,
    ):
        super().__init__()
        if not isinstance(task_encoder, TaskEncoder):
            raise TypeError(f"EnergonDataModule: task_encoder must be a TaskEncoder, got {type(task_encoder).__name__}")
        for name, value in (("batch_size", batch_size), ("val_batch_size", val_batch_size)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"EnergonDataModule: {name} must be a positive int, got {value!r}")
        loader = dict(loader or {})
        unknown = sorted(set(loader) - set(_LOADER_OWN_KEYS) - set(_GET_LOADER_KEYS))
        if unknown:
            raise ValueError(
                f"EnergonDataModule: unknown loader option(s) {unknown}; known: {sorted(_LOADER_OWN_KEYS + _GET_LOADER_KEYS)}"
            )
        self.path = path
        self.task_encoder = task_encoder
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.paths = {"train": path, "val": val_path or path, "test": test_path or path}
        self.splits = {"train": train_split, "val": val_split, "test": test_split}
        self.train_options = {
            "shuffle_buffer_size": shuffle_buffer_size,
            "max_samples_per_sequence": max_samples_per_sequence,
            "virtual_epoch_length": virtual_epoch_length,
        }
        self.packing_buffer_size = packing_buffer_size
        self.val_limit = val_limit
        self.seed_offset = seed_offset
        self.num_workers = _whole_number("loader.num_workers", loader.pop("num_workers", 2))
        self.loader_options = loader
        self.dataset_options = dict(dataset_options or {})
        self.prepare = prepare
        self._model_data_kwargs = dict(model_data_kwargs or {})
        self.worker_config: Optional[WorkerConfig] = None
        self.train_loader: Any = None
        self._loaders: List[Any] = []
        #: every rank's saved training-loader state, waiting for the training loader to be built
        self._pending_states: Optional[List[Dict[str, Any]]] = None
        #: this rank's training-loader state as ``teardown`` closed it (what ``state_dict`` saves after ``fit``)
        self._closed_state: Optional[Dict[str, Any]] = None
        #: validation/test datasets ``setup`` built (and so checked), each taken by its first loader
        self._eval_datasets: Dict[str, Any] = {}

    def __repr__(self) -> str:
        return (
            f"EnergonDataModule(path={str(self.path)!r}, task_encoder={self.task_encoder!r}, batch_size={self.batch_size}, "
            f"num_workers={self.num_workers})"
        )

    @property
    def model_data_kwargs(self) -> Dict[str, Any]:
        """What the model needs to know about the data (from the config)."""
        return dict(self._model_data_kwargs)

    # -- Lightning hooks ---------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Generate or fetch the data (once per node), if a ``prepare`` callable was given."""
        if self.prepare is not None:
            self.prepare()

    def setup(self, stage: Optional[str] = None) -> None:
        """This rank's ``WorkerConfig`` (the trainer's global rank and world size), and the stage's
        validation or test dataset built now, so that one that cannot be read (a split part with no
        shards) fails here, before training, and not when Lightning first validates, mid-fit.

        Raises:
            DatasetConfigError: the ``val`` (``fit``, ``validate``) or ``test`` (``test``) split
                cannot be read; the message names the dataset path, the split and ``{which}_split=None``.
        """
        trainer = self.trainer
        if trainer is not None:
            rank, world_size = int(trainer.global_rank), int(trainer.world_size)
        else:  # used without a trainer: ray.train's context, torch.distributed, or 0 of 1
            detected = WorkerConfig.default_worker_config(num_workers=self.num_workers)
            rank, world_size = detected.rank, detected.world_size
        self.worker_config = WorkerConfig(rank=rank, world_size=world_size, num_workers=self.num_workers, seed_offset=self.seed_offset)
        for which in _EVAL_SPLITS_OF_STAGE.get(stage or "", ()):
            if self.splits[which] is not None and _reads(trainer, which):
                self._eval_datasets[which] = self._eval_dataset(which)

    def train_dataloader(self) -> Any:
        """This rank's savable, endless training loader (restored from a checkpoint if one was loaded),
        which Lightning sees as resumable (``_RestoredByDataModule``; the loader itself is ``train_loader``)."""
        from energon_ray.loader.factory import get_train_dataset
        from energon_ray.loader.api import get_savable_loader

        split = self._split("train")
        dataset = get_train_dataset(
            self.paths["train"], split_part=split, worker_config=self._worker_config(), batch_size=self.batch_size,
            packing_buffer_size=self.packing_buffer_size, task_encoder=self.task_encoder, **self.train_options,
            **self.dataset_options,
        )  # fmt: skip
        loader = get_savable_loader(dataset, **self.loader_options)
        states, self._pending_states = self._pending_states, None
        previous, self._closed_state = self.train_loader, None
        if states:
            loader.restore_state_global(states)
        elif previous is not None:  # Lightning reloads (reload_dataloaders_every_n_epochs): go on from the old loader
            state = previous.save_state_rank()
            if state is not None:  # at an epoch start: the new iter() is a new epoch, as the old loader's would be
                loader.restore_state_rank(dataclasses.replace(state, epoch_items=0))
        if previous is not None:
            previous.close()
            self._loaders = [other for other in self._loaders if other is not previous]
        self.train_loader = loader
        self._loaders.append(loader)
        return _RestoredByDataModule(loader)

    def val_dataloader(self) -> Any:
        """This rank's validation loader (one unshuffled pass per iteration); ``[]`` if ``val_split=None``."""
        return self._eval_loader("val")

    def test_dataloader(self) -> Any:
        """This rank's test loader (one unshuffled pass per iteration); ``[]`` if ``test_split=None``."""
        return self._eval_loader("test")

    def teardown(self, stage: Optional[str] = None) -> None:
        """Stop the loaders' Ray executions."""
        if self.train_loader is not None:  # a checkpoint saved after fit() (trainer.save_checkpoint) keeps the position
            try:
                self._closed_state = self._train_state()
            except Exception:  # torn down by a failure the state cannot be taken after: that one is being raised
                logger.warning("energon_ray: the training loader's state could not be kept at teardown", exc_info=True)
        loaders, self._loaders = self._loaders, []
        for loader in loaders:
            loader.close()
        self.train_loader = None

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Every rank's training-loader state (JSON dicts), gathered on rank 0 (the rank that writes
        the checkpoint); empty before training. Every rank must call it (Lightning does)."""
        if self.train_loader is not None:
            state = self._train_state()
        elif self._closed_state is not None:  # after fit(): the state teardown kept
            state = self._closed_state
        else:
            return {}
        states = _gather_on_rank_0(state)
        if not states or all(state is None for state in states):
            return {}
        return {"train_loader_states": states}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Keep the saved states for the training loader (built later, in ``train_dataloader``)."""
        states = state_dict.get("train_loader_states")
        if states is None:
            return
        if not isinstance(states, list):
            raise ValueError(f"EnergonDataModule.load_state_dict: 'train_loader_states' must be a list, got {type(states).__name__}")
        if self.train_loader is not None:
            self.train_loader.restore_state_global(states)
        else:
            self._pending_states = states

    # -- internals -------------------------------------------------------------------------------
    def _train_state(self) -> Optional[Dict[str, Any]]:
        """This rank's training-loader state as a JSON dict (``None`` before its first batch). Once
        Lightning has taken its epoch's last batch, its next request is a new ``iter()`` (Lightning
        knows the length and never reads the end of an iterator), which is a new epoch of an epochized
        loader (``virtual_epoch_length``): the state says so, else a restored loader's first ``iter()``
        gave the rest of the finished epoch (nothing), and a resumed run an empty epoch."""
        state = self.train_loader.save_state_rank()
        if state is None:
            return None
        if _lightning_epoch_over(self.trainer):
            state = dataclasses.replace(state, epoch_items=0)
        return state.to_dict()

    def _worker_config(self) -> WorkerConfig:
        if self.worker_config is None:
            self.setup()
        return self.worker_config

    def _split(self, which: str) -> str:
        split = self.splits[which]
        if split is None:
            raise ValueError(f"EnergonDataModule: the {which} loader is off ({which}_split=None)")
        return split

    def _eval_dataset(self, which: str) -> Any:
        """The ``val`` or ``test`` dataset; one that cannot be read is named with its path and split."""
        from energon_ray.loader.factory import get_val_dataset

        split = self._split(which)
        try:
            return get_val_dataset(
                self.paths[which], split_part=split, worker_config=self._worker_config(),
                batch_size=self.val_batch_size, packing_buffer_size=self.packing_buffer_size, limit=self.val_limit,
                task_encoder=self.task_encoder, **self.dataset_options,
            )  # fmt: skip
        except DatasetConfigError as exc:
            raise DatasetConfigError(
                f"EnergonDataModule: the {which} split {split!r} of {self.paths[which]} cannot be read: {exc} "
                f"({which}_split=None, or dataset.{which}_split=null on the command line, runs without it)"
            ) from exc

    def _eval_loader(self, which: str) -> Any:
        from energon_ray.loader.api import get_loader

        if self.splits[which] is None:
            return []  # Lightning: no loader for this stage
        dataset = self._eval_datasets.pop(which, None) or self._eval_dataset(which)
        loader = get_loader(dataset, **self.loader_options)
        self._loaders.append(loader)
        return loader


class _RestoredByDataModule:
    """The training loader as Lightning sees it: resumable (Lightning's ``state_dict`` /
    ``load_state_dict`` protocol), because ``EnergonDataModule`` keeps every rank's loader state in
    its own part of each checkpoint and restores it as it builds the loader. Lightning's entry for
    the loader stays empty: it would hold rank 0's state only and give it to every rank. Without
    this, Lightning warns at every mid-epoch resume that the data of the resumed run are unreliable.
    Everything else is the loader's."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Nothing to do: the datamodule restored the loader (``load_state_dict``, ``train_dataloader``)."""

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (a copy being made): no loader to ask
            raise AttributeError(name)
        return getattr(self.loader, name)


def _reads(trainer: Any, which: str) -> bool:
    """Whether ``trainer`` will ask for the ``val`` or ``test`` loader (``True`` without a trainer):
    not when its module has no ``validation_step``/``test_step`` or its ``limit_*_batches`` is 0."""
    if trainer is None:
        return True
    from lightning.pytorch.utilities.model_helpers import is_overridden

    step, limit = ("validation_step", "limit_val_batches") if which == "val" else ("test_step", "limit_test_batches")
    module = getattr(trainer, "lightning_module", None)
    return (module is None or is_overridden(step, module)) and getattr(trainer, limit, 1) != 0


def _lightning_epoch_over(trainer: Any) -> bool:
    """Whether ``trainer`` has taken the last batch of its training epoch (``False`` without a trainer)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    return bool(getattr(getattr(loop, "batch_progress", None), "is_last_batch", False))


def _gather_on_rank_0(state: Optional[Dict[str, Any]]) -> Optional[List[Optional[Dict[str, Any]]]]:
    """Every rank's ``state``, gathered on rank 0 (``torch.distributed``; a list of one without it);
    ``None`` on the other ranks. A collective: every rank calls it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [state]
    out: Optional[List[Any]] = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(state, out, dst=0)
    return out


def _whole_number(name: str, value: Any) -> int:
    """``value`` as an int >= 0 (a whole number, or its digits as text), else a ValueError naming ``name``
    (``int()`` said only "invalid literal", and truncated 2.7 to 2; -1 failed later, in ``setup``, as
    ``WorkerConfig.num_workers``)."""
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit())) or int(value) < 0:
        raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
    return int(value)
