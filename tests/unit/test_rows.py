"""The row tables segment tasks return: built without pandas, shipped out of band by plain tasks."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest
import torch

from energon_ray.errors import FatalSampleError
from energon_ray.pipeline import rows, serde
from energon_ray.plan.stream import SegmentSpec


def _sample_rows():
    batch = {"image": torch.arange(3 * 64 * 64, dtype=torch.float32).reshape(3, 64, 64), "ids": torch.tensor([4, 5])}
    return [(rows.ITEM, 1, 2, 0, batch), (rows.LEFTOVER, 1, 2, 1, [b"x"]), (rows.REPORT, 1, 2, 2, {"done": True})]


def test_table_columns_equal_arrow_built_from_python_values():
    table = rows.table(_sample_rows(), source=3, positions=[[7, 8, 9], None, []])
    table.validate(full=True)
    expected = {
        "kind": [rows.ITEM, rows.LEFTOVER, rows.REPORT],
        "worker": [1, 1, 1],
        "segment": [2, 2, 2],
        "seq": [0, 1, 2],
        "source": [3, 3, 3],
        "positions": [[7, 8, 9], None, []],
    }
    for name, values in expected.items():
        assert table.column(name).to_pylist() == values, name
        assert table.column(name).type == rows.SCHEMA.field(name).type, name
    assert table.column("positions").null_count == 1
    payloads = [serde.loads(p) for *_, p in rows.iter_rows(table)]
    assert torch.equal(payloads[0]["image"], _sample_rows()[0][4]["image"])
    assert payloads[1:] == [[b"x"], {"done": True}]


def test_empty_table_has_the_schema():
    table = rows.table([], source=0)
    table.validate(full=True)
    assert table.num_rows == 0 and table.schema == rows.SCHEMA


def test_building_and_reading_a_table_never_imports_pandas():
    # pa.array of Python values imports pandas: 0.2-0.9 s at a fresh Ray worker's first segment
    code = (
        "import sys, torch\n"
        "import energon_ray.pipeline.stages\n"
        "from energon_ray.pipeline import rows\n"
        "t = rows.table([(rows.ITEM, 0, 0, 0, {'x': torch.zeros(9000)}), (rows.REPORT, 0, 0, 1, None)], positions=[[1], None])\n"
        "from energon_ray.pipeline import serde\n"
        "assert t.schema == rows.SPLIT_SCHEMA and serde.loads(next(rows.iter_rows(t))[4], copy=False)['x'].shape == (9000,)\n"
        "print('pandas' in sys.modules, 'pyarrow.compute' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_table_parts_pickle_every_buffer_out_of_band_and_unpickle_to_the_table():
    table = rows.table(_sample_rows(), source=1, positions=[[1, 2], None, None])
    buffers = []
    data = pickle.dumps(rows.parts(table), protocol=5, buffer_callback=buffers.append)
    assert len(data) < 4096 < table.nbytes  # the payloads and tensors are not in the pickle stream
    views = [memoryview(bytearray(b.raw())) for b in buffers]
    restored = pickle.loads(data, buffers=views)
    assert isinstance(restored, pa.Table) and restored.equals(table)
    # zero copy: the payload bytes and the tensors are read where the buffers lie (Ray's object store)
    starts = [np.frombuffer(v, dtype=np.uint8).ctypes.data for v in views]

    def mapped(address):
        return any(start <= address < start + len(v) for start, v in zip(starts, views))

    assert mapped(restored.column("payload").chunk(0).buffers()[2].address)
    image = serde.loads(next(rows.iter_rows(restored))[4], copy=False)["image"]
    assert mapped(image.data_ptr()) and torch.equal(image, _sample_rows()[0][4]["image"])
    assert rows.parts(None) is None


def test_a_rows_large_tensors_stay_in_their_own_memory_until_ray_copies_them():
    image = torch.rand(3, 64, 64)
    table = rows.table([(rows.ITEM, 0, 0, 0, {"image": image, "small": torch.arange(4)}), (rows.REPORT, 0, 0, 1, None)])
    table.validate(full=True)
    assert table.schema == rows.SPLIT_SCHEMA
    (_, buffer), = [(0, b) for b in table.column("buffers").chunk(0).values.buffers()[2:]]
    assert buffer.address == image.data_ptr()  # wrapped, not copied
    first, second = (row[4] for row in rows.iter_rows(table))
    assert type(first) is serde.Parts and type(second) is pa.Buffer
    loaded = serde.loads(first, copy=False)
    assert loaded["image"].data_ptr() == image.data_ptr() and loaded["small"].tolist() == [0, 1, 2, 3]
    copied = serde.loads(first)
    assert copied["image"].data_ptr() != image.data_ptr() and torch.equal(copied["image"], image)
    before = image.clone()
    copied["image"].add_(1)  # a copied load owns its memory: writable, and the source stays as it was
    assert torch.equal(image, before) and torch.equal(copied["image"], before + 1)


def test_a_block_without_large_tensors_keeps_the_plain_schema():
    table = rows.table([(rows.ITEM, 0, 0, 0, {"ids": torch.arange(8)}), (rows.REPORT, 0, 0, 1, {"done": True})])
    assert table.schema == rows.SCHEMA and rows.contiguous(table) is table


def test_contiguous_puts_each_payload_in_one_buffer_with_the_same_values():
    table = rows.table(_sample_rows(), source=2, positions=[[5, 6], None, None])
    joined = rows.contiguous(table)
    joined.validate(full=True)
    assert joined.schema == rows.SCHEMA
    assert [r[:4] for r in rows.iter_rows(joined)] == [r[:4] for r in rows.iter_rows(table)]
    assert all(type(r[4]) is pa.Buffer for r in rows.iter_rows(joined))
    loaded = [serde.loads(r[4]) for r in rows.iter_rows(joined)]
    assert torch.equal(loaded[0]["image"], _sample_rows()[0][4]["image"]) and loaded[1:] == [[b"x"], {"done": True}]
    assert rows.positions(joined) == [[5, 6], None, None] and rows.sources(joined) == [2, 2, 2]


def test_buffers_of_every_size_and_sliced_blocks_read_back():
    # nested payloads travel out of band too: sizes of 0 and up to 12 bytes are held in their view
    nested = [serde.dumps(b"") , pa.py_buffer(b""), pa.py_buffer(b"abc"), pa.py_buffer(bytes(range(12))), pa.py_buffer(bytes(range(13)))]
    items = [(rows.ITEM, 0, 0, i, {"t": torch.full((5000,), float(i)), "nested": nested[i]}) for i in range(5)]
    table = rows.table(items + [(rows.REPORT, 0, 0, 5, None)])
    table.validate(full=True)
    for start in range(4):
        part = table.slice(start, 3)
        for kind, _, _, seq, payload in rows.iter_rows(part):
            value = serde.loads(payload, copy=False)
            if kind == rows.ITEM:
                assert value["t"].tolist() == [float(seq)] * 5000
                assert bytes(value["nested"]) == bytes(nested[seq])


def test_a_buffer_too_large_for_a_view_is_joined_into_its_payload(monkeypatch):
    monkeypatch.setattr(rows, "_VIEW_MAX", 30000)
    table = rows.table([(rows.ITEM, 0, 0, 0, {"a": torch.zeros(5000)}), (rows.ITEM, 0, 0, 1, {"a": torch.ones(10000)})])
    first, second = (row[4] for row in rows.iter_rows(table))
    assert type(first) is serde.Parts and type(second) is pa.Buffer
    assert serde.loads(second)["a"].tolist() == [1.0] * 10000



def test_with_an_arrow_older_than_19_each_payload_stays_in_one_buffer(monkeypatch):
    # pyarrow 16-18 refuse a binary_view array's data buffers in Array.from_buffers
    monkeypatch.setattr(rows, "SPLIT_PAYLOADS", False)
    table = rows.table(_sample_rows(), source=1)
    assert table.schema == rows.SCHEMA and all(type(r[4]) is pa.Buffer for r in rows.iter_rows(table))
    assert torch.equal(serde.loads(next(rows.iter_rows(table))[4])["image"], _sample_rows()[0][4]["image"])


@dataclasses.dataclass
class _Batch:
    __key__: list
    lock: list


def test_a_payload_that_does_not_pickle_names_its_sample_key_and_field():
    """A hook result that cannot be sent names the sample (a batch: its first sample) and the field."""
    tail = "that cannot be sent to the driver: field 'lock': TypeError: cannot pickle '_thread.lock' object."
    sample = {"__key__": "s_2", "text": "ok", "lock": threading.Lock()}
    with pytest.raises(FatalSampleError) as info:
        rows.table([(rows.ITEM, 0, 0, 2, sample)])
    assert f"a hook returned a dict (sample 's_2', batch/sample 2 of segment 0 of worker stream 0) {tail}" in str(info.value)
    batch = _Batch(["s_4", "s_5"], [None, threading.Lock()])
    with pytest.raises(FatalSampleError) as info:
        rows.table([(rows.ITEM, 1, 3, 1, batch)])
    assert f"a hook returned a _Batch (batch of 2 starting at sample 's_4', batch/sample 1 of segment 3 of worker stream 1) {tail}" in str(
        info.value
    )
    with pytest.raises(FatalSampleError) as info:  # a leftover sample
        rows.pack_leftovers([(None, 4, [(9, 0, sample)])], 0, 5)
    assert f"a hook returned a dict (sample 's_2', leftover samples 9 of segment 5 of worker stream 0) {tail}" in str(info.value)
    spec = SegmentSpec(worker=1, global_worker=1, seed=0, index=7, start=0, samples=np.arange(2), last=True)
    data = rows.SegmentData(spec, encoded=[(0, 0, {"__key__": "s_0"}), (1, 0, sample)])
    with pytest.raises(FatalSampleError) as info:  # an encoded segment: the sample in it
        rows.table([(rows.SEGMENT, 1, 7, 0, data)])
    assert f"a hook returned a dict (sample 's_2', segment 7 of worker stream 1) {tail}" in str(info.value)


def test_concat_keeps_each_blocks_rows_sources_and_tensor_memory():
    """A group task's block (``rows.concat``): its segments' blocks one after another, a block
    without a ``buffers`` column given empty ones, no tensor copied; pickled as a task returns it."""
    image = torch.rand(3, 64, 64)  # over 16 KiB: its own buffer
    first = rows.table([(rows.ITEM, 0, 4, 0, {"image": image}), (rows.REPORT, 0, 4, 1, {"done": 0})], source=1, positions=[[8, 9], None])
    plain = rows.table([(rows.ITEM, 1, 2, 0, ["text"]), (rows.REPORT, 1, 2, 1, {"done": 1})], source=3, positions=[[5], None])
    assert plain.schema == rows.SCHEMA and first.schema == rows.SPLIT_SCHEMA
    block = rows.concat([first, plain])
    block.validate(full=True)
    assert [r[:4] for r in rows.iter_rows(block)] == [(1, 0, 4, 0), (3, 0, 4, 1), (1, 1, 2, 0), (3, 1, 2, 1)]
    assert rows.sources(block) == [1, 1, 3, 3] and rows.positions(block) == [[8, 9], None, [5], None]
    payloads = [serde.loads(r[4], copy=False) for r in rows.iter_rows(block)]
    assert payloads[0]["image"].data_ptr() == image.data_ptr()
    assert payloads[1:] == [{"done": 0}, ["text"], {"done": 1}]
    restored = pickle.loads(pickle.dumps(rows.parts(block), protocol=5))
    assert restored.equals(block)
    assert rows.concat([plain]) is plain and rows.concat([]) is None
    assert rows.concat([plain, plain]).schema == rows.SCHEMA  # no buffers column where none has one


def test_leftover_samples_keep_their_tensors_where_they_lie():
    """Each leftover sample is serialized in parts (a sample blend's samples all are): its tensor is
    wrapped, not copied into a buffer of its own, and the row loads back to the same values."""
    image = torch.rand(3, 64, 64)
    ((key, size, ((position, sub, payload),)),) = rows.pack_leftovers([("k", 1, [(7, 0, {"image": image})])], 0, 3)
    assert (key, size, position, sub) == ("k", 1, 7, 0)
    assert type(payload) is serde.Parts and payload.buffers[0].address == image.data_ptr()
    table = rows.table([(rows.LEFTOVER, 0, 3, 0, [(key, size, [(position, sub, payload)])])])
    ((_, _, ((_, _, loaded),)),) = serde.loads(next(rows.iter_rows(table))[4], copy=False)
    assert torch.equal(serde.loads(loaded)["image"], image)
