"""energon_ray: Megatron-Energon's data model (typed samples, task encoders, decoding) on Ray Data.

Switch ``from megatron.energon import …`` to ``from energon_ray import …`` and keep your task
encoders and prepared datasets.
"""

from energon_ray.decode.sample_decoder import SampleDecoder
from energon_ray.errors import (
    DatasetConfigError,
    FatalSampleError,
    IgnoreSample,
    SampleException,
    ShardReadError,
    SkipSample,
    log_exception,
    reraise_exception,
)
from energon_ray.format.dataset import PreparedDataset
from energon_ray.loader.dataset import EnergonDataset
from energon_ray.loader.factory import get_train_dataset, get_val_dataset
from energon_ray.loader.loader import EnergonLoader, get_loader
from energon_ray.samples import (
    Batch,
    CaptioningSample,
    CrudeSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    Sample,
    SimilarityInterleavedSample,
    SourceInfo,
    TextSample,
    VidQASample,
    VQASample,
    edataclass,
)
from energon_ray.task_encoder import (
    Cooker,
    DefaultTaskEncoder,
    TaskEncoder,
    basic_sample_keys,
    batch_list,
    batch_pad_stack,
    batch_stack,
    cooker,
    generic_batch,
    get_stateless,
    stateless,
)
from energon_ray.worker import WorkerConfig

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "CaptioningSample",
    "Cooker",
    "CrudeSample",
    "DatasetConfigError",
    "DefaultTaskEncoder",
    "EnergonDataset",
    "EnergonLoader",
    "FatalSampleError",
    "IgnoreSample",
    "ImageClassificationSample",
    "ImageSample",
    "InterleavedSample",
    "MultiChoiceVQASample",
    "OCRSample",
    "PreparedDataset",
    "Sample",
    "SampleDecoder",
    "SampleException",
    "ShardReadError",
    "SimilarityInterleavedSample",
    "SkipSample",
    "SourceInfo",
    "TaskEncoder",
    "TextSample",
    "VQASample",
    "VidQASample",
    "WorkerConfig",
    "basic_sample_keys",
    "batch_list",
    "batch_pad_stack",
    "batch_stack",
    "cooker",
    "edataclass",
    "generic_batch",
    "get_loader",
    "get_stateless",
    "get_train_dataset",
    "get_val_dataset",
    "log_exception",
    "reraise_exception",
    "stateless",
]
