"""Task encoders: batching helpers, DefaultTaskEncoder conversions, _batch, the documented captioning
encoder, decorators, cookers and the per-call RNG/index context (no Ray)."""

from __future__ import annotations

import dataclasses
import random
import threading
from typing import Callable, Dict, List, NamedTuple, Optional

import megatron.energon as energon
import numpy as np
import pytest
import torch

import energon_ray
from energon_ray.decode.sample_decoder import SampleDecoder
from energon_ray.errors import IgnoreSample, SkipSample
from energon_ray.samples import Batch, CaptioningSample, CrudeSample, SourceInfo, TextSample, edataclass
from energon_ray.task_encoder import (
    Cooker,
    DefaultTaskEncoder,
    TaskEncoder,
    basic_sample_keys,
    batch_list,
    batch_pad_stack,
    batch_stack,
    generic_batch,
    get_stateless,
    is_overridden,
    stateless,
)
from energon_ray.task_encoder import context
from energon_ray.task_encoder.decorators import get_failure_tolerance


def _src(i: int) -> SourceInfo:
    return SourceInfo(dataset_path="/ds", index=i, shard_name="shard_0000.tar", file_names=(f"k{i}.jpg",))


def _cap(i: int, w: int = 2, **kw) -> CaptioningSample:
    return CaptioningSample(
        __key__=f"k{i}",
        __restore_key__=("Webdataset", i),
        image=torch.full((3, 2, w), float(i + 1)),
        caption=f"a caption number {i}",
        **kw,
    )


# -- batching helpers ----------------------------------------------------------------------


def test_batch_stack_stacks_along_a_new_first_dim():
    """batch_stack is torch.stack(dim=0)."""
    out = batch_stack([torch.tensor([1, 2]), torch.tensor([3, 4])])
    assert out.tolist() == [[1, 2], [3, 4]]


def test_batch_stack_rejects_different_shapes():
    """batch_stack does not pad: different shapes raise."""
    with pytest.raises(RuntimeError):
        batch_stack([torch.zeros(2), torch.zeros(3)])


def test_batch_pad_stack_zero_pads_every_dim_to_the_max():
    """batch_pad_stack pads each dimension with zeros up to the largest size, then stacks."""
    a = torch.tensor([[1, 2, 3]])
    b = torch.tensor([[4], [5]])
    out = batch_pad_stack([a, b])
    assert out.dtype == torch.int64
    assert out.tolist() == [[[1, 2, 3], [0, 0, 0]], [[4, 0, 0], [5, 0, 0]]]


def test_batch_pad_stack_of_equal_shapes_equals_stack():
    """With equal shapes batch_pad_stack gives exactly torch.stack's result."""
    xs = [torch.rand(2, 3) for _ in range(3)]
    assert torch.equal(batch_pad_stack(xs), torch.stack(xs))


def test_batch_pad_stack_keeps_dtype_of_bool_and_half_tensors():
    """Padding uses the first tensor's dtype (bool pads with False, float16 with 0)."""
    out = batch_pad_stack([torch.tensor([True]), torch.tensor([True, True])])
    assert out.dtype == torch.bool and out.tolist() == [[True, False], [True, True]]
    half = batch_pad_stack([torch.ones(1, dtype=torch.float16), torch.ones(2, dtype=torch.float16)])
    assert half.dtype == torch.float16 and half.tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_batch_list_returns_the_values_as_a_list():
    """batch_list keeps the values unchanged, as a list."""
    values = ["a", torch.zeros(1), 3]
    assert batch_list(values) == values


def test_generic_batch_pad_stacks_tensors():
    """generic_batch on tensors is batch_pad_stack."""
    out = generic_batch([torch.ones(1), torch.ones(2)])
    assert out.tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_generic_batch_lists_strings_and_numbers():
    """generic_batch on non-tensor leaves returns a list."""
    assert generic_batch(["a", "b"]) == ["a", "b"]
    assert generic_batch([1, 2]) == [1, 2]


