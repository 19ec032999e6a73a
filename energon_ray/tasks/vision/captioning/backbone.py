"""``TinyCaptioner``: a patch encoder for the image and a causal decoder for the caption."""

from __future__ import annotations

import torch
from torch import nn

from energon_ray.tasks.layers import Block, PatchEmbed, TextDecoder


class TinyCaptioner(nn.Module):
    """Image tokens (``PatchEmbed`` + ``encoder_layers`` blocks) that a ``TextDecoder`` attends to.

    Args:
        vocab_size: token ids the decoder embeds and predicts (the tokenizer's ``vocab_size``).
        max_positions: longest caption in tokens (the tokenizer's ``max_length``).
        embed_dim, num_heads: width and heads of every layer.
        encoder_layers, decoder_layers: depth of the image encoder and of the decoder.
        patch_size: side of the square image patches.
        max_patches: most patches per image.

    Example:
        >>> model = TinyCaptioner(vocab_size=259, max_positions=16)
        >>> model(torch.rand(2, 3, 32, 32), torch.ones(2, 5, dtype=torch.long)).shape
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
    ):
        super().__init__()
        self.patches = PatchEmbed(embed_dim, patch_size, max_patches)
        self.encoder = nn.ModuleList(Block(embed_dim, num_heads) for _ in range(encoder_layers))
        self.decoder = TextDecoder(vocab_size, max_positions, embed_dim, num_heads, decoder_layers)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` → ``(B, patches, embed_dim)``."""
        x = self.patches(images)
        for layer in self.encoder:
            x = layer(x)
        return x

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, vocab_size)`` of the token after each of ``tokens`` ``(B, T)``."""
        return self.decoder(tokens, self.encode_images(images))
