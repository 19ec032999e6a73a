"""``join:`` metadatasets against megatron-energon on the same prepared datasets (validation order)."""

from __future__ import annotations

import pytest

import energon_ray as er
from tests.integration.test_join import PRIMARY_KEYS, SECONDARY_KEYS, _text_dataset

pytest.importorskip("megatron.energon")
pytestmark = pytest.mark.parity

_JOINER = "    joiner:\n      __module__: megatron.energon\n      __class__: TextSample\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("join_parity")
    _text_dataset(root / "primary", PRIMARY_KEYS, "p", 7)
    _text_dataset(root / "secondary", SECONDARY_KEYS, "s", 4)
    return root


def _keys_and_texts(lib, path, workers):
    wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=workers)
    ds = lib.get_val_dataset(path, split_part="train", worker_config=wc, batch_size=None)
    loader = lib.get_loader(ds)
    try:
        return len(ds), [(s.__key__, s.text) for s in loader]
    finally:
        if lib is er:
            loader.close()


@pytest.mark.parametrize("subset,rows", [("[2, 8]", [4, 6, 8, 10, 12, 14]), ("[1, end]", list(range(2, 20, 2))),
                                         ("[10%, 60%]", [2, 4, 6, 8, 10])])  # fmt: skip
def test_subset_on_a_join_node_matches_energon(root, subset, rows):
    """A join is a leaf: a subset on its node, absolute ones included, cuts its joined rows (after nonmatch
    skip) as Energon's; an absolute range was refused as 'only for a leaf dataset' before."""
    import megatron.energon as me
    from megatron.energon.epathlib import EPath

    path = root / f"subset_{len(rows)}.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
        f"    subset: {{range: {subset}}}\n    join:\n      - path: {root / 'primary'}\n"
        f"      - path: {root / 'secondary'}\n        nonmatch: skip\n" + _JOINER
    )
    me.prepare_metadataset(EPath(path))
    theirs = _keys_and_texts(me, path, 2)
    ours = _keys_and_texts(er, path, 2)
    assert ours == theirs
    assert sorted(ours[1]) == [(f"s_{i:03d}", f"s:s_{i:03d}") for i in rows] and ours[0] == len(rows)
