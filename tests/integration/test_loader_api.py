"""The public loader API: the documents' example as written, pinning, Ray-native access, defaults."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import List

import numpy as np
import pytest
import torch

import energon_ray as er
from energon_ray import CaptioningSample, DefaultTaskEncoder, batch_list, batch_stack
from tests.helpers import captioning_dataset, keys_of


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return captioning_dataset(tmp_path_factory.mktemp("api") / "ds", n=40, per_shard=8)


# The documents' task encoder, with only the import changed (and a tokenizer that needs no download).
@dataclass
class CaptioningRawBatch:
    __key__: List[str]
    image: torch.Tensor
    caption: List[str]


@dataclass
class CaptioningBatch:
    __keys__: List[str]
    images: torch.Tensor
    text_tokens: torch.Tensor
    text_attn_mask: torch.Tensor


class WordTokenizer:
    def __call__(self, texts):
        ids = [[len(w) for w in t.split()] for t in texts]
        width = max(len(i) for i in ids)
        out = torch.zeros(len(ids), width, dtype=torch.long)
        for row, i in enumerate(ids):
            out[row, : len(i)] = torch.tensor(i)
        return {"input_ids": out, "attention_mask": (out > 0).long()}


class CaptioningTaskEncoder(DefaultTaskEncoder[CaptioningSample, CaptioningSample, CaptioningRawBatch, CaptioningBatch]):
    def __init__(self, tokenizer, image_transform=None, max_length: int = 128):
        super().__init__(batch_type=CaptioningRawBatch)
        self.tokenizer = tokenizer
        self.image_transform = image_transform
        self.max_length = max_length

    def encode_sample(self, sample: CaptioningSample) -> CaptioningSample:
        sample.image = self.image_transform(sample.image)
        return sample

    def batch(self, samples: List[CaptioningSample]) -> CaptioningRawBatch:
        return self._batch(samples, result_type=CaptioningRawBatch, actions={"image": batch_stack, "caption": batch_list})

    def encode_batch(self, batch_data: CaptioningRawBatch) -> CaptioningBatch:
        tokenized = self.tokenizer(batch_data.caption)
        return CaptioningBatch(
            __keys__=batch_data.__key__,
            images=batch_data.image,
            text_tokens=tokenized["input_ids"],
            text_attn_mask=tokenized["attention_mask"],
        )


def crop_and_flip(image: torch.Tensor) -> torch.Tensor:
    image = image[:, :32, :32]
    return image.flip(-1) if torch.rand(()) < 0.5 else image


def test_documents_example_runs_as_written(ds_path):
    """The docs' get_train_dataset call (no worker_config, legacy image_decode) yields CaptioningBatches."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = er.get_loader(
            er.get_train_dataset(
                ds_path,
                batch_size=4,
                shuffle_buffer_size=100,
                max_samples_per_sequence=100,
                task_encoder=CaptioningTaskEncoder(tokenizer=WordTokenizer(), image_transform=crop_and_flip),
                image_decode="torchrgb",
            )
        )
    assert any(issubclass(w.category, FutureWarning) and "image_decode" in str(w.message) for w in caught)
    assert loader.dataset.worker_config.config() == {"rank": 0, "world_size": 1, "num_workers": 4, "data_parallel_group": None}  # Energon's form
    it = iter(loader)
    batch = next(it)
    assert isinstance(batch, CaptioningBatch)
    assert batch.images.shape == (4, 3, 32, 32) and batch.images.dtype == torch.float32
    assert batch.text_tokens.shape[0] == 4 and batch.text_attn_mask.shape == batch.text_tokens.shape
    assert len(batch.__keys__) == 4 and all(k.startswith("sample_") for k in batch.__keys__)
    loader.close()


def test_legacy_auto_decode_false_gives_raw_bytes(ds_path):
    """auto_decode=False (deprecated) leaves the parts as bytes."""
    with pytest.warns(FutureWarning):
        ds = er.get_val_dataset(ds_path, split_part="train", batch_size=None, auto_decode=False)
    sample = next(iter(er.get_loader(ds)))
    assert isinstance(sample.image, bytes) and sample.image[:2] == b"\xff\xd8"
    assert isinstance(sample.caption, bytes)


