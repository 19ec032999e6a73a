"""The synthetic corpus of the default config: short documents of a small, regular language."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from energon_ray.synthetic import write_shards, write_synthetic_dataset

_SUBJECTS = ("the cat", "a dog", "the bird", "my friend", "the old man", "a child")
_VERBS = ("sees", "likes", "follows", "finds", "hears")
_OBJECTS = ("the ball", "a tree", "the river", "a red car", "the moon", "some bread")


def document(index: int, max_sentences: int = 2) -> str:
    """A document of 1 to ``max_sentences`` simple sentences, chosen by ``index``.

    Example:
        >>> document(0)
        'my friend sees a tree. the bird sees some bread.'
    """
    rng = np.random.default_rng([index, 23])
    sentences = []
    for _ in range(int(rng.integers(1, max_sentences + 1))):
        s, v, o = (int(rng.integers(len(words))) for words in (_SUBJECTS, _VERBS, _OBJECTS))
        sentences.append(f"{_SUBJECTS[s]} {_VERBS[v]} {_OBJECTS[o]}.")
    return " ".join(sentences)


def samples(num_samples: int) -> List[Tuple[str, Dict[str, bytes]]]:
    """``(key, {"txt"})`` samples."""
    return [(f"doc_{i:05d}", {"txt": document(i).encode()}) for i in range(num_samples)]


def synthetic(
    root: str | Path, num_samples: int = 192, samples_per_shard: int = 32, split_ratio: Sequence[float] = (4, 1, 1)
) -> Path:
    """Write and prepare (only into a new or empty folder; a prepared ``root`` is used as is: see
    :func:`energon_ray.synthetic.write_synthetic_dataset`) a ``TextSample`` corpus of ``num_samples``
    documents, split into whole shards by ``split_ratio``.

    Example:
        >>> synthetic("/tmp/corpus", num_samples=64)  # doctest: +SKIP
        PosixPath('/tmp/corpus')
    """
    return write_synthetic_dataset(
        root, lambda folder: write_shards(folder / "shards", samples(num_samples), samples_per_shard),
        recipe=dict(num_samples=num_samples, samples_per_shard=samples_per_shard),
        split_ratio=tuple(split_ratio), sample_type="TextSample", field_map={"text": "txt"}, progress=False,
    )  # fmt: skip
