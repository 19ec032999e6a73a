"""``TinyVideoQA``: frame patches and question tokens as the memory of an answer decoder."""

from __future__ import annotations

import torch
from torch import nn

from energon_ray.tasks.layers import Block, PatchEmbed, TextDecoder, check_length


class TinyVideoQA(nn.Module):
    """Each frame's patches (plus a learned per-frame embedding) and the question's tokens are
    encoded together; a ``TextDecoder`` writes the answer attending to them.

    Args:
        vocab_size: token ids (the tokenizer's ``vocab_size``).
        max_positions: longest question or answer in tokens (the tokenizer's ``max_length``).
        embed_dim, num_heads: width and heads of every layer.
        encoder_layers, decoder_layers: depth of the joint encoder and of the answer decoder.
        patch_size: side of the square frame patches.
        max_patches: most patches per frame.
        max_frames: most frames per video.

    Example:
        >>> model = TinyVideoQA(vocab_size=259, max_positions=16)
        >>> frames, question = torch.rand(2, 4, 3, 24, 32), torch.ones(2, 7, dtype=torch.long)
        >>> model(frames, question, torch.ones(2, 7, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)).shape
        torch.Size([2, 5, 259])
    """

    def __init__(
        self,
        vocab_size: int,
        max_positions: int,
        embed_dim: int = 64,
        num_heads: int = 4,
        encoder_layers: int = 1,
        decoder_layers: int = 2,
        patch_size: int = 8,
        max_patches: int = 64,
        max_frames: int = 16,
    ):
        super().__init__()
        self.max_positions = max_positions
        self.max_frames = max_frames
        self.patches = PatchEmbed(embed_dim, patch_size, max_patches)
        self.frame_pos = nn.Embedding(max_frames, embed_dim)
        self.question_embed = nn.Embedding(vocab_size, embed_dim)
        self.question_pos = nn.Embedding(max_positions, embed_dim)
        self.encoder = nn.ModuleList(Block(embed_dim, num_heads) for _ in range(encoder_layers))
        self.decoder = TextDecoder(vocab_size, max_positions, embed_dim, num_heads, decoder_layers)

    def encode(self, frames: torch.Tensor, question: torch.Tensor, question_mask: torch.Tensor) -> torch.Tensor:
        """``(B, F, 3, H, W)`` frames and ``(B, Q)`` question ids → ``(B, F * patches + Q, embed_dim)``."""
        batch, num_frames = frames.shape[:2]
        if num_frames > self.max_frames:
            raise ValueError(f"TinyVideoQA: {num_frames} frames per video, more than max_frames={self.max_frames}")
        check_length(question.shape[1], self.max_positions, "TinyVideoQA")
        video = self.patches(frames.flatten(0, 1)).view(batch, num_frames, -1, self.frame_pos.embedding_dim)
        video = (video + self.frame_pos(torch.arange(num_frames, device=frames.device))[None, :, None]).flatten(1, 2)
        text = self.question_embed(question) + self.question_pos(torch.arange(question.shape[1], device=question.device))
        x = torch.cat([video, text], dim=1)
        padding = torch.cat([torch.zeros(video.shape[:2], dtype=torch.bool, device=x.device), question_mask == 0], dim=1)
        for layer in self.encoder:
            x = layer(x, padding_mask=padding)
        return x

    def forward(self, frames: torch.Tensor, question: torch.Tensor, question_mask: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, A, vocab_size)`` of the token after each of the answer's ``answer`` ``(B, A)``."""
        memory = self.encode(frames, question, question_mask)
        padding = torch.cat([torch.zeros(memory.shape[0], memory.shape[1] - question.shape[1], dtype=torch.bool, device=memory.device), question_mask == 0], dim=1)
        return self.decoder(answer, memory, memory_padding_mask=padding)