def test_generic_batch_recurses_into_nested_dicts():
    """generic_batch batches each dict key separately, recursively."""
    out = generic_batch([{"x": torch.ones(2), "m": {"s": "a"}}, {"x": torch.zeros(2), "m": {"s": "b"}}])
    assert out["x"].tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert out["m"] == {"s": ["a", "b"]}


def test_generic_batch_recurses_into_plain_dataclasses():
    """A dataclass without from_samples becomes the same dataclass with batched fields."""

    @dataclasses.dataclass
    class Pair:
        x: torch.Tensor
        name: str

    out = generic_batch([Pair(torch.ones(1), "a"), Pair(torch.ones(3), "b")])
    assert isinstance(out, Pair)
    assert out.x.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert out.name == ["a", "b"]


def test_generic_batch_recurses_into_namedtuples():
    """A NamedTuple becomes the same NamedTuple with batched fields."""

    class Pair(NamedTuple):
        x: torch.Tensor
        name: str

    out = generic_batch([Pair(torch.ones(2), "a"), Pair(torch.zeros(2), "b")])
    assert isinstance(out, Pair)
    assert out.x.shape == (2, 2) and out.name == ["a", "b"]


def test_generic_batch_uses_from_samples_when_the_dataclass_has_it():
    """A dataclass that defines from_samples batches itself through it."""

    @dataclasses.dataclass
    class Counted:
        n: int

        @classmethod
        def from_samples(cls, samples):
            return cls(n=sum(s.n for s in samples))

    assert generic_batch([Counted(1), Counted(2), Counted(4)]) == Counted(7)


def test_generic_batch_of_sample_dataclasses_keeps_the_type():
    """generic_batch of CaptioningSamples is a CaptioningSample with stacked image and listed captions."""
    out = generic_batch([_cap(0), _cap(1)])
    assert isinstance(out, CaptioningSample)
    assert out.image.shape == (2, 3, 2, 2)
    assert out.caption == ["a caption number 0", "a caption number 1"]
    assert out.__key__ == ["k0", "k1"]


# -- DefaultTaskEncoder --------------------------------------------------------------------


@dataclasses.dataclass
class ImageCaption:
    image: torch.Tensor
    caption: str


class CaptionOnly(NamedTuple):
    caption: str
    extra: int = 7


def test_default_task_encoder_hooks_are_identities_without_types():
    """Without target types encode_sample and encode_batch return their input unchanged."""
    te = DefaultTaskEncoder()
    s = _cap(0)
    assert te.encode_sample(s) is s
    b = te.batch([s])
    assert te.encode_batch(b) is b


def test_encoded_sample_type_dataclass_keeps_only_its_fields():
    """encoded_sample_type=<dataclass> maps the sample onto it by field name."""
    out = DefaultTaskEncoder(encoded_sample_type=ImageCaption).encode_sample(_cap(2))
    assert isinstance(out, ImageCaption)
    assert out.caption == "a caption number 2" and out.image.shape == (3, 2, 2)


def test_encoded_sample_type_namedtuple_uses_defaults_for_missing_fields():
    """encoded_sample_type=<NamedTuple> takes matching fields and the NamedTuple's defaults for the rest."""
    out = DefaultTaskEncoder(encoded_sample_type=CaptionOnly).encode_sample(_cap(1))
    assert out == CaptionOnly(caption="a caption number 1", extra=7)


def test_encoded_sample_type_dict_gives_all_fields():
    """encoded_sample_type=dict returns a dict of every field, meta fields included."""
    out = DefaultTaskEncoder(encoded_sample_type=dict).encode_sample(_cap(1))
    assert set(out) == {"__key__", "__restore_key__", "__subflavors__", "__sources__", "image", "caption"}
    assert out["__key__"] == "k1"


