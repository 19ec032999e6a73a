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
    UntrustedCodeError,
    MediaTooLargeError,
    log_exception,
    reraise_exception,
)
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

# The loading entry points import Ray and pyarrow; they load on first use so that light users
# (a Ray worker decoding video, `energon-ray info`) do not pay for them.
_LAZY = {
    "BlendDataset": "energon_ray.blend.compose",
    "ConcatDataset": "energon_ray.blend.compose",
    "MixBatchDataset": "energon_ray.blend.compose",
    "EpochizeDataset": "energon_ray.blend.compose",
    "MapDataset": "energon_ray.blend.compose",
    "homogeneous_concat_mix": "energon_ray.blend.concat",
    "concat_pad": "energon_ray.blend.concat",
    "generic_concat": "energon_ray.blend.concat",
    "PreparedDataset": "energon_ray.format.dataset",
    "EnergonDataset": "energon_ray.loader.dataset",
    "get_dataset": "energon_ray.loader.factory",
    "get_train_dataset": "energon_ray.loader.factory",
    "get_val_dataset": "energon_ray.loader.factory",
    "EnergonLoader": "energon_ray.loader.loader",
    "SavableDataLoader": "energon_ray.loader.loader",
    "get_loader": "energon_ray.loader.loader",
    "get_savable_loader": "energon_ray.loader.loader",
    "LoaderState": "energon_ray.loader.state",
    "StateError": "energon_ray.loader.state",
    "save_loader_state": "energon_ray.loader.state",
    "restore_loader_state": "energon_ray.loader.state",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'energon_ray' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))

__all__ = [
    "Batch",
    "BlendDataset",
    "ConcatDataset",
    "EpochizeDataset",
    "MapDataset",
    "MixBatchDataset",
    "concat_pad",
    "generic_concat",
    "homogeneous_concat_mix",
    "CaptioningSample",
    "Cooker",
    "CrudeSample",
    "DatasetConfigError",
    "DefaultTaskEncoder",
    "EnergonDataset",
    "EnergonLoader",
    "SavableDataLoader",
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
    "UntrustedCodeError",
    "MediaTooLargeError",
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
    "get_savable_loader",
    "LoaderState",
    "StateError",
    "save_loader_state",
    "restore_loader_state",
    "get_stateless",
    "get_dataset",
    "get_train_dataset",
    "get_val_dataset",
    "log_exception",
    "reraise_exception",
    "stateless",
]
