"""The row tables segment tasks return: built without pandas, shipped out of band by plain tasks."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import torch

from energon_ray.pipeline import rows, serde


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


def test_building_a_table_never_imports_pandas():
    # pa.array of Python values imports pandas: 0.2-0.9 s at a fresh Ray worker's first segment
    code = (
        "import sys, torch\n"
        "import energon_ray.pipeline.stages\n"
        "from energon_ray.pipeline import rows\n"
        "rows.table([(rows.ITEM, 0, 0, 0, {'x': torch.zeros(4)}), (rows.REPORT, 0, 0, 1, None)], positions=[[1], None])\n"
        "print('pandas' in sys.modules, 'pyarrow.compute' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_table_parts_pickle_every_buffer_out_of_band_and_unpickle_to_the_table():
    table = rows.table(_sample_rows(), source=1, positions=[[1, 2], None, None])
    buffers = []
    data = pickle.dumps(rows.parts(table), protocol=5, buffer_callback=buffers.append)
    payload_bytes = table.column("payload").nbytes
    assert len(data) < 4096 < payload_bytes  # the payloads are not in the pickle stream
    views = [memoryview(bytearray(b.raw())) for b in buffers]
    restored = pickle.loads(data, buffers=views)
    assert isinstance(restored, pa.Table) and restored.equals(table)
    # zero copy: the payload bytes are read where the buffers lie (Ray's object store in a task)
    address = restored.column("payload").chunk(0).buffers()[2].address
    starts = [np.frombuffer(v, dtype=np.uint8).ctypes.data for v in views]
    assert any(start <= address < start + len(v) for start, v in zip(starts, views))
    assert rows.parts(None) is None