def test_encode_sample_converts_dicts_and_namedtuples_too():
    """Dict and NamedTuple samples are converted by field name as well."""
    te = DefaultTaskEncoder(encoded_sample_type=ImageCaption)
    out = te.encode_sample({"image": torch.zeros(1), "caption": "x", "unused": 1})
    assert isinstance(out, ImageCaption) and out.caption == "x"
    as_dict = DefaultTaskEncoder(encoded_sample_type=dict).encode_sample(CaptionOnly("c", 1))
    assert as_dict == {"caption": "c", "extra": 1}


def test_raw_batch_type_namedtuple_and_dict():
    """raw_batch_type selects the batch container: a NamedTuple of its fields, or a plain dict."""
    samples = [_cap(0), _cap(1)]
    nt = DefaultTaskEncoder(raw_batch_type=CaptionOnly).batch(samples)
    assert isinstance(nt, CaptionOnly) and nt.caption == ["a caption number 0", "a caption number 1"] and nt.extra == 7
    d = DefaultTaskEncoder(raw_batch_type=dict).batch(samples)
    assert d["__key__"] == ["k0", "k1"] and d["image"].shape == (2, 3, 2, 2)


def test_batch_type_converts_the_raw_batch():
    """batch_type maps the raw batch onto a dict, NamedTuple or dataclass in encode_batch."""
    raw = DefaultTaskEncoder().batch([_cap(0), _cap(1)])
    as_dict = DefaultTaskEncoder(batch_type=dict).encode_batch(raw)
    assert as_dict["caption"] == raw.caption and as_dict["__key__"] == ["k0", "k1"]
    assert DefaultTaskEncoder(batch_type=CaptionOnly).encode_batch(raw).caption == raw.caption
    ic = DefaultTaskEncoder(batch_type=ImageCaption).encode_batch(raw)
    assert isinstance(ic, ImageCaption) and torch.equal(ic.image, raw.image)


def test_default_batch_of_captioning_samples_is_a_captioning_sample():
    """DefaultTaskEncoder().batch gives a CaptioningSample: stacked image, listed captions, keys and subflavors."""
    samples = [_cap(0, __subflavors__={"a": 0}), _cap(1, __subflavors__={"a": 1})]
    out = DefaultTaskEncoder().batch(samples)
    assert isinstance(out, CaptioningSample)
    assert torch.equal(out.image, torch.stack([s.image for s in samples]))
    assert out.caption == ["a caption number 0", "a caption number 1"]
    assert out.__key__ == ["k0", "k1"]
    assert out.__subflavors__ == [{"a": 0}, {"a": 1}]
    assert list(out.__restore_key__) == [("Webdataset", 0), ("Webdataset", 1)]


def test_default_batch_matches_energons_default_batch():
    """DefaultTaskEncoder().batch gives the same fields as Energon 7.4.1 on the same samples."""
    ours = [_cap(i, w=2 + i, __subflavors__={"i": i}) for i in range(3)]
    theirs = [
        energon.CaptioningSample(
            __key__=s.__key__, __restore_key__=s.__restore_key__, __subflavors__=s.__subflavors__,
            image=s.image, caption=s.caption,
        )
        for s in ours
    ]
    a = DefaultTaskEncoder().batch(ours)
    b = energon.DefaultTaskEncoder().batch(theirs)
    assert torch.equal(a.image, b.image)
    assert a.caption == b.caption
    assert a.__key__ == b.__key__
    assert a.__subflavors__ == b.__subflavors__
    assert list(a.__restore_key__) == list(b.__restore_key__)


# -- _batch ----------------------------------------------------------------------------------


@dataclasses.dataclass
class CaptioningRawBatch:
    """The documentation's raw batch type: no __restore_key__ and friends."""

    __key__: List[str]
    image: torch.Tensor
    caption: List[str]


@dataclasses.dataclass
class CaptioningBatch:
    __keys__: List[str]
    images: torch.Tensor
    text_tokens: torch.Tensor
    text_attn_mask: torch.Tensor