class RawDecoderEncoder(DefaultTaskEncoder):
    decoder = None


def test_decoder_none_gives_bytes_and_image_modes_apply(ds_path):
    """decoder=None on the task encoder gives bytes; SampleDecoder(image_decode='rgb8') gives uint8 HWC."""
    sample = next(iter(er.get_loader(er.get_val_dataset(ds_path, split_part="train", batch_size=None, task_encoder=RawDecoderEncoder()))))
    assert isinstance(sample.image, bytes)

    class Rgb8(DefaultTaskEncoder):
        decoder = er.SampleDecoder(image_decode="rgb8")

    sample = next(iter(er.get_loader(er.get_val_dataset(ds_path, split_part="train", batch_size=None, task_encoder=Rgb8()))))
    assert sample.image.shape == (48, 64, 3) and str(sample.image.dtype) == "uint8"


def test_batches_are_pinned_only_with_cuda_and_asking_without_cuda_explains(ds_path):
    """Batches are pinned exactly when CUDA is available (default) and never with pin_memory=False; on a
    CPU-only box asking to pin explains why it cannot."""
    loader = er.get_loader(er.get_val_dataset(ds_path, split_part="train", batch_size=4))
    batch = next(iter(loader))
    assert isinstance(batch.image, torch.Tensor) and batch.image.is_pinned() == torch.cuda.is_available()
    unpinned = er.get_loader(er.get_val_dataset(ds_path, split_part="train", batch_size=4), pin_memory=False)
    assert not next(iter(unpinned)).image.is_pinned()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
            er.get_loader(er.get_val_dataset(ds_path, split_part="train", batch_size=4), pin_memory=True)


