"""Dataset flavors and factories at Energon's path ``megatron.energon.flavors`` (e.g. ``BaseWebdatasetFactory``).

Only re-exports: every name of Energon's module resolves on first use from ``energon_ray``'s top level
(the audio/video names from :mod:`energon_ray.decode.av`), so names added there later appear here too.
"""

from energon_ray._reexport import lazy_names
from energon_ray.decode.av import AVData, AVDecoder

__all__ = ["AVData", "AVDecoder"]

__getattr__ = lazy_names(
    "energon_ray.flavors",
    "megatron.energon.flavors",
    [
        "AVDecoderType", "BaseCoreDatasetFactory", "BaseWebdatasetFactory", "CaptioningSample",
        "CaptioningWebdataset", "CrudeJsonlDatasetFactory", "CrudeSample", "CrudeWebdataset",
        "DefaultCrudeJsonlDatasetFactory", "DefaultDecoderWebdatasetFactory", "DefaultGenericWebdatasetFactory",
        "EmptyDatasetError", "ImageClassificationSample", "ImageClassificationWebdataset", "ImageDecoderType",
        "ImageSample", "ImageWebdataset", "InterleavedSample", "InterleavedWebdataset", "JoinedWebdatasetFactory",
        "MultiChoiceVQASample", "MultiChoiceVQAWebdataset", "OCRSample", "OCRWebdataset", "PinMemoryMixin",
        "Sample", "SampleDecoder", "SavableDataset", "SimilarityInterleavedSample", "SimilarityInterleavedWebdataset",
        "StandardWebdatasetFactory", "TextSample", "TextWebdataset", "VidQASample", "VidQAWebdataset",
        "VQAOCRWebdataset", "VQASample", "VQAWebdataset", "WebdatasetMeta",
    ],
)  # fmt: skip