def test_batch_into_a_type_without_meta_fields_fills_only_declared_fields():
    """_batch(result_type=X) fills only X's fields, so the documented CaptioningRawBatch works."""
    te = DefaultTaskEncoder()
    actions = {"image": batch_stack, "caption": batch_list}
    out = te._batch([_cap(0), _cap(1)], result_type=CaptioningRawBatch, actions=actions)
    assert isinstance(out, CaptioningRawBatch)
    assert out.__key__ == ["k0", "k1"]
    assert out.image.shape == (2, 3, 2, 2)
    assert out.caption == ["a caption number 0", "a caption number 1"]


def test_batch_actions_and_default_action_are_applied_per_field():
    """_batch applies the per-field action where given and default_action to the other fields."""
    out = TaskEncoder()._batch(
        [_cap(0), _cap(1)],
        result_type=dict,
        actions={"caption": lambda v: " | ".join(v)},
        default_action=lambda v: len(v),
    )
    assert out["caption"] == "a caption number 0 | a caption number 1"
    assert out["image"] == 2 and out["__key__"] == 2


def test_batch_with_the_stack_action_rejects_ragged_images():
    """An explicit batch_stack action is used as given: ragged images raise instead of being padded."""
    with pytest.raises(RuntimeError):
        TaskEncoder()._batch(
            [_cap(0, w=2), _cap(1, w=3)], result_type=CaptioningRawBatch, actions={"image": batch_stack}
        )


def test_batch_into_a_namedtuple_result_type():
    """_batch builds a NamedTuple result from the fields it declares."""
    out = TaskEncoder()._batch([_cap(0), _cap(1)], result_type=CaptionOnly)
    assert out == CaptionOnly(caption=["a caption number 0", "a caption number 1"], extra=7)


def test_batch_uses_from_samples_of_the_result_type():
    """A result type with from_samples (a Batch subclass) builds itself; sources are flattened."""

    @edataclass
    class CapBatch(Batch):
        image: torch.Tensor
        caption: list

    out = TaskEncoder()._batch(
        [_cap(0, __sources__=(_src(0),)), _cap(1, w=3, __sources__=(_src(1),))], result_type=CapBatch
    )
    assert isinstance(out, CapBatch)
    assert [tuple(t.shape) for t in out.image] == [(3, 2, 2), (3, 2, 3)]  # listed, not stacked: Energon's
    assert out.__sources__ == (_src(0), _src(1))


def test_batch_of_samples_without_a_field_of_the_first_raises_naming_sample_and_field():
    """A sample lacking a field of the batch's first sample (another type, a dict without a key) is
    an error naming its key and the field, not a shorter, misaligned column; extra fields of later
    samples are left out, as in Energon."""
    with pytest.raises(TypeError, match=r"sample 'k1' \(dict\) has no field '__restore_key__', which the batch's first sample \(CaptioningSample\) has"):
        DefaultTaskEncoder().batch([_cap(0), {"__key__": "k1", "caption": "c"}])
    with pytest.raises(TypeError, match=r"sample 'b' \(dict\) has no field 'mask'"):
        TaskEncoder()._batch([{"__key__": "a", "mask": 1}, {"__key__": "b"}], result_type=dict)
    out = TaskEncoder()._batch([{"__key__": "a"}, {"__key__": "b", "mask": 1}], result_type=dict)
    assert out == {"__key__": ["a", "b"]}


def test_batch_of_no_samples_raises():
    """_batch with an empty list raises ValueError."""
    with pytest.raises(ValueError):
        TaskEncoder()._batch([], result_type=dict)


def test_batch_rejects_an_unusable_result_type():
    """_batch raises TypeError for a result type that is no dataclass, NamedTuple or dict."""
    with pytest.raises(TypeError):
        TaskEncoder()._batch([_cap(0)], result_type=list)


# -- the documented captioning task encoder ---------------------------------------------------


