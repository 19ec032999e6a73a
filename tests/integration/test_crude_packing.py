"""Crude datasets with cookers (tar and JSONL), text packing, grouping and their bad input, on Ray."""

from __future__ import annotations

import json

import pytest
import yaml

import energon_ray as er
from energon_ray.format.jsonl import prepare_jsonl
from energon_ray.format.prepare import prepare_dataset
from energon_ray.synthetic import write_shards
from energon_ray.tasks.text_packing import TextPackingTaskEncoder, lognormal_corpus
from tests.helpers import prefixed_text_dataset

WC = er.WorkerConfig(rank=0, world_size=1, num_workers=2)


@pytest.fixture(scope="module")
def crude(tmp_path_factory):
    """A crude tar dataset (txt + json parts) with subflavors {kind: doc}."""
    root = tmp_path_factory.mktemp("crude") / "ds"
    samples = [(f"doc_{i:04d}", {"txt": f"text {i}".encode(), "json": json.dumps({"n": i}).encode()}) for i in range(24)]
    write_shards(root / "shards", samples, 8)
    prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="CrudeWebdataset", progress=False)
    spec = root / ".nv-meta" / "dataset.yaml"
    data = yaml.safe_load(spec.read_text())
    data["subflavors"] = {"kind": "doc"}
    spec.write_text(yaml.safe_dump(data))
    return root


def cook_doc(sample):
    return er.TextSample(**er.basic_sample_keys(sample), text=f"{sample['txt']}#{sample['json']['n']}")


def cook_other(sample):
    raise AssertionError("the cooker for other subflavors must not run")


class Cooking(er.DefaultTaskEncoder):
    cookers = [er.Cooker(cook_other, has_subflavors={"kind": "image"}), er.Cooker(cook_doc, has_subflavors={"kind": "doc"})]


def test_first_matching_cooker_cooks_crude_samples(crude):
    """The first cooker whose subflavors match cooks each crude sample (decoded parts, meta kept)."""
    samples = list(er.get_loader(er.get_val_dataset(crude, split_part="train", batch_size=None, worker_config=WC, task_encoder=Cooking())))
    assert len(samples) == 24 and all(isinstance(s, er.TextSample) for s in samples)
    by_key = {s.__key__: s for s in samples}
    assert by_key["doc_0005"].text == "text 5#5" and by_key["doc_0005"].__subflavors__ == {"kind": "doc"}


def test_crude_without_cookers_and_no_matching_cooker(crude):
    """No cookers at all, or cookers none of which matches the dataset's subflavors: refused before
    Ray runs (Energon refuses the latter when it builds the dataset), not each sample skipped."""
    with pytest.raises(er.DatasetConfigError, match="crude dataset .* needs a task encoder with `cookers`"):
        er.get_val_dataset(crude, split_part="train", batch_size=2, task_encoder=er.DefaultTaskEncoder())

    class NoMatch(er.DefaultTaskEncoder):
        cookers = [er.Cooker(cook_other, has_subflavors={"kind": "image"})]

    with pytest.raises(er.DatasetConfigError, match=r"no cooker of NoMatch matches the crude dataset's subflavors \{'kind': 'doc'\}"):
        er.get_val_dataset(crude, split_part="train", batch_size=2, worker_config=WC, task_encoder=NoMatch())


def test_jsonl_dataset_packs_documents(tmp_path):
    """A .jsonl corpus, prepared with its .jsonl.idx, cooked, tokenized and packed into full rows."""
    path = tmp_path / "corpus.jsonl"
    docs = lognormal_corpus(600, mean_words=40, seed=3, max_words=250)
    path.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    assert prepare_jsonl(path, progress=False) == 600
    encoder = TextPackingTaskEncoder(max_length=256)
    loader = er.get_loader(
        er.get_val_dataset(path, batch_size=4, worker_config=WC, packing_buffer_size=200, task_encoder=encoder)
    )
    batches = list(loader)
    seen = [d for b in batches for row in b.documents for d in row]
    assert sorted(seen, key=int) == [str(i) for i in range(600)]
    tokens = sum(int(b.num_tokens.sum()) for b in batches)
    rows = sum(b.input_ids.shape[0] for b in batches)
    assert tokens == sum(min(len(encoder.tokenizer.encode(d)), 256) for d in docs)
    assert tokens / (rows * 256) >= 0.97
    first = batches[0]
    row = 0
    ends = first.cu_seqlens[row].tolist()
    assert first.position_ids[row, ends[0] : ends[1]].tolist() == list(range(ends[1] - ends[0]))
    assert first.labels[row, ends[1] - 1] == -100 and (first.document_ids[row, ends[-1] :] == 0).all()


