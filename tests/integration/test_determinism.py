"""Ray parallelism changes speed, never the batches: 1 CPU, 2 CPUs and 2 nodes agree exactly, and
losing a node mid-epoch loses and repeats nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import captioning_dataset
from tests.integration.determinism_probe import record

ROOT = Path(__file__).resolve().parents[2]


def test_same_batches_on_1_cpu_2_cpus_and_2_nodes_and_after_losing_a_node(tmp_path):
    """Keys and (augmented) pixel sums of the first 12 batches, and packed, grouped, short-then-long
    segmented and blended (grouped segments) pipelines' keys, are identical on three Ray layouts; on the 2-node cluster segments ran
    on both nodes. Then, in that cluster (one cluster start for both), the worker node is removed
    without grace mid-epoch: the keys equal an undisturbed run's, a state saved afterwards restores,
    and a state saved while both nodes ran segments restores on the one node left."""
    path = str(captioning_dataset(tmp_path / "ds", n=40, per_shard=6))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAY_ADDRESS", None)
    procs = {
        mode: subprocess.Popen(
            [sys.executable, "-m", "tests.integration.determinism_probe", mode, path, str(tmp_path / f"{mode}.json")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for mode in ("local1", "cluster2")
    }
    in_process = record(path)  # the session's 2-CPU Ray
    results = {}
    for mode, proc in procs.items():
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{mode} probe failed:\n{output.decode()[-4000:]}"
        results[mode] = json.loads((tmp_path / f"{mode}.json").read_text())
    assert len(in_process["keys"]) == 12 and all(len(k) == 5 for k in in_process["keys"])
    assert all("+" in k for b in in_process["packed"] for k in b) and len(in_process["grouped"]) == 8
    assert all(len({int(k[-6:]) % 3 for k in b}) == 1 for b in in_process["grouped"])
    assert len(in_process["layout"]) == 12 and all(len(b) == 2 for b in in_process["layout"])
    assert len(in_process["blended"]) == 12 and all(len(b) == 2 for b in in_process["blended"])
    assert in_process.pop("nodes") == 1 and results["local1"].pop("nodes") == 1
    assert results["cluster2"].pop("nodes") == 2
    lost = results["cluster2"].pop("node_loss")
    assert lost["both_nodes"] and lost["alive_after"] == 1
    assert lost["same"] and lost["restored_same"]
    assert lost["two_node_state_same"]  # a state saved on 2 nodes restores on 1 node: same batches
    assert results["local1"] == in_process
    assert results["cluster2"] == in_process
