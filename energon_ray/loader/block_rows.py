"""The rows of a pass's blocks as ``feed.MultiFeed`` files them: each row checked against the
segment the plan expects next (Ray must keep the order), decoded zero-copy, its report's handler
calls and errors placed (``loader.events``), and with pinning each worker stream's items chained for
copying a round ahead (``pinning.chained``).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from energon_ray.errors import unwrap_error
from energon_ray.loader.events import account_block
from energon_ray.loader.group_items import decode_row
from energon_ray.loader.merge import Row
from energon_ray.loader.pinning import chained
from energon_ray.pipeline import rows

logger = logging.getLogger("energon_ray")


class BlockRows:
    """``MultiFeed``'s reading of blocks into rows (a mixin: it reads the feed's leaves' queues,
    pinning and block references, and counts off ``_rows_left`` and ``ahead_wanted``)."""

    def _pin_ahead(self, block_rows: List[Row], early: Dict[int, Row], sources: List[int]) -> Dict[int, Row]:
        """With pinning: the block's item rows, by row index, each value a ``Pinning`` linked to its
        worker stream's next one (``pinning.chained``): the copy of the block's first starts when
        the stream's batch before it is handed out (now, if that was handed out already), each
        other's as the batch before it is (the items are zero-copy views of the block until copied)."""
        if self._pinner is None:
            return {}
        by_stream: Dict[Tuple[int, int], List[Tuple[int, Row]]] = {}
        for i, row in enumerate(block_rows):
            if row[0] == rows.ITEM and i not in early:
                by_stream.setdefault((sources[i], row[1]), []).append((i, decode_row(row, False)))
        out: Dict[int, Row] = {}
        for stream, decoded in by_stream.items():
            pinnings = chained(self._pinner, [row[4] for _, row in decoded], stream=stream)
            for (i, row), pinning in zip(decoded, pinnings):
                out[i] = (*row[:4], pinning)
        return out

    def _execute(self, blocks, specs) -> Iterator[Tuple[int, Row, bool, Optional[List[int]], Optional[List[Any]]]]:
        """The rows of a stream's blocks, checked against the segments expected (``specs``, or the
        stream's own ``next_spec`` for a pass-long ``TaskStream``)."""
        expected = blocks.next_spec if specs is None else functools.partial(next, iter(specs), None)
        spec = expected()
        started = time.perf_counter()
        hand_out = {feed.source for feed in self.feeds if feed.queues.hand_out}
        try:
            for block in blocks:
                block_rows = list(rows.iter_rows(block))
                block_sources = rows.sources(block)
                block_positions = rows.positions(block)
                early, leftovers, events = account_block(
                    block_rows, block_sources, block_positions, lambda source: self.feeds[source].queues,
                    lambda row: decode_row(row, self.pin),
                )
                pinning = self._pin_ahead(block_rows, early, block_sources)
                self._rows_left = block.num_rows
                self.ahead_wanted = max(0, self.ahead_wanted - 1)
                for i, (row, source, positions) in enumerate(zip(block_rows, block_sources, block_positions)):
                    self._rows_left -= 1
                    if spec is None or (spec.source, spec.worker, spec.index) != (source, row[1], row[2]):
                        raise RuntimeError(
                            f"energon_ray: Ray returned segment {(source, row[1], row[2])} where the plan expected "
                            f"{None if spec is None else (spec.source, spec.worker, spec.index)}; order is not preserved"
                        )
                    decoded = (
                        early[i] if i in early else leftovers[i] if i in leftovers else pinning[i] if i in pinning
                        else decode_row(row, self.pin)
                    )  # fmt: skip
                    if source in hand_out and row[0] == rows.LEFTOVER:  # the batching task reads them from the block
                        decoded = (*decoded[:4], self.block_refs.locate(decoded[4], blocks.last_ref, i))
                    yield source, decoded, spec.last, positions, events.get(i)
                    if row[0] == rows.REPORT:
                        spec = expected()
        except Exception as exc:
            ours = unwrap_error(exc)
            if ours is not None:
                raise ours from None
            raise
        finally:
            blocks.close()
        logger.debug("%s took %.2fs", "the pass's tasks" if specs is None else f"window of {len(specs)} segments", time.perf_counter() - started)
