"""The fused segment stage (``EncodeAndBatch``, batches made as samples are encoded) against the two
stages run one after the other: same rows, same batches, same report, in-process (no Ray)."""

from __future__ import annotations

import torch

import energon_ray as er
from energon_ray.pipeline import rows, serde
from energon_ray.pipeline.batch_stages import BatchSamples, EncodeAndBatch
from energon_ray.pipeline.stages import EncodeSamples
from energon_ray.source.reader import read_segment
from tests.helpers import captioning_dataset


class Noisy(er.DefaultTaskEncoder):
    """Seeded noise per sample, skips every 5th sample, and an ``encode_batch`` that adds a field."""

    def encode_sample(self, sample):
        if int(sample.__key__[-6:]) % 5 == 2:
            raise er.SkipSample()
        return {"key": sample.__key__, "noise": torch.rand(3)}

    def batch(self, samples):
        return {"keys": [s["key"] for s in samples], "noise": torch.stack([s["noise"] for s in samples])}

    def encode_batch(self, batch):
        return {**batch, "sum": batch["noise"].sum()}


def _decoded(table):
    out = []
    for (kind, worker, segment, seq, payload), positions in zip(rows.iter_rows(table), rows.positions(table)):
        value = serde.loads(payload)
        if kind == rows.REPORT:
            value = (value.samples_encoded, value.batches, [(r.stage, r.failures, r.ignored) for r in value.runs])
        elif kind == rows.LEFTOVER:
            value = [(key, size, [(p, s, serde.loads(b)["key"]) for p, s, b in items]) for key, size, items in value]
        out.append((kind, worker, segment, seq, value, positions))
    return out


def _same(a, b):
    assert [row[:4] + row[5:] for row in a] == [row[:4] + row[5:] for row in b]
    for x, y in zip(a, b):
        if x[0] == rows.ITEM:
            assert x[4]["keys"] == y[4]["keys"] and torch.equal(x[4]["noise"], y[4]["noise"]) and torch.equal(x[4]["sum"], y[4]["sum"])
        else:
            assert x[4] == y[4]


def test_batches_made_while_encoding_equal_batches_made_after(tmp_path):
    path = captioning_dataset(tmp_path / "ds", n=40, per_shard=9)
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    ds = er.get_train_dataset(path, batch_size=4, worker_config=wc, shuffle_buffer_size=5, max_samples_per_sequence=5,
                              task_encoder=Noisy(), samples_per_segment=(10, 30))  # fmt: skip
    plan, reader, config = ds.plan(), ds.reader(), ds.stage_config()
    for index in range(2):
        spec = plan.segment(0, index)
        fused = _decoded(EncodeAndBatch(config)(read_segment(spec, reader)))
        apart = _decoded(BatchSamples(config)(EncodeSamples(config)(read_segment(spec, reader))))
        _same(fused, apart)
        # a segment read in the same process goes to the stage as read (never serialized): same block
        _same(_decoded(EncodeAndBatch(config).segment(reader(spec))), fused)
        kinds = [row[0] for row in fused]
        assert kinds[-1] == rows.REPORT and rows.ITEM in kinds
        # the encode stage's runs come first in the report, as Energon's pipeline order
        assert [stage for stage, _, _ in fused[-1][4][2]] == ["read", "load", "cook_crude_sample", "encode_sample", "batch", "encode_batch"]