class WhitespaceTokenizer:
    """A tiny tokenizer: one id per whitespace-separated word, padded to the longest caption."""

    def __init__(self) -> None:
        self.vocab: Dict[str, int] = {}

    def __call__(self, texts: List[str]) -> Dict[str, torch.Tensor]:
        rows = [[self.vocab.setdefault(w, len(self.vocab) + 1) for w in t.split()] for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return {"input_ids": ids, "attention_mask": mask}


class CaptioningTaskEncoder(
    DefaultTaskEncoder[CaptioningSample, CaptioningSample, CaptioningRawBatch, CaptioningBatch]
):
    """The documentation's captioning task encoder, written against energon_ray."""

    def __init__(
        self,
        tokenizer: Callable[[List[str]], Dict[str, torch.Tensor]],
        image_transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        max_length: int = 128,
    ):
        super().__init__(batch_type=CaptioningRawBatch)
        self.tokenizer = tokenizer
        self.image_transform = image_transform
        self.max_length = max_length

    def encode_sample(self, sample: CaptioningSample) -> CaptioningSample:
        sample.image = self.image_transform(sample.image)
        return sample

    def batch(self, samples: List[CaptioningSample]) -> CaptioningRawBatch:
        return self._batch(
            samples, result_type=CaptioningRawBatch, actions={"image": batch_stack, "caption": batch_list}
        )

    def encode_batch(self, batch_data: CaptioningRawBatch) -> CaptioningBatch:
        tokenized = self.tokenizer(batch_data.caption)
        return CaptioningBatch(
            __keys__=batch_data.__key__,
            images=batch_data.image,
            text_tokens=tokenized["input_ids"],
            text_attn_mask=tokenized["attention_mask"],
        )


def test_documented_captioning_task_encoder_runs_encode_sample_batch_and_encode_batch():
    """The doc's CaptioningTaskEncoder transforms images, batches and tokenizes hand-built samples."""
    te = CaptioningTaskEncoder(WhitespaceTokenizer(), image_transform=lambda img: img[:, :1, :1] * 2)
    samples = [
        CaptioningSample(
            __key__="a", __restore_key__=("Webdataset", 0), image=torch.full((3, 4, 4), 1.0), caption="a red bus"
        ),
        CaptioningSample(
            __key__="b", __restore_key__=("Webdataset", 1), image=torch.full((3, 5, 3), 2.0), caption="a bus"
        ),
    ]
    encoded = [te.encode_sample(s) for s in samples]
    raw = te.batch(encoded)
    out = te.encode_batch(raw)
    assert isinstance(out, CaptioningBatch)
    assert out.__keys__ == ["a", "b"]
    assert out.images.shape == (2, 3, 1, 1)
    assert out.images.flatten().tolist() == [2.0] * 3 + [4.0] * 3
    assert out.text_tokens.tolist() == [[1, 2, 3], [1, 3, 0]]
    assert out.text_attn_mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_documented_encoder_overrides_the_hooks_it_defines():
    """is_overridden reports the doc encoder's encode_sample, batch and encode_batch, not the packing hooks."""
    te = CaptioningTaskEncoder(WhitespaceTokenizer(), image_transform=lambda x: x)
    assert all(is_overridden(te, h) for h in ("encode_sample", "batch", "encode_batch"))
    assert not is_overridden(te, "select_samples_to_pack")
    assert not is_overridden(te, "cook_crude_sample")


# -- TaskEncoder class attributes, decorators, cookers ----------------------------------------


def test_task_encoder_class_defaults_match_energon():
    """TaskEncoder defaults: no cookers, a torchrgb SampleDecoder, failure tolerance 100."""
    assert tuple(TaskEncoder.cookers) == ()
    assert isinstance(TaskEncoder.decoder, SampleDecoder)
    assert TaskEncoder.decoder.config()["image_decode"] == "torchrgb"
    assert TaskEncoder.__default_failure_tolerance__ == 100


def test_is_overridden_checks_against_the_task_encoder_base():
    """is_overridden is False on TaskEncoder itself and True for DefaultTaskEncoder's own hooks."""
    assert not is_overridden(TaskEncoder(), "encode_sample")
    assert is_overridden(DefaultTaskEncoder(), "encode_sample")
    assert is_overridden(DefaultTaskEncoder(), "batch")
    assert is_overridden(DefaultTaskEncoder(), "encode_batch")
    assert not is_overridden(DefaultTaskEncoder(), "cook_crude_sample")


def test_packing_hooks_raise_until_overridden():
    """select_samples_to_pack and pack_selected_samples raise NotImplementedError by default."""
    with pytest.raises(NotImplementedError):
        TaskEncoder().select_samples_to_pack([1])
    with pytest.raises(NotImplementedError):
        TaskEncoder().pack_selected_samples([1])


def test_stateless_with_failure_tolerance_records_its_options():
    """@stateless(failure_tolerance=5) marks the function stateless with tolerance 5 and restore_seeds False."""

    @stateless(failure_tolerance=5)
    def hook(sample):
        return sample

    assert hook(3) == 3
    assert get_stateless(hook) is True
    assert hook.__failure_tolerance__ == 5
    assert hook.__restore_seeds__ is False
    assert get_failure_tolerance(hook, default=100) == 5


def test_stateless_without_arguments_and_on_methods():
    """Bare @stateless works; its marks are visible through a bound method; no tolerance means the default."""

    class TE(TaskEncoder):
        @stateless
        def encode_sample(self, sample):
            return sample

        @stateless(restore_seeds=True, failure_tolerance=0)
        def encode_batch(self, batch):
            return batch

    te = TE()
    assert get_stateless(te.encode_sample)
    assert get_failure_tolerance(te.encode_sample, default=100) == 100
    assert te.encode_batch.__restore_seeds__ is True
    assert get_failure_tolerance(te.encode_batch, default=100) == 0
    assert not get_stateless(lambda s: s)


def test_stateless_rejects_a_negative_tolerance_naming_it():
    """@stateless(failure_tolerance=-1) raises ValueError naming the value."""
    with pytest.raises(ValueError, match="-1"):
        stateless(failure_tolerance=-1)(lambda s: s)


def test_cooker_is_match_requires_all_given_subflavors():
    """Cooker.is_match needs every has_subflavors key/value present; no filter matches everything."""
    c = Cooker(cook=lambda s: s, has_subflavors={"kind": "ocr", "lang": "en"})
    assert c.is_match({"kind": "ocr", "lang": "en", "extra": 1})
    assert not c.is_match({"kind": "ocr"})
    assert not c.is_match({"kind": "ocr", "lang": "de"})
    assert not c.is_match(None)
    assert Cooker(cook=lambda s: s).is_match(None)
    assert Cooker(cook=lambda s: s, has_subflavors={}).is_match({"a": 1})


def test_cook_crude_sample_uses_the_first_matching_cooker():
    """cook_crude_sample cooks a CrudeSample with the first cooker whose subflavors match."""

    def cook_text(crude):
        return TextSample(**basic_sample_keys(crude), text=crude["txt"])

    class TE(DefaultTaskEncoder):
        cookers = [
            Cooker(cook=lambda c: "wrong", has_subflavors={"kind": "image"}),
            Cooker(cook=cook_text, has_subflavors={"kind": "text"}),
            Cooker(cook=lambda c: "also wrong"),
        ]

    crude = CrudeSample(
        __key__="k", __restore_key__=("W", 1), __subflavors__={"kind": "text"}, __sources__=None, txt="hi"
    )
    out = TE().cook_crude_sample(crude)
    assert isinstance(out, TextSample) and out.text == "hi" and out.__key__ == "k"


def test_cook_crude_sample_without_a_match_raises_naming_the_key():
    """A crude sample no cooker matches raises ValueError naming its key."""

    class TE(DefaultTaskEncoder):
        cookers = [Cooker(cook=lambda c: c, has_subflavors={"kind": "image"})]

    with pytest.raises(ValueError, match="sample_42"):
        TE().cook_crude_sample(CrudeSample(__key__="sample_42", __subflavors__={"kind": "text"}))


def test_cook_crude_sample_passes_typed_samples_through():
    """A sample that is not a CrudeSample is returned unchanged."""
    s = _cap(0)
    assert TaskEncoder().cook_crude_sample(s) is s


def test_basic_sample_keys_forwards_meta_and_extra_sources():
    """basic_sample_keys returns the four meta keys, appending additional source infos."""
    crude = CrudeSample(
        __key__="k", __restore_key__=("Webdataset", 4), __subflavors__={"a": 1}, __sources__=(_src(4),), jpg=b"..."
    )
    keys = basic_sample_keys(crude, additional_source_info=(_src(99),))
    assert keys == {
        "__key__": "k",
        "__restore_key__": ("Webdataset", 4),
        "__subflavors__": {"a": 1},
        "__sources__": (_src(4), _src(99)),
    }
    assert TextSample(**keys, text="x").__sources__ == (_src(4), _src(99))


def test_ignore_sample_is_skip_sample():
    """IgnoreSample (the documentation's name) is the very same class as SkipSample."""
    assert IgnoreSample is SkipSample
    assert energon_ray.IgnoreSample is energon_ray.SkipSample is SkipSample


# -- per-call RNG and indices -------------------------------------------------------------------


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _draw():
    return torch.rand(4).tolist(), np.random.rand(4).tolist(), [random.random() for _ in range(4)]


def test_hook_call_makes_all_rngs_identical_for_the_same_position():
    """torch, numpy and random give the same draws for the same (seed, kind, index)."""
    with context.hook_call(7, "encode_sample", 3):
        first = _draw()
    _draw()  # disturb the global state in between
    with context.hook_call(7, "encode_sample", 3):
        second = _draw()
    assert first == second


def test_hook_call_differs_for_another_index_kind_or_seed():
    """Another index, hook kind or worker seed gives different draws from every RNG."""
    with context.hook_call(7, "encode_sample", 3):
        base = _draw()
    for args in ((7, "encode_sample", 4), (7, "encode_batch", 3), (8, "encode_sample", 3)):
        with context.hook_call(*args):
            other = _draw()
        assert all(a != b for a, b in zip(base, other)), args


def test_hook_call_restores_the_callers_rng_state_when_asked():
    """With restore_rng=True the RNG streams continue after the call as if it never happened."""
    _seed_all(123)
    expected = _draw()
    _seed_all(123)
    with context.hook_call(1, "encode_sample", 0, restore_rng=True):
        _draw()
    assert _draw() == expected


def test_hook_call_without_restore_leaves_the_hook_seeded_state():
    """Without restore_rng the RNGs continue from the hook's seeded state."""
    with context.hook_call(1, "encode_sample", 0):
        _draw()
        expected = _draw()
    torch.manual_seed(5)
    with context.hook_call(1, "encode_sample", 0):
        _draw()
    assert _draw() == expected


def test_hook_seed_is_a_pure_32_bit_function():
    """hook_seed is deterministic, fits 32 bits and depends on every argument."""
    s = context.hook_seed(1, "encode_sample", 2)
    assert s == context.hook_seed(1, "encode_sample", 2)
    assert 0 <= s < 2**32
    others = {context.hook_seed(2, "encode_sample", 2), context.hook_seed(1, "batch", 2)}
    others.add(context.hook_seed(1, "encode_sample", 3))
    assert len(others | {s}) == 4


def test_current_sample_index_works_inside_a_hook_call():
    """TaskEncoder().current_sample_index is the sample_index given to hook_call."""
    te = TaskEncoder()
    with context.hook_call(0, "encode_sample", 11, sample_index=11):
        assert te.current_sample_index == 11


def test_current_batch_index_works_inside_a_hook_call():
    """TaskEncoder().current_batch_index is the batch_index given to hook_call."""
    with context.hook_call(0, "batch", 4, batch_index=4):
        assert TaskEncoder().current_batch_index == 4


def test_current_indices_raise_outside_a_hook_call():
    """Outside a hook call current_sample_index and current_batch_index raise RuntimeError."""
    te = TaskEncoder()
    with pytest.raises(RuntimeError):
        te.current_sample_index
    with pytest.raises(RuntimeError):
        te.current_batch_index
    with context.hook_call(0, "encode_sample", 1, sample_index=1):
        pass
    with pytest.raises(RuntimeError):
        te.current_sample_index


def test_nested_hook_calls_restore_the_outer_index():
    """Leaving an inner hook_call restores the outer call's sample index."""
    te = TaskEncoder()
    with context.hook_call(0, "encode_sample", 1, sample_index=1):
        with context.hook_call(0, "encode_sample", 2, sample_index=2):
            assert te.current_sample_index == 2
        assert te.current_sample_index == 1


def test_current_sample_index_is_per_thread():
    """Another thread does not see the index set by this thread's hook call."""
    seen = []

    def probe():
        try:
            seen.append(TaskEncoder().current_sample_index)
        except RuntimeError:
            seen.append("raised")

    with context.hook_call(0, "encode_sample", 9, sample_index=9):
        t = threading.Thread(target=probe)
        t.start()
        t.join()
    assert seen == ["raised"]


def test_sample_hooks_see_the_batch_index_their_sample_goes_into():
    """Inside encode_sample (run by the encode stage) current_batch_index is position // batch size,
    not a RuntimeError (Energon code reads it there)."""
    from energon_ray.pipeline import rows
    from energon_ray.pipeline.shipping import Shipped
    from energon_ray.pipeline.stages import EncodeSamples, StageConfig
    from energon_ray.plan.stream import SegmentSpec
    import numpy as np

    seen = []

    class Reads(TaskEncoder):
        def encode_sample(self, sample):
            seen.append((self.current_sample_index, self.current_batch_index))
            return sample

    spec = SegmentSpec(worker=0, global_worker=0, seed=1, index=0, start=0, samples=np.arange(5), last=True)
    data = rows.SegmentData(spec=spec, raw=[(p, p, {"__key__": f"k{p}"}) for p in range(5)])
    stage = EncodeSamples(StageConfig(task_encoder=Shipped(Reads(), "te"), loader=Shipped(lambda raw: raw, "loader"), batch_size=2))
    stage.encode(data)
    assert seen == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2)] and len(data.encoded) == 5


