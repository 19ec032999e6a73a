"""Small transformer pieces the tasks' backbones are built from (torch only).

``Block`` is a pre-norm transformer layer (self-attention, optional cross-attention, MLP);
``PatchEmbed`` turns images into patch tokens; ``TextDecoder`` is a causal token decoder that
attends to a memory (image, video or question tokens). Masks are boolean, ``True`` = may not attend.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


def causal_mask(length: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """``(length, length)`` bool mask, ``True`` above the diagonal (a position sees itself and the past).

    Example:
        >>> causal_mask(3).int().tolist()
        [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    """
    return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)


def document_causal_mask(document_ids: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Causal attention within each packed document: ``(batch * num_heads, L, L)`` bool mask.

    A position sees the earlier positions of its own document (padding, document 0, counts as one
    document, so no row is fully masked).

    Example:
        >>> document_causal_mask(torch.tensor([[1, 1, 2]]), 1)[0].int().tolist()
        [[0, 1, 1], [0, 0, 1], [1, 1, 0]]
    """
    same = document_ids[:, :, None] == document_ids[:, None, :]
    allowed = same & ~causal_mask(document_ids.shape[1], document_ids.device)
    return (~allowed).repeat_interleave(num_heads, dim=0)


class Block(nn.Module):
    """Pre-norm transformer layer: self-attention, cross-attention to ``memory`` (if ``cross``), MLP.

    Args:
        dim: width of the tokens.
        num_heads: attention heads (``dim`` must be divisible by it).
        cross: add a cross-attention sub-layer (a decoder layer).
        mlp_ratio: hidden width of the MLP, in multiples of ``dim``.
    """

    def __init__(self, dim: int, num_heads: int, cross: bool = False, mlp_ratio: int = 4):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"Block: dim={dim} must be divisible by num_heads={num_heads}")
        self.ln_self = nn.LayerNorm(dim)
        self.self_attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)
        self.ln_cross = nn.LayerNorm(dim) if cross else None
        self.cross_attn = nn.MultiheadAttention(dim, num_heads, batch_first=True) if cross else None
        self.ln_mlp = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        padding_mask: Optional[torch.Tensor] = None,
        memory: Optional[torch.Tensor] = None,
        memory_padding_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        h = self.ln_self(x)
        x = x + self.self_attn(h, h, h, attn_mask=attn_mask, key_padding_mask=padding_mask, need_weights=False)[0]
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("Block(cross=True) needs memory")
            h = self.ln_cross(x)
            x = x + self.cross_attn(h, memory, memory, key_padding_mask=memory_padding_mask, need_weights=False)[0]
        return x + self.mlp(self.ln_mlp(x))


class PatchEmbed(nn.Module):
    """``(B, 3, H, W)`` images → ``(B, patches, dim)`` tokens with learned positions.

    Args:
        dim: token width.
        patch_size: side of a square patch.
        max_patches: most patches an image may have (size of the position table).
    """

    def __init__(self, dim: int, patch_size: int, max_patches: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.pos = nn.Parameter(torch.zeros(1, max_patches, dim))
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.proj(images.float()).flatten(2).transpose(1, 2)
        if tokens.shape[1] > self.pos.shape[1]:
            raise ValueError(
                f"PatchEmbed: an image of {tuple(images.shape[-2:])} has {tokens.shape[1]} patches, more than "
                f"max_patches={self.pos.shape[1]}; raise the backbone's max_patches or lower the image size"
            )
        return tokens + self.pos[:, : tokens.shape[1]]


class TextDecoder(nn.Module):
    """Causal decoder over token ids that cross-attends to a memory; returns logits.

    Args:
        vocab_size: ids the embedding and the output layer cover.
        max_positions: longest token sequence.
        dim: token width; num_heads, num_layers: of the decoder layers.
    """

    def __init__(self, vocab_size: int, max_positions: int, dim: int, num_heads: int, num_layers: int):
        super().__init__()
        self.max_positions = max_positions
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_positions, dim)
        self.layers = nn.ModuleList(Block(dim, num_heads, cross=True) for _ in range(num_layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(
        self,
        tokens: torch.Tensor,
        memory: torch.Tensor,
        padding_mask: Optional[torch.Tensor] = None,
        memory_padding_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        length = tokens.shape[1]
        check_length(length, self.max_positions, "TextDecoder")
        x = self.embed(tokens) + self.pos(torch.arange(length, device=tokens.device))
        mask = causal_mask(length, tokens.device)
        for layer in self.layers:
            x = layer(x, attn_mask=mask, padding_mask=padding_mask, memory=memory, memory_padding_mask=memory_padding_mask)
        return self.head(self.ln(x))


def check_length(length: int, max_positions: int, who: str) -> None:
    """Raise a clear error for a sequence longer than a backbone's position table."""
    if length > max_positions:
        raise ValueError(
            f"{who}: a sequence of {length} tokens is longer than max_positions={max_positions}; raise the "
            "backbone's max_positions (or lower the tokenizer's / task encoder's max_length)"
        )
