"""``GPT2``: the small GPT of Lightning Transformers' iGPT example, on our ``Block``."""

from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import nn

from energon_ray.tasks.layers import Block, causal_mask, check_length


class GPT2(nn.Module):
    """A learned start token, then token + position embeddings through causal blocks.

    Position ``i`` sees the start token and pixels ``0 .. i-1`` and predicts pixel ``i``, so the
    logits line up with the input ids. With ``classify=True`` it also returns class logits from the
    mean of the final hidden states.

    Args:
        embed_dim, num_heads, num_layers: size of the transformer.
        max_positions: longest pixel sequence.
        num_vocab: pixel ids (the quantiser's ``vocab_size``).
        num_classes: classes of the classification head.

    Example:
        >>> model = GPT2(embed_dim=16, num_heads=2, num_layers=1, max_positions=64, num_vocab=27, num_classes=4)
        >>> [t.shape for t in model(torch.zeros(2, 64, dtype=torch.long), classify=True)]
        [torch.Size([2, 4]), torch.Size([2, 64, 27])]
    """

    def __init__(self, embed_dim: int, num_heads: int, num_layers: int, max_positions: int, num_vocab: int, num_classes: int):
        super().__init__()
        self.max_positions = max_positions
        self.sos = nn.Parameter(torch.zeros(embed_dim))
        nn.init.normal_(self.sos)
        self.token_embeddings = nn.Embedding(num_vocab, embed_dim)
        self.position_embeddings = nn.Embedding(max_positions, embed_dim)
        self.layers = nn.ModuleList(Block(embed_dim, num_heads) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_vocab, bias=False)
        self.clf_head = nn.Linear(embed_dim, num_classes)

    def forward(self, x: torch.Tensor, classify: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """``x``: ``(B, L)`` pixel ids → logits ``(B, L, num_vocab)`` (and ``(B, num_classes)`` first)."""
        length = x.shape[1]
        check_length(length, self.max_positions, "GPT2")
        h = self.token_embeddings(x[:, :-1])
        h = torch.cat([self.sos.expand(x.shape[0], 1, -1), h], dim=1)
        h = h + self.position_embeddings(torch.arange(length, device=x.device))
        mask = causal_mask(length, x.device)
        for layer in self.layers:
            h = layer(h, attn_mask=mask)
        h = self.ln_f(h)
        logits = self.head(h)
        if classify:
            return self.clf_head(h.mean(dim=1)), logits
        return logits