def test_indices_count_over_the_ranks_interleaved_workers():
    """Inside worker_slot(worker, workers) a hook's indices are Energon's: local × workers + worker
    (worker 1 of 2 makes the loader's batches 1, 3, 5 …); outside it the local index itself."""
    te = TaskEncoder()
    with context.worker_slot(1, 2):
        with context.hook_call(0, "encode_sample", 3, sample_index=3, batch_index=1):
            assert (te.current_sample_index, te.current_batch_index) == (7, 3)
        with context.worker_slot(0, 3):  # nested: the inner slot wins, the outer comes back
            with context.hook_call(0, "encode_sample", 3, sample_index=3, batch_index=1):
                assert (te.current_sample_index, te.current_batch_index) == (9, 3)
        with context.hook_call(0, "encode_sample", 0, sample_index=0, batch_index=0):
            assert (te.current_sample_index, te.current_batch_index) == (1, 1)
    with context.hook_call(0, "encode_sample", 3, sample_index=3, batch_index=1):
        assert (te.current_sample_index, te.current_batch_index) == (3, 1)


def test_a_restore_seeds_hook_draws_energons_numbers():
    """kind=None seeds as Energon seeds a @stateless(restore_seeds=True) hook: from the worker seed
    and the sample index in the rank. The draws are those Energon's own suite pins for worker seed
    273211461 (one worker), samples 0 and 1; worker 1 of 2 draws sample 1's numbers at position 0."""
    def draw(index):
        with context.hook_call(273211461, None, index, sample_index=index):
            return random.randint(0, 1000)

    assert [draw(0), draw(1)] == [661, 762]
    with context.worker_slot(1, 2):
        assert draw(0) == 762
    # hooks without the flag keep energon_ray's own per-kind seeds
    assert context.hook_seed(273211461, "encode", 0) != context.hook_seed(273211461, None, 0)