class BadPack(er.DefaultTaskEncoder):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode

    def select_samples_to_pack(self, samples):
        if self.mode == "twice":
            return [[samples[0], samples[0]]]
        if self.mode == "none":
            return None
        if self.mode == "flat":
            return samples
        if self.mode == "indexes":
            return [[0, 1], [2, 3]]
        return [[er.TextSample(__key__="stranger", text="x")]]

    def pack_selected_samples(self, samples):
        return samples[0]


@pytest.mark.parametrize(
    "mode,message",
    [
        ("twice", r"returned sample 't_000000' twice"),
        ("foreign", r"returned sample 'stranger', which is not from the buffer"),
        ("none", r"must return a list of packs \(each a list of samples from the buffer\), got None \(NoneType\)"),
        ("flat", r"must return a pack \(a list of samples from the buffer\), got a TextSample \('t_000000'\)"),
        ("indexes", r"returned 0 \(int\), which is not a sample from the buffer \(return the samples themselves, not their indexes\)"),
    ],
)
def test_bad_pack_selection_is_named(tmp_path, mode, message):
    """select_samples_to_pack returning a sample twice, a foreign sample, None, a flat list of samples
    or indexes fails with the hook, the keys and what it returned (not a TypeError in Ray)."""
    path = prefixed_text_dataset(tmp_path / "t", "t", 12)
    loader = er.get_loader(er.get_val_dataset(path, split_part="train", batch_size=2, worker_config=WC, packing_buffer_size=4, task_encoder=BadPack(mode)))
    with pytest.raises(er.FatalSampleError, match=r"select_samples_to_pack on 4 samples starting at 't_000000'.*" + message):
        list(loader)


class SizedGroups(er.DefaultTaskEncoder):
    def batch_group_criterion(self, sample):
        return len(sample.text), 3


def test_group_criterion_size_with_global_batch_size_is_an_error(tmp_path):
    """A criterion returning a bucket size while batch_size is set is rejected, naming both."""
    path = prefixed_text_dataset(tmp_path / "t", "t", 12)
    loader = er.get_loader(er.get_val_dataset(path, split_part="train", batch_size=4, worker_config=WC, task_encoder=SizedGroups()))
    with pytest.raises(er.FatalSampleError, match=r"returned batch size 3 for bucket 1, but get_\*_dataset\(batch_size=4\) is set"):
        list(loader)
    ok = er.get_loader(er.get_val_dataset(path, split_part="train", batch_size=None, worker_config=WC, task_encoder=SizedGroups()))
    batches = list(ok)
    assert sorted(len(b.text) for b in batches) == [1, 2, 3, 3, 3] and all(len({len(t) for t in b.text}) == 1 for b in batches)


def test_packed_training_is_deterministic(tmp_path):
    """A packed, shuffled training pipeline gives identical packs twice (order is a function of seed and config)."""
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps({"text": d}) for d in lognormal_corpus(300, mean_words=30, seed=5)) + "\n")
    prepare_jsonl(path, progress=False)

    def run():
        loader = er.get_loader(
            er.get_train_dataset(path, batch_size=2, worker_config=WC, shuffle_buffer_size=20, max_samples_per_sequence=10,
                                 packing_buffer_size=50, task_encoder=TextPackingTaskEncoder(max_length=128), repeat=False)  # fmt: skip
        )
        return [(b.documents, b.input_ids.sum().item()) for b in loader]

    first = run()
    assert first == run()
    assert sorted(d for docs, _ in first for row in docs for d in row) == sorted(str(i) for i in range(300))