class NumpyBatches(DefaultTaskEncoder):
    """Batches of numpy values in a dict, a tuple and a dataclass."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def encode_batch(self, batch):
        n = len(batch.__key__)
        if self.kind == "dict":
            return {"keys": batch.__key__, "arr": np.arange(n), "n": np.int64(n), "pair": (1, 2), "nested": [np.ones(2)], "s": np.array(["a"]),
                    "big": np.zeros((n, 50_000), np.float32)}  # fmt: skip
        if self.kind == "tuple":
            return (np.arange(n), tuple(batch.__key__))
        return CaptioningRawBatch(__key__=batch.__key__, image=np.zeros(1), caption=("a",))


def test_batches_reach_the_trainer_as_from_energons_loader_numpy_as_tensors_tuples_as_lists(ds_path):
    """Energon's loader (a torch DataLoader) hands out numpy arrays and scalars as tensors and tuples as
    lists inside dicts, lists and tuples, and dataclass batches as they are; ours handed out the numpy
    arrays (no tensors for the trainer) and the tuples unchanged."""
    def first(kind):
        ds = er.get_val_dataset(ds_path, split_part="train", batch_size=3, task_encoder=NumpyBatches(kind))
        return next(iter(er.get_loader(ds)))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = first("dict")
    assert list(out) == ["keys", "arr", "n", "pair", "nested", "s", "big"]
    # "big" is mapped from Ray's store (read-only to numpy, writable and private): no torch warning, writes work
    assert not [w for w in caught if "not writable" in str(w.message)]
    out["big"] += 1
    assert out["big"].sum().item() == 3 * 50_000
    assert out["keys"] == ["sample_000000", "sample_000001", "sample_000002"]
    assert isinstance(out["arr"], torch.Tensor) and out["arr"].tolist() == [0, 1, 2] and out["arr"].dtype == torch.int64
    assert isinstance(out["n"], torch.Tensor) and out["n"].item() == 3 and out["n"].dim() == 0
    assert out["pair"] == [1, 2] and isinstance(out["pair"], list)
    assert isinstance(out["nested"][0], torch.Tensor) and out["nested"][0].dtype == torch.float64
    assert isinstance(out["s"], np.ndarray)  # string arrays stay numpy, as torch leaves them
    assert out["arr"].is_pinned() == torch.cuda.is_available()
    out = first("tuple")
    assert isinstance(out, list) and isinstance(out[0], torch.Tensor) and out[1] == ["sample_000000", "sample_000001", "sample_000002"]
    out = first("dataclass")
    assert isinstance(out, CaptioningRawBatch) and isinstance(out.image, np.ndarray) and out.caption == ("a",)


def test_ray_stats_and_no_ray_native_dataset(ds_path):
    """ray_stats() reports the segment tasks (or, with the Ray Data executor, Ray Data's operators);
    there is no half-working Ray Dataset of internal rows."""
    import re

    ds = er.get_val_dataset(ds_path, split_part="train", batch_size=4, worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=2))
    loader = er.get_loader(ds)
    assert sum(len(b.__key__) for b in loader) == 40
    segments = sum(loader.stats.segments_per_node.values())
    stats = re.fullmatch(
        r"EnergonSegmentTasks: (\d+) segment tasks \(2 slots; blocks made in this process: [01]\), ([\d.]+) MiB of blocks, [\d.]+ s since the first "
        r"submit, [\d.]+ s waited for blocks, at most (\d+) tasks in flight", loader.ray_stats()
    )  # fmt: skip
    assert stats is not None, loader.ray_stats()
    assert int(stats[1]) == segments and float(stats[2]) > 0 and 1 <= int(stats[3]) <= 4
    # Ray Data has stats once its execution ended, which takes a second request for blocks (one is
    # prefetched): before, a sentence (README's print(loader.ray_stats()) printed an empty line)
    loader = er.get_loader(ds, executor="ray_data", prefetch_batches=1)
    assert loader.ray_stats() == "no pass has run yet: iterate the loader, then ray_stats() reports its Ray execution"
    assert sum(len(b.__key__) for b in loader) == 40
    assert "ReadEnergonSegments" in loader.ray_stats()
    assert not hasattr(ds, "ray_dataset") and not hasattr(loader, "ray_dataset")


def test_generator_hooks_and_exact_batches(ds_path):
    """A generator encode_sample (two outputs per sample) still gives batches of exactly batch_size."""

    class TwoViews(DefaultTaskEncoder):
        def encode_sample(self, sample):
            yield sample
            yield CaptioningSample.derive_from(sample, image=sample.image.flip(-1), caption=sample.caption + " (flipped)")

    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    batches = list(er.get_loader(er.get_val_dataset(ds_path, split_part="train", batch_size=3, worker_config=wc, task_encoder=TwoViews())))
    sizes = [len(b.__key__) for b in batches]
    assert sum(sizes) == 80 and sizes[:-1] == [3] * (len(sizes) - 1) and sizes[-1] == 80 % 3
    assert batches[0].caption[1].endswith("(flipped)") and batches[0].__key__[0] == batches[0].__key__[1]


def test_val_passes_repeat_identically_and_len(ds_path):
    """Two passes over a val loader give the same batches; len() is the number of batches."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=3)
    loader = er.get_loader(er.get_val_dataset(ds_path, split_part="train", batch_size=6, worker_config=wc))
    first, second = keys_of(loader), keys_of(loader)
    assert first == second and len(first) == len(loader)


def test_worker_config_from_ray_train_context(ds_path, monkeypatch):
    """Without worker_config, rank and world size come from ray.train's context when inside a trainer."""
    import ray.train

    class FakeContext:
        def get_world_rank(self):
            return 1

        def get_world_size(self):
            return 3

    monkeypatch.setattr(ray.train, "get_context", lambda: FakeContext())
    ds = er.get_train_dataset(ds_path, batch_size=2)
    assert (ds.worker_config.rank, ds.worker_config.world_size) == (1, 3)


def test_savable_data_loader_is_energons_class_name(ds_path):
    """SavableDataLoader(dataset, **energon options) is what get_savable_loader returns, and saves."""
    ds = er.get_val_dataset(ds_path, split_part="train", batch_size=4)
    loader = er.SavableDataLoader(ds, checkpoint_every_sec=60, n_checkpoints=2, prefetch_factor=2)
    assert isinstance(er.get_savable_loader(er.get_val_dataset(ds_path, split_part="train", batch_size=4)), er.SavableDataLoader)
    it = iter(loader)
    first = next(it)
    state = loader.save_state_rank()
    rest = [b.__key__ for b in it]
    again = er.SavableDataLoader(er.get_val_dataset(ds_path, split_part="train", batch_size=4))
    again.restore_state_rank(state)
    assert [b.__key__ for b in again] == rest and len(first.__key__) == 4
    with pytest.raises(TypeError):
        er.SavableDataLoader(ds, no_such_option=1)


@pytest.mark.parametrize("make", ["get_loader", "get_savable_loader"])
def test_a_worker_config_given_to_the_loader_warns_as_energon_at_the_callers_line(ds_path, make):
    """A worker_config passed to the loader as well (the dataset's own) is Energon's deprecated form: a
    FutureWarning pointing at the user's line; one that differs from the dataset's is refused."""
    import warnings

    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)
    ds = er.get_val_dataset(ds_path, split_part="train", batch_size=4, worker_config=wc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(er, make)(ds, worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=1))
    ours = [w for w in caught if issubclass(w.category, FutureWarning) and "worker_config" in str(w.message)]
    assert len(ours) == 1 and str(ours[0].message).endswith("() is deprecated and will have no effect.")
    assert ours[0].filename == __file__
    with pytest.raises(ValueError, match=r"worker_config .* differs from the dataset's"):
        getattr(er, make)(ds, worker_config=er.WorkerConfig(rank=0, world_size=1, num_workers=2))


