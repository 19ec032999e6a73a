"""Energon's concrete sample types, field for field."""

from __future__ import annotations

from typing import Any, List, Optional, Union

import torch

from energon_ray.samples.base import Sample, edataclass


@edataclass
class CaptioningSample(Sample):
    """An image and its caption."""

    #: ``(C, H, W)`` image tensor (or whatever the decoder produced).
    image: torch.Tensor
    caption: str


@edataclass
class ImageSample(Sample):
    """Just an image."""

    image: torch.Tensor


@edataclass
class ImageClassificationSample(Sample):
    """An image with an integer label and/or a label name."""

    image: torch.Tensor
    label: Optional[int] = None
    label_name: Optional[str] = None


@edataclass
class OCRSample(Sample):
    """An image with its text and optional block/line/word/char level boxes and texts."""

    image: torch.Tensor
    text: str
    block_boxes: Optional[torch.Tensor] = None
    block_classes: Optional[Union[torch.Tensor, List[str]]] = None
    block_text: Optional[List[str]] = None
    lines_boxes: Optional[torch.Tensor] = None
    lines_text: Optional[List[str]] = None
    words_boxes: Optional[torch.Tensor] = None
    words_text: Optional[List[str]] = None
    chars_boxes: Optional[torch.Tensor] = None
    chars_text: Optional[List[str]] = None


@edataclass
class TextSample(Sample):
    """Plain text."""

    text: str


@edataclass
class VQASample(Sample):
    """An image, a question (``context``) and optional answers with weights."""

    image: torch.Tensor
    context: str
    answers: Optional[List[str]] = None
    answer_weights: Optional[torch.Tensor] = None


@edataclass
class VQAOCRSample(Sample):
    """VQA with OCR words (not exported at the top level, as in Energon)."""

    image: torch.Tensor
    context: str
    text: str
    answers: Optional[List[str]] = None
    answer_weights: Optional[torch.Tensor] = None
    words_boxes: Optional[torch.Tensor] = None
    words_text: Optional[List[str]] = None


@edataclass
class MultiChoiceVQASample(Sample):
    """An image, a question and choices with the index of the correct one."""

    image: torch.Tensor
    context: str
    choices: Optional[List[str]] = None
    correct_choice_idx: int = 0


@edataclass
class VidQASample(Sample):
    """A video (a lazy decoder object) with a question and optional answers."""

    video: Any
    context: str
    answers: Optional[List[str]] = None
    answer_weights: Optional[torch.Tensor] = None


@edataclass
class InterleavedSample(Sample):
    """A sequence of interleaved images (tensors) and texts."""

    sequence: List[Union[torch.Tensor, str]]


@edataclass
class SimilarityInterleavedSample(Sample):
    """Images and texts with a similarity matrix between them."""

    images: List[torch.Tensor]
    texts: List[str]
    audio: Optional[List[torch.Tensor]] = None
    video: Optional[List[torch.Tensor]] = None
    similarity_matrix: Optional[torch.Tensor] = None
    matched_text_indices: Optional[List[int]] = None


class CrudeSample(dict):
    """An undecoded-by-type sample: a dict of meta keys plus one entry per tar part.

    A task encoder's cookers turn it into a typed sample.
    """
