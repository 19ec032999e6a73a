"""Runs one training loader and records what it yields; used in-process and in subprocesses.

``python -m tests.integration.determinism_probe MODE DATASET OUT.json`` starts its own Ray:
``local1`` (a private 1-CPU local Ray: ``record``) or ``cluster2`` (a 2-node
``ray.cluster_utils.Cluster``: ``record``, then ``node_loss`` in the same cluster, under the key
``"node_loss"``; one cluster start for both, the slowest set-up of the suite).
"""

from __future__ import annotations

import json
import sys
import time

import torch

import energon_ray as er


class NoisyEncoder(er.DefaultTaskEncoder):
    """Random flip and noise in encode_sample, random scale in encode_batch: RNG use everywhere."""

    def encode_sample(self, sample):
        image = sample.image
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        sample.image = image + 0.01 * torch.randn_like(image)
        return sample

    def encode_batch(self, batch):
        batch.image = batch.image * (1 + torch.rand(()))
        return batch


class PackPairs(er.DefaultTaskEncoder):
    """Packs captions two by two (shortest with longest), so packs depend on the buffer's content."""

    def select_samples_to_pack(self, samples):
        order = sorted(samples, key=lambda s: (len(s.caption), s.__key__))
        return [[order[i], order[-1 - i]] for i in range(len(order) // 2)]

    def pack_selected_samples(self, samples):
        return er.TextSample.derive_from(samples[0], __key__="+".join(s.__key__ for s in samples), text=" ".join(s.caption for s in samples))


class GroupByIndex(er.DefaultTaskEncoder):
    def batch_group_criterion(self, sample):
        return int(sample.__key__[-6:]) % 3, None


def _keys(dataset, batches: int) -> list:
    loader = er.get_loader(dataset)
    it = iter(loader)
    out = [list(next(it).__key__) for _ in range(batches)]
    loader.close()
    return out


def record(path: str, batches: int = 12) -> dict:
    """Keys and image checksums of the first ``batches`` batches of a seeded training loader."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=3, seed_offset=7)
    dataset = er.get_train_dataset(
        path, worker_config=wc, batch_size=5, shuffle_buffer_size=9, max_samples_per_sequence=4, task_encoder=NoisyEncoder()
    )
    loader = er.get_loader(dataset)
    out = {"keys": [], "sums": []}
    it = iter(loader)
    for _ in range(batches):
        batch = next(it)
        out["keys"].append(list(batch.__key__))
        out["sums"].append(round(float(batch.image.double().sum()), 6))
    # Where segments run: read on until both nodes ran some. Bounded in time, not in batches: on a
    # loaded 2-core machine the worker node's first worker can take many seconds to start while the
    # head's warm worker streams hundreds of batches of these 40 samples.
    import ray

    nodes = len([n for n in ray.nodes() if n["Alive"]])
    deadline = time.monotonic() + 180
    while len(loader.stats.segments_per_node) < nodes and time.monotonic() < deadline:
        next(it)
    out["nodes"] = len(loader.stats.segments_per_node)
    loader.close()
    common = dict(worker_config=wc, shuffle_buffer_size=9, max_samples_per_sequence=4)
    out["packed"] = _keys(er.get_train_dataset(path, batch_size=2, packing_buffer_size=6, task_encoder=PackPairs(), **common), 8)
    out["grouped"] = _keys(er.get_train_dataset(path, batch_size=3, task_encoder=GroupByIndex(), **common), 8)
    # short first segments, longer ones after (the default layout, scaled down to this dataset)
    out["layout"] = _keys(er.get_train_dataset(path, batch_size=2, samples_per_segment=(2, 6), task_encoder=NoisyEncoder(), **common), 12)
    # a blend's leaves: one-batch segments, several (of both leaves and all worker streams) to a task
    leaves = [er.get_train_dataset(path, batch_size=2, task_encoder=NoisyEncoder(), **common) for _ in range(2)]
    out["blended"] = _keys(er.BlendDataset((leaves[0], 0.7), (leaves[1], 0.3)), 12)
    return out


def node_loss(path: str, cluster) -> dict:
    """Iterate until segments ran on both nodes, remove the worker node (no grace), read on; then
    save, restore into a new loader and compare. The reference is an undisturbed loader."""
    import ray

    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2, seed_offset=3)

    def build():
        return er.get_train_dataset(path, worker_config=wc, batch_size=4, shuffle_buffer_size=7, samples_per_segment=4)

    loader = er.get_savable_loader(build())
    it = iter(loader)
    keys = []
    while len(loader.stats.segments_per_node) < 2 and len(keys) < 200:
        keys.append(list(next(it).__key__))
    both_nodes = len(loader.stats.segments_per_node) == 2
    two_node_state, two_node_at = loader.save_state_rank().to_json(), len(keys)  # saved on 2 nodes
    head = ray.get_runtime_context().get_node_id()
    for node in list(cluster.worker_nodes):
        cluster.remove_node(node, allow_graceful=False)
    for _ in range(300):  # the GCS marks the node dead after its heartbeat times out
        alive = len([n for n in ray.nodes() if n["Alive"]])
        if alive == 1:
            break
        time.sleep(0.1)
    keys += [list(next(it).__key__) for _ in range(30)]
    state = loader.save_state_rank().to_json()
    after = [list(next(it).__key__) for _ in range(10)]
    loader.close()
    restored = er.get_savable_loader(build())
    restored.restore_state_rank(state)
    it = iter(restored)
    again = [list(next(it).__key__) for _ in range(10)]
    restored.close()
    moved = er.get_savable_loader(build())  # the state saved on 2 nodes, restored on the 1 left
    moved.restore_state_rank(two_node_state)
    it = iter(moved)
    from_two_nodes = [list(next(it).__key__) for _ in range(10)]
    moved.close()
    reference = er.get_loader(build())
    it = iter(reference)
    expected = [list(next(it).__key__) for _ in range(len(keys) + 10)]
    reference.close()
    return {"both_nodes": both_nodes, "alive_after": alive, "head": bool(head), "same": keys + after == expected,
            "restored_same": again == after, "batches": len(keys),
            "two_node_state_same": from_two_nodes == expected[two_node_at : two_node_at + 10]}  # fmt: skip


def main(mode: str, path: str, out: str) -> None:
    import ray

    cluster = None
    if mode == "local1":
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    elif mode == "cluster2":
        from ray.cluster_utils import Cluster

        # the GCS marks a node dead after health_check_failure_threshold missed checks, one per
        # health_check_period_ms (Ray's defaults: 5 x 3 s; here 4 x 1 s: node-loss needs no 15 s wait)
        fast_checks = {"health_check_period_ms": 1000, "health_check_failure_threshold": 4}
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": fast_checks})
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        if len([n for n in ray.nodes() if n["Alive"]]) != 2:
            raise RuntimeError("the test cluster did not come up with 2 nodes")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    try:
        result = record(path)
        if cluster is not None:  # last: it removes the worker node
            result["node_loss"] = node_loss(path, cluster)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
