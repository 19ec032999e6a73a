"""Text packing, ready to run: tokenized documents packed into fixed-length sequences.

``select_samples_to_pack`` packs the whole buffer first-fit-decreasing into bins of ``max_length``
tokens (no document is dropped or split); ``pack_selected_samples`` concatenates a bin and builds
what a trainer needs: ``input_ids``, ``labels`` (next token, -100 across document boundaries and
padding), ``position_ids`` restarting per document, ``document_ids`` (0 = padding), and
``cu_seqlens`` for variable-length attention kernels.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from energon_ray.samples import Batch, Sample, TextSample, edataclass
from energon_ray.task_encoder import Cooker, DefaultTaskEncoder, basic_sample_keys, batch_stack
from energon_ray.tasks.tokenizer import HashTokenizer


@edataclass
class TokenizedDocument(Sample):
    """One document's token ids (at most ``max_length``)."""

    tokens: torch.Tensor


@edataclass
class PackedSequence(Sample):
    """Documents packed into one ``max_length`` row."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    document_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    num_tokens: int
    documents: List[str]


@edataclass
class PackedTextBatch(Batch):
    """A batch of packed rows, ``(B, max_length)`` each."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    document_ids: torch.Tensor
    cu_seqlens: List[torch.Tensor]
    num_tokens: torch.Tensor
    documents: List[List[str]]


def cook_text(sample: dict) -> TextSample:
    """Crude JSONL line ``{"text": …}`` (or a ``txt`` part) → ``TextSample``."""
    if "json" in sample:
        value = sample["json"]
        text = value.get("text") if isinstance(value, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"JSONL sample {sample['__key__']!r} has no string field 'text'")
    else:
        text = sample["txt"]
    return TextSample(**basic_sample_keys(sample), text=text)


def first_fit_decreasing(lengths: List[int], capacity: int) -> List[List[int]]:
    """Indices grouped into bins of at most ``capacity``, longest first, each into the first bin it fits.

    Example:
        >>> first_fit_decreasing([5, 3, 4, 2, 6], 10)
        [[4, 2], [0, 1, 3]]
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: List[List[int]] = []
    free: List[int] = []
    for i in order:
        for b, room in enumerate(free):
            if lengths[i] <= room:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(capacity - lengths[i])
    return bins


class TextPackingTaskEncoder(DefaultTaskEncoder):
    """Tokenize, pack first-fit-decreasing into ``max_length`` rows, batch.

    Args:
        max_length: tokens per packed row.
        tokenizer: ``.encode(text) -> list[int]`` (default: ``HashTokenizer``, no download).
        pad_id: id used for padding.
    """

    cookers = [Cooker(cook_text)]

    def __init__(self, max_length: int = 2048, tokenizer: Optional[Any] = None, pad_id: int = 0):
        super().__init__()
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        self.max_length = max_length
        self.tokenizer = tokenizer or HashTokenizer(max_length=max_length)
        self.pad_id = pad_id

    def encode_sample(self, sample: TextSample) -> TokenizedDocument:
        ids = self.tokenizer.encode(sample.text)[: self.max_length]
        return TokenizedDocument.derive_from(sample, tokens=torch.tensor(ids, dtype=torch.long))

    def select_samples_to_pack(self, samples: List[TokenizedDocument]) -> List[List[TokenizedDocument]]:
        bins = first_fit_decreasing([len(s.tokens) for s in samples], self.max_length)
        return [[samples[i] for i in sorted(b)] for b in bins]

    def pack_selected_samples(self, samples: List[TokenizedDocument]) -> PackedSequence:
        length = self.max_length
        input_ids = torch.full((length,), self.pad_id, dtype=torch.long)
        labels = torch.full((length,), -100, dtype=torch.long)
        position_ids = torch.zeros(length, dtype=torch.long)
        document_ids = torch.zeros(length, dtype=torch.long)
        bounds = [0]
        pos = 0
        for doc, sample in enumerate(samples, start=1):
            n = len(sample.tokens)
            input_ids[pos : pos + n] = sample.tokens
            labels[pos : pos + n - 1] = sample.tokens[1:]
            position_ids[pos : pos + n] = torch.arange(n)
            document_ids[pos : pos + n] = doc
            pos += n
            bounds.append(pos)
        return PackedSequence.derive_from(
            samples[0],
            __key__="+".join(s.__key__ for s in samples),
            input_ids=input_ids,
            labels=labels,
            position_ids=position_ids,
            document_ids=document_ids,
            cu_seqlens=torch.tensor(bounds, dtype=torch.int32),
            num_tokens=pos,
            documents=[s.__key__ for s in samples],
        )

    def batch(self, samples: List[PackedSequence]) -> PackedTextBatch:
        return PackedTextBatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=tuple(s.__restore_key__ for s in samples),
            input_ids=batch_stack([s.input_ids for s in samples]),
            labels=batch_stack([s.labels for s in samples]),
            position_ids=batch_stack([s.position_ids for s in samples]),
            document_ids=batch_stack([s.document_ids for s in samples]),
            cu_seqlens=[s.cu_seqlens for s in samples],
            num_tokens=torch.tensor([s.num_tokens for s in samples]),
            documents=[s.documents for s in samples],
        )

    def encode_batch(self, batch: PackedTextBatch) -> PackedTextBatch:
        return batch


def lognormal_corpus(num_docs: int, mean_words: float = 60, sigma: float = 0.9, seed: int = 0, max_words: Optional[int] = None) -> List[str]:
    """Documents whose word counts follow a log-normal distribution (like real web text)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(5000)]
    mu = np.log(mean_words) - sigma**2 / 2
    lengths = np.maximum(1, rng.lognormal(mu, sigma, num_docs).astype(int))
    if max_words:
        lengths = np.minimum(lengths, max_words)
    return [" ".join(vocab[j] for j in rng.integers(0, len(vocab), n)) for n in lengths]
