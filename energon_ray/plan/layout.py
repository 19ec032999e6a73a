"""How long a leaf's segments (one Ray task each) are: the default lengths and the choice of layout.

A segment is rounded up to whole batches (or whole packing buffers). Each worker stream starts with
short segments, so the first batch comes soon, and goes on with longer ones, which cost the trainer
less per batch (``SegmentLayout``: ``first_length`` for the first ``first_rounds`` segments, then
``length``).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

from energon_ray.plan.stream import SegmentLayout

#: Samples a segment (one Ray task) aims for; rounded up to whole batches (or packing buffers).
#: Each block costs the trainer its task's submission and a ``ray.get`` (~2-4 ms on 2 slow cores,
#: nearly all in Ray's calls); 128-sample segments measured 1.4-1.5 vs 2.0-2.2 ms of trainer CPU per
#: batch for 64, and 32 (one batch a block) 4.3-4.6 vs 1.7 by default (captioning, 2 CPUs). Longer
#: segments hold more memory: the trainer keeps one partly consumed block per worker stream (at 16
#: workers on 2 cores, stop 57: peak PSS 6557 MiB by default, 5247 with 32-sample segments).
TARGET_SEGMENT_SAMPLES = 128
#: ... and where the loader has many worker streams, fewer: the later segments of all worker streams
#: together aim for at most this many samples (the trainer holds a block of each stream while it
#: hands out batches round-robin, and each Ray worker holds its segment's output until the task
#: ends): 128 up to 8 workers, 64 at 16 (two batches of 32, as Energon's two batches prefetched per
#: worker), 32 at 32. Measured at 16 workers (captioning, batch 32, 2-core box oversubscribed, one
#: run each, stop 58): peak PSS 6970 MiB with 128, 6047 with 64, 5209 with 32 (Energon 4460);
#: trainer CPU 2.3, 3.8, 5.2 ms per batch (Energon 3.5).
STREAMS_SAMPLES_BUDGET = 1024
#: ... except each worker's first ``FIRST_SEGMENT_ROUNDS`` segments, which aim for this many: the
#: first batch waits for one whole segment (measured 1.7-1.8 s with 128-sample segments, 1.4-1.5 s
#: with 64, on 2 CPUs).
FIRST_SEGMENT_SAMPLES = 64
FIRST_SEGMENT_ROUNDS = 1
#: Segments of a leaf whose segments the loader runs several to a task (``grouped``: the default
#: executor, see ``chained.groups_segments``): this many samples, rounded up to whole batches (one
#: batch of 32). ``TaskStream`` runs consecutive segments of the plan (any leaf, any worker stream,
#: in the order the trainer takes them) in one task of ``task_targets`` samples, so a block holds
#: what the trainer takes next, not a partly taken block per leaf and worker stream. Measured
#: (captioning, a blend of 8 datasets, 2 workers, 2-core box, stop 59): peak PSS 3831 → 2708 MiB,
#: first batch 2.0 → 1.0 s, trainer 3.1 → 2.7 ms per batch. Shorter segments hold less (8
#: samples: 2368 MiB, 4: 2324) but cost the trainer more (3.6, 5.7 ms per batch).
GROUPED_SEGMENT_SAMPLES = 32
#: ... except a sample blend's leaves' first segment: the first batch draws its samples from every
#: leaf, so it waits for the first segment of each (a blend of 8: 8 x 32 samples encoded before it).
#: Measured (captioning, a blend of 8, 2 workers, medians of 2): first batch 0.80 s with 32, 0.25 s
#: with 8, 0.68 s with 4 (more segments to make and take), the same steady rate.
SAMPLE_BLEND_FIRST_SAMPLES = 8
#: Packing restarts at segment boundaries: packed datasets keep their one length (of this many samples).
PACKED_SEGMENT_SAMPLES = 64
#: A packed blend's leaves (they do not pack: the blend does) start with segments of this many samples.
PACKED_BLEND_FIRST_SAMPLES = 128


def task_targets(streams: int = 1) -> Tuple[int, int]:
    """Samples a task of grouped segments aims for: ``(first, later)``, the first for each of the
    first tasks of a pass (one per slot: a quick first batch), as ungrouped segments are long."""
    later = max(1, min(TARGET_SEGMENT_SAMPLES, STREAMS_SAMPLES_BUDGET // max(1, streams)))
    return min(FIRST_SEGMENT_SAMPLES, later), later


def choose_layout(
    wanted: Optional[Union[int, Tuple[int, int]]], batch_size: Optional[int], packing_buffer_size: Optional[int],
    blend_samples: bool, pack_chunk_buffers: int, streams: int = 1, grouped: bool = False,
) -> SegmentLayout:  # fmt: skip
    """The segment layout of a leaf: ``wanted`` is what the user asked for (one length, ``(first,
    later)``, or ``None``: the defaults above, for ``streams`` worker streams); one length where the
    user gave one or the dataset packs; a packed blend's leaf (``packing_buffer_size`` and
    ``blend_samples``) starts with short segments, as many as a chunk of ``pack_chunk_buffers``
    buffers may draw from one leaf. ``grouped``: the loader runs several of the leaf's segments in
    one task; by default they are then ``GROUPED_SEGMENT_SAMPLES`` long."""
    if packing_buffer_size:
        unit = packing_buffer_size
        later = wanted[1] if isinstance(wanted, tuple) else wanted
        later = unit * max(4, math.ceil((later or PACKED_SEGMENT_SAMPLES) / unit))
        if not blend_samples or isinstance(wanted, int):
            return SegmentLayout(later)
        # a packed blend's leaf only hands out its samples (packed after the blend, a chunk at a
        # time): short first segments, so the first batch waits for about a chunk's samples, not a
        # long segment of every leaf (measured on 2 CPUs: 2048 samples encoded before it, not ~640)
        first = wanted[0] if isinstance(wanted, tuple) else PACKED_BLEND_FIRST_SAMPLES
        if first >= later:
            return SegmentLayout(later)
        return SegmentLayout(later, first_length=first, first_rounds=math.ceil(pack_chunk_buffers * unit / first))
    if wanted is None and grouped:
        size = batch_size or 1
        length = size * max(1, math.ceil(GROUPED_SEGMENT_SAMPLES / size))
        if blend_samples and SAMPLE_BLEND_FIRST_SAMPLES < length:
            return SegmentLayout(length, first_length=SAMPLE_BLEND_FIRST_SAMPLES, first_rounds=1)
        return SegmentLayout(length)
    if wanted is None:
        # a sample blend's leaves too (measured, stop 36: 128-sample later segments cut the trainer's
        # CPU per batch from 5.3 to 3.8 ms at the same steady rate; at stop 25 they had been slower)
        wanted = task_targets(streams)
    size = batch_size or 1
    first, later = ((size * max(1, math.ceil(n / size))) for n in (wanted if isinstance(wanted, tuple) else (wanted, wanted)))
    if first == later:
        return SegmentLayout(later)
    return SegmentLayout(later, first_length=first, first_rounds=FIRST_SEGMENT_ROUNDS)