def test_merge_transform_in_encode_sample_replays_with_the_seed(ds_path):
    """A task encoder warping each image with a MergeTransform (a random crop and a random mirror as
    CustomTransforms) in encode_sample: the reseeded hook draws per sample, and two loaders of the
    same config give the same crops, flips and pixels. torchvision is loaded in this process (as in a
    trainer that has it) but not in the Ray workers: such a merge needs none there."""
    from energon_ray.transforms import CustomTransform, MergeTransform
    from tests.torchvision_cpu import import_torchvision_transforms

    import_torchvision_transforms()

    class RandomCrop16(CustomTransform):
        def apply_transform(self, matrix, dst_size):
            top, left = (int(torch.randint(0, int(dst_size[i]) - 15, ())) for i in (0, 1))
            self.drawn = (top, left)
            return self.translate(-left, -top) @ matrix, np.array((16, 16)), self.drawn

    class RandomMirror(CustomTransform):
        def apply_transform(self, matrix, dst_size):
            self.drawn = bool(torch.rand(()) < 0.5)
            flip = self.translate(dst_size[1], 0) @ self.hflip() if self.drawn else np.eye(3)
            return flip @ matrix, dst_size, self.drawn

    class Augmenting(DefaultTaskEncoder):
        def __init__(self):
            super().__init__()
            self.merge = MergeTransform([RandomCrop16(), RandomMirror()])

        def encode_sample(self, sample):
            image = self.merge(sample.image)
            drawn = tuple(step.drawn for step in self.merge.transforms)
            return CaptioningSample.derive_from(sample, image=image, caption=repr(drawn))

    def batches():
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = er.get_val_dataset(ds_path, split_part="train", batch_size=5, worker_config=wc, task_encoder=Augmenting())
        return [(b.__key__, b.image, b.caption) for b in er.get_loader(ds)]

    first, second = batches(), batches()
    assert [k for k, _, _ in first] == [k for k, _, _ in second] and sum(len(k) for k, _, _ in first) == 40
    assert all(image.shape == (5, 3, 16, 16) for _, image, _ in first)
    assert all(torch.equal(a, b) for (_, a, _), (_, b, _) in zip(first, second))
    assert [c for _, _, c in first] == [c for _, _, c in second]
    drawn = [c for _, _, captions in first for c in captions]
    assert len(set(drawn)) > 20 and {"True)" in c for c in drawn} == {True, False}  # per-sample draws, both flips
