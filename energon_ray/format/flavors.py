"""Energon's typed dataset classes (``CaptioningWebdataset``…), ``CrudeWebdataset`` and the JSONL
factories, on :mod:`energon_ray.format.factories`.

A ``dataset.yaml`` with ``__class__: CaptioningWebdataset`` names one of these; Energon deprecates
them in favour of ``sample_type:``, and so do we (a ``FutureWarning``, Energon's category, which Python
shows by default, says how to convert).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from energon_ray.errors import DatasetConfigError
from energon_ray.format.dataset import PreparedDataset
from energon_ray.format.factories import BaseCoreDatasetFactory, DefaultDecoderWebdatasetFactory
from energon_ray.format.factory_options import set_options, subset_ranges
from energon_ray.format.jsonl import prepare_jsonl
from energon_ray.samples import (
    CaptioningSample, CrudeSample, ImageClassificationSample, ImageSample, InterleavedSample, MultiChoiceVQASample,
    OCRSample, SimilarityInterleavedSample, TextSample, VidQASample, VQAOCRSample, VQASample,
)  # fmt: skip
from energon_ray.worker import WorkerConfig


class _TypedWebdataset(DefaultDecoderWebdatasetFactory):
    """A factory for one fixed sample type (deprecated by Energon: use ``sample_type`` in ``dataset.yaml``)."""

    def __init__(self, path: Any, **kwargs: Any):
        warnings.warn(
            f"{type(self).__name__} is deprecated: in {path}/.nv-meta/dataset.yaml drop the top-level "
            f"__module__/__class__ and write `sample_type: {{__module__: megatron.energon, __class__: "
            f"{self.__sample_type__.__name__}}}` instead, keeping the rest",
            FutureWarning,  # Energon's category: shown by default, where a DeprecationWarning would be hidden
            stacklevel=2,
        )
        super().__init__(path, **kwargs)


class CaptioningWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.CaptioningSample`."""

    __sample_type__ = CaptioningSample


class ImageWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.ImageSample`."""

    __sample_type__ = ImageSample


class ImageClassificationWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.ImageClassificationSample`."""

    __sample_type__ = ImageClassificationSample


class InterleavedWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.InterleavedSample`."""

    __sample_type__ = InterleavedSample


class MultiChoiceVQAWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.MultiChoiceVQASample`."""

    __sample_type__ = MultiChoiceVQASample


class OCRWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.OCRSample`."""

    __sample_type__ = OCRSample


class SimilarityInterleavedWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.SimilarityInterleavedSample`."""

    __sample_type__ = SimilarityInterleavedSample


class TextWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.TextSample`."""

    __sample_type__ = TextSample


class VQAWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.VQASample`."""

    __sample_type__ = VQASample


class VQAOCRWebdataset(_TypedWebdataset):
    """Samples of ``VQAOCRSample``."""

    __sample_type__ = VQAOCRSample


class VidQAWebdataset(_TypedWebdataset):
    """Samples of :class:`~energon_ray.VidQASample`."""

    __sample_type__ = VidQASample


class CrudeWebdataset(DefaultDecoderWebdatasetFactory):
    """Crude samples (a dict of the decoded parts) for a task encoder's ``cookers``.

    Args:
        subflavors: set on every sample; cookers match on them.
        part_filter: which parts to read (a list, a callable, or ``"file.py:function"`` with trust).

    Raises:
        ValueError: a ``sample_loader`` (crude samples are the parts themselves).
    """

    __sample_type__ = CrudeSample

    def __init__(
        self,
        path: Any,
        *,
        subflavors: Optional[Dict[str, Any]] = None,
        part_filter: Union[str, List[str], Callable[[str], bool], None] = None,
        **kwargs: Any,
    ):
        if "sample_loader" in kwargs:
            raise ValueError("CrudeWebdataset takes no sample_loader: its samples are the parts themselves")
        super().__init__(
            path, subflavors=subflavors, sample_loader=_identity, part_filter=part_filter or _all_parts, **kwargs
        )


def _identity(sample: dict) -> dict:
    return sample


def _all_parts(part: str) -> bool:
    return True


class CrudeJsonlDatasetFactory(BaseCoreDatasetFactory[CrudeSample]):
    """A ``.jsonl`` file (indexed: ``<file>.jsonl.idx``) as crude samples ``{"json": bytes}``, key = line number.

    Args:
        path: the ``.jsonl`` file.
        training, worker_config, shuffle_over_epochs, parallel_shard_iters, max_samples_per_sequence,
        subset: as :class:`~energon_ray.format.factories.BaseWebdatasetFactory`.
        part_filter: a filter that refuses ``"json"`` makes the dataset empty (as in Energon).

    Raises:
        DatasetConfigError: no file, no index, or an index that does not match the file.
    """

    __sample_type__ = CrudeSample
    #: ``json`` stays bytes (the default factory parses it)
    _parse_json = False

    def __init__(
        self,
        path: Any,
        *,
        training: bool,
        worker_config: Optional[WorkerConfig] = None,
        shuffle_over_epochs: Optional[int] = 1,
        parallel_shard_iters: Optional[int] = None,
        max_samples_per_sequence: Optional[int] = None,
        subset: Any = None,
        part_filter: Optional[Callable[[str], bool]] = None,
        split_part: str = "train",
        trust_dataset_code: Optional[bool] = None,
    ):
        set_options(
            self, Path(str(path)), split_part=split_part, training=training, worker_config=worker_config,
            shuffle_over_epochs=shuffle_over_epochs, parallel_shard_iters=parallel_shard_iters,
            max_samples_per_sequence=max_samples_per_sequence, subset=subset, part_filter=part_filter,
            trust_dataset_code=trust_dataset_code,
        )  # fmt: skip
        self.prepared = PreparedDataset.open(self.path, split_part)
        self._len = self.prepared.total if part_filter is None or part_filter("json") else 0

    @staticmethod
    def prepare_dataset(path: Any) -> int:
        """Index the ``.jsonl`` file (write ``<path>.idx``); returns its number of samples."""
        return prepare_jsonl(path, progress=False)

    def __len__(self) -> int:
        return self._len

    def as_file_store(self) -> Any:
        """The file's lines by ``"<index>.json"`` (a ``JsonlFileStore``, as Energon's)."""
        from energon_ray.cache.jsonl_store import JsonlFileStore

        return JsonlFileStore(self.path)

    def _decoder(self) -> Any:
        return None

    def build(self, worker_rotation_offset: int = 0, *, task_encoder: Any = None, batch_size: Optional[int] = None) -> Any:
        """The dataset (an ``EnergonDataset``) of crude samples, unbatched unless ``batch_size`` is given."""
        from energon_ray.format.factories import _CrudePassThrough
        from energon_ray.loader.dataset import EnergonDataset, PlanOptions

        if self._len == 0:
            raise DatasetConfigError(f"{self.path}: the part_filter refuses 'json', so the dataset is empty")
        absolute, ratio = subset_ranges(self)
        options = PlanOptions(
            training=self.training, repeat=self.training, batch_size=batch_size,
            max_samples_per_sequence=self.max_samples_per_sequence, shuffle_over_epochs=self.shuffle_over_epochs,
            parallel_shard_iters=self.parallel_shard_iters, subset_absolute=absolute, subset_ratio=ratio,
        )  # fmt: skip
        dataset = EnergonDataset(
            self.prepared, worker_config=self.worker_config, task_encoder=task_encoder or _CrudePassThrough(),
            options=options, decoder=self._decoder(), subflavors=self.subflavors, rotation_offset=worker_rotation_offset,
        )  # fmt: skip
        dataset.parse_json = self._parse_json
        return dataset

    def config(self) -> Dict[str, Any]:
        return dict(type=type(self).__qualname__, training=self.training, _path=str(self.path),
                    jsonl_filename=self.path.name, count=self._len)  # fmt: skip

    def __str__(self) -> str:
        return f"{type(self).__name__}(path={self.path})"


class DefaultCrudeJsonlDatasetFactory(CrudeJsonlDatasetFactory):
    """As :class:`CrudeJsonlDatasetFactory`, with ``subflavors`` set and ``"json"`` parsed into a dict."""

    _parse_json = True

    def __init__(self, path: Any, *, subflavors: Optional[Dict[str, Any]] = None, **kwargs: Any):
        kwargs.pop("decoder", None)
        self.subflavors = dict(subflavors or {})
        super().__init__(path, **kwargs)

    def _decoder(self) -> Any:
        from energon_ray.decode.sample_decoder import SampleDecoder

        return SampleDecoder()
