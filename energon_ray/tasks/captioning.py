"""The captioning task of the Energon docs, ready to run: task encoder, tokenizer and batch types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

from energon_ray.errors import SampleException
from energon_ray.samples import CaptioningSample
from energon_ray.task_encoder import DefaultTaskEncoder, batch_list, batch_stack
from energon_ray.tasks.tokenizer import HashTokenizer
from energon_ray.tasks.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop


@dataclass
class CaptioningRawBatch:
    """After ``batch``: keys, stacked images, caption strings."""

    __key__: List[str]
    image: torch.Tensor
    caption: List[str]


@dataclass
class CaptioningBatch:
    """What the model gets: images and tokenized captions."""

    __keys__: List[str]
    images: torch.Tensor
    text_tokens: torch.Tensor
    text_attn_mask: torch.Tensor


def default_train_transform(size: int = 224) -> Compose:
    """Random resized crop to ``size`` and a random horizontal flip."""
    return Compose([RandomResizedCrop((size, size), scale=(0.5, 1.0)), RandomHorizontalFlip()])


class CaptioningTaskEncoder(DefaultTaskEncoder[CaptioningSample, CaptioningSample, CaptioningRawBatch, CaptioningBatch]):
    """Transforms each image, stacks a batch, and tokenizes all captions of the batch at once.

    Args:
        tokenizer: ``tokenizer(list_of_texts) -> {"input_ids", "attention_mask"}``.
        image_transform: applied to each ``(C, H, W)`` image in ``encode_sample``.
        max_length: longest caption, in tokens.
    """

    def __init__(
        self,
        tokenizer: Optional[Callable] = None,
        image_transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        max_length: int = 64,
    ):
        super().__init__(batch_type=CaptioningRawBatch)
        self.tokenizer = tokenizer or HashTokenizer(max_length=max_length)
        self.image_transform = image_transform or default_train_transform()
        self.max_length = max_length

    def encode_sample(self, sample: CaptioningSample) -> CaptioningSample:
        # A caption that is not a string (a JSON list of captions, null) would fail the tokenizer in
        # encode_batch and drop the whole batch; here it drops its own sample, naming the field.
        if not isinstance(sample.caption, str):
            raise SampleException(f"field 'caption': must be a string, got {sample.caption!r}")
        sample.image = self.image_transform(sample.image)
        return sample

    def batch(self, samples: List[CaptioningSample]) -> CaptioningRawBatch:
        return self._batch(samples, result_type=CaptioningRawBatch, actions={"image": batch_stack, "caption": batch_list})

    def encode_batch(self, batch_data: CaptioningRawBatch) -> CaptioningBatch:
        tokenized = self.tokenizer(batch_data.caption)
        return CaptioningBatch(
            __keys__=batch_data.__key__,
            images=batch_data.image,
            text_tokens=tokenized["input_ids"],
            text_attn_mask=tokenized["attention_mask"],
        )
