"""Tokenizers that need no download (hashed words, UTF-8 bytes), and a Hugging Face one by name.

They have the call shape of Hugging Face tokenizers (``tokenizer(texts) -> {"input_ids", "attention_mask"}``)
so task encoders written for them run unchanged in jobs, tests and benchmarks.
"""

from __future__ import annotations

import re
import zlib
from typing import Dict, List, Optional, Sequence

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


class ByteTokenizer:
    """UTF-8 bytes as tokens: no vocabulary file, nothing to download, every text round-trips.

    Ids: 0 = pad, 1 = begin, 2 = end, ``3 + b`` for byte ``b``; so 259 ids in all. Same call shape
    as :class:`HashTokenizer` (``tokenizer(texts) -> {"input_ids", "attention_mask"}``, ``encode``).

    Args:
        max_length: sequences are truncated to this many tokens (incl. begin/end).
        vocab_size: ids the model embeds (``vocab_size`` of the tokenizer config, which backbones
            interpolate); at least 259, more only leaves ids unused.

    Raises:
        ValueError: ``max_length < 2`` or ``vocab_size < 259``.

    Example:
        >>> tok = ByteTokenizer(max_length=8)
        >>> tok.encode("hi"), tok.decode(tok.encode("hi"))
        ([1, 107, 108, 2], 'hi')
    """

    pad_id, bos_id, eos_id = 0, 1, 2
    #: ids below this are the special tokens; byte ``b`` is ``offset + b``
    offset = 3

    def __init__(self, max_length: int = 64, vocab_size: int = 259):
        if max_length < 2:
            raise ValueError(f"ByteTokenizer: max_length must be >= 2, got {max_length}")
        if vocab_size < 256 + self.offset:
            raise ValueError(f"ByteTokenizer: vocab_size must be >= {256 + self.offset} (3 special ids + 256 bytes), got {vocab_size}")
        self.max_length = max_length
        self.vocab_size = vocab_size

    def __repr__(self) -> str:
        return f"ByteTokenizer(max_length={self.max_length}, vocab_size={self.vocab_size})"

    def encode(self, text: str) -> List[int]:
        """Token ids of one text, with begin and end markers."""
        ids = [self.offset + b for b in text.encode("utf-8")[: self.max_length - 2]]
        return [self.bos_id, *ids, self.eos_id]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids (special ids dropped; a truncated character becomes U+FFFD)."""
        data = bytes(int(i) - self.offset for i in ids if self.offset <= int(i) < self.offset + 256)
        return data.decode("utf-8", errors="replace")

    def __call__(self, texts: Sequence[str]) -> Dict[str, torch.Tensor]:
        """Pad a batch of texts to its longest sequence."""
        return _pad([self.encode(t) for t in ([texts] if isinstance(texts, str) else texts)], self.pad_id)


class HFTokenizer:
    """A Hugging Face tokenizer with the call shape of the tokenizers above (``transformers`` is
    imported only when one is built, so the rest of energon_ray never needs it).

    Args:
        pretrained_model_name_or_path: passed to ``transformers.AutoTokenizer.from_pretrained``.
        max_length: sequences are truncated to this many tokens.
        vocab_size: ids the model embeds; ``None`` takes ``len(tokenizer)``.
        **kwargs: more ``from_pretrained`` arguments (``use_fast``, ``revision``, ``cache_dir`` …).

    Raises:
        ImportError: ``transformers`` is not installed (with the install command).
        ValueError: ``vocab_size`` smaller than the tokenizer's vocabulary.

    Example:
        >>> tok = HFTokenizer("gpt2", max_length=16)  # doctest: +SKIP
        >>> tok(["a cat"])["input_ids"].shape         # doctest: +SKIP
        torch.Size([1, 2])
    """

    def __init__(self, pretrained_model_name_or_path: str, max_length: int = 64, vocab_size: Optional[int] = None, **kwargs):
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise ImportError(
                f"tokenizer {pretrained_model_name_or_path!r} is a Hugging Face tokenizer and needs `transformers` "
                "(pip install transformers); the default tokenizer config 'byte' needs nothing"
            ) from exc
        self.name = pretrained_model_name_or_path
        self.tokenizer = AutoTokenizer.from_pretrained(pretrained_model_name_or_path, **kwargs)
        size = len(self.tokenizer)
        if vocab_size is not None and vocab_size < size:
            raise ValueError(f"HFTokenizer({self.name!r}): vocab_size={vocab_size} is smaller than the tokenizer's {size} ids")
        self.vocab_size = vocab_size or size
        self.max_length = max_length
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, max_length={self.max_length}, vocab_size={self.vocab_size})"

    def encode(self, text: str) -> List[int]:
        """Token ids of one text (with the tokenizer's own special tokens), truncated."""
        return list(self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids, special tokens dropped."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def __call__(self, texts: Sequence[str]) -> Dict[str, torch.Tensor]:
        """Pad a batch of texts to its longest sequence (with ``pad_id``)."""
        return _pad([self.encode(t) for t in ([texts] if isinstance(texts, str) else texts)], self.pad_id)


def _pad(encoded: List[List[int]], pad_id: int) -> Dict[str, torch.Tensor]:
    width = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(encoded), width, dtype=torch.long)
    for i, e in enumerate(encoded):
        ids[i, : len(e)] = torch.tensor(e, dtype=torch.long)
        mask[i, : len(e)] = 1
    return {"input_ids": ids, "attention_mask": mask}
