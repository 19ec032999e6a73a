"""Sample and batch types (no I/O)."""

from energon_ray.samples.base import Sample, SourceInfo, edataclass
from energon_ray.samples.batch import Batch
from energon_ray.samples.types import (
    CaptioningSample,
    CrudeSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    SimilarityInterleavedSample,
    TextSample,
    VidQASample,
    VQAOCRSample,
    VQASample,
)

SAMPLE_TYPES = {
    cls.__name__: cls
    for cls in (
        Sample,
        CaptioningSample,
        ImageSample,
        ImageClassificationSample,
        OCRSample,
        TextSample,
        VQASample,
        VQAOCRSample,
        MultiChoiceVQASample,
        VidQASample,
        InterleavedSample,
        SimilarityInterleavedSample,
    )
}

__all__ = [
    "Batch",
    "CaptioningSample",
    "CrudeSample",
    "ImageClassificationSample",
    "ImageSample",
    "InterleavedSample",
    "MultiChoiceVQASample",
    "OCRSample",
    "SAMPLE_TYPES",
    "Sample",
    "SimilarityInterleavedSample",
    "SourceInfo",
    "TextSample",
    "VQAOCRSample",
    "VQASample",
    "VidQASample",
    "edataclass",
]
