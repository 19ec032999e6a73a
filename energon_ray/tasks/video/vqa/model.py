"""``VideoQATask``: next-token cross entropy on the answer, given the frames and the question."""

from __future__ import annotations

import torch

from energon_ray.tasks.module import TaskModule, masked_token_loss
from energon_ray.tasks.video_qa import VideoQABatch


class VideoQATask(TaskModule):
    """Teacher-forced answers: the backbone is called as ``backbone(frames, question, question_mask,
    answer_so_far) -> logits`` (e.g. ``TinyVideoQA``); uint8 frames are scaled to [0, 1] here, on the
    device, so they travel 4x smaller; answer padding is left out of the loss."""

    def loss(self, batch: VideoQABatch) -> torch.Tensor:
        frames = batch.frames
        if frames.dtype == torch.uint8:
            frames = frames.float().div_(255)
        answer, mask = batch.answer_tokens, batch.answer_attn_mask
        logits = self.model(frames, batch.question_tokens, batch.question_attn_mask, answer[:, :-1])
        return masked_token_loss(logits, answer[:, 1:], mask[:, 1:])
