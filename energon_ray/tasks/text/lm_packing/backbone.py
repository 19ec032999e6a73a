"""``PackedGPT``: a causal language model for packed rows (positions and attention per document)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from energon_ray.tasks.layers import Block, causal_mask, check_length, document_causal_mask


class PackedGPT(nn.Module):
    """Token + position embeddings through causal blocks; with ``document_ids`` a token attends only
    to the earlier tokens of its own document, and ``position_ids`` restart at each document.

    Args:
        vocab_size: token ids (the tokenizer's ``vocab_size``).
        max_positions: longest row (the task encoder's ``max_length``).
        embed_dim, num_heads, num_layers: size of the transformer.

    Example:
        >>> model = PackedGPT(vocab_size=259, max_positions=16, embed_dim=16, num_heads=2, num_layers=1)
        >>> ids = torch.ones(2, 16, dtype=torch.long)
        >>> model(ids, document_ids=torch.ones(2, 16, dtype=torch.long)).shape
        torch.Size([2, 16, 259])
    """

    def __init__(self, vocab_size: int, max_positions: int, embed_dim: int = 64, num_heads: int = 4, num_layers: int = 2):
        super().__init__()
        self.max_positions = max_positions
        self.num_heads = num_heads
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.pos = nn.Embedding(max_positions, embed_dim)
        self.layers = nn.ModuleList(Block(embed_dim, num_heads) for _ in range(num_layers))
        self.ln = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size)

    def forward(
        self, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor] = None, document_ids: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Logits ``(B, L, vocab_size)`` of the next token at every position of ``input_ids`` ``(B, L)``."""
        length = input_ids.shape[1]
        check_length(length, self.max_positions, "PackedGPT")
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).expand_as(input_ids)
        x = self.embed(input_ids) + self.pos(position_ids)
        if document_ids is None:
            mask = causal_mask(length, input_ids.device)
        else:
            mask = document_causal_mask(document_ids, self.num_heads)
        for layer in self.layers:
            x = layer(x, attn_mask=mask)
        return self.head(self.ln(x))
