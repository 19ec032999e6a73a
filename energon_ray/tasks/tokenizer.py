"""A tokenizer that needs no download: lower-cased words hashed into a fixed vocabulary.

It has the call shape of Hugging Face tokenizers (``tokenizer(texts) -> {"input_ids", "attention_mask"}``)
so task encoders written for them run unchanged in jobs, tests and benchmarks.
"""

from __future__ import annotations

import re
import zlib
from typing import Dict, List, Sequence

import torch

_WORD_RE = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


class HashTokenizer:
    """Deterministic word-hash tokenizer with padding/truncation.

    Args:
        vocab_size: ids are in ``[3, vocab_size)``; 0 = pad, 1 = begin, 2 = end.
        max_length: sequences are truncated to this many tokens (incl. begin/end).

    Example:
        >>> out = HashTokenizer(max_length=6)(["a cat", "a red bus"])
        >>> out["input_ids"].shape, out["attention_mask"][0].tolist()
        (torch.Size([2, 5]), [1, 1, 1, 1, 0])
    """

    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, vocab_size: int = 32000, max_length: int = 64):
        if vocab_size < 4:
            raise ValueError(f"vocab_size must be >= 4, got {vocab_size}")
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        self.vocab_size = vocab_size
        self.max_length = max_length

    def encode(self, text: str) -> List[int]:
        """Token ids of one text, with begin and end markers."""
        words = _WORD_RE.findall(text.lower())
        ids = [3 + zlib.crc32(w.encode()) % (self.vocab_size - 3) for w in words]
        return [self.bos_id, *ids[: self.max_length - 2], self.eos_id]

    def __call__(self, texts: Sequence[str]) -> Dict[str, torch.Tensor]:
        """Pad a batch of texts to its longest sequence."""
        if isinstance(texts, str):
            texts = [texts]
        encoded = [self.encode(t) for t in texts]
        width = max(len(e) for e in encoded)
        ids = torch.zeros(len(encoded), width, dtype=torch.long)
        mask = torch.zeros(len(encoded), width, dtype=torch.long)
        for i, e in enumerate(encoded):
            ids[i, : len(e)] = torch.tensor(e)
            mask[i, : len(e)] = 1
        return {"input_ids": ids, "attention_mask": mask}
