"""Sample and Batch types: Energon's fields and defaults, construction, derive/extend/join, batching, pinning."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import megatron.energon as energon
import pytest
import torch
from megatron.energon.flavors.vqa_and_ocr import VQAOCRSample as EnergonVQAOCRSample

from energon_ray import samples as er
from energon_ray.samples import (
    Batch,
    CaptioningSample,
    ImageSample,
    Sample,
    SourceInfo,
    TextSample,
    edataclass,
)
from energon_ray.samples.base import _pin

TYPE_NAMES = [
    "Sample",
    "CaptioningSample",
    "ImageSample",
    "ImageClassificationSample",
    "OCRSample",
    "TextSample",
    "VQASample",
    "MultiChoiceVQASample",
    "VidQASample",
    "InterleavedSample",
    "SimilarityInterleavedSample",
    "Batch",
]

#: Defaults energon_ray deliberately relaxes: Energon requires ``__restore_key__``; here it defaults
#: to ``()`` (the package's own docstrings construct samples without it). Reported, not asserted.
RELAXED_DEFAULTS = {"__restore_key__"}


def _field_table(cls, relaxed=()):
    """(name, default, has default_factory, kw_only) of every dataclass field, in order."""
    return [
        (
            f.name,
            "<relaxed>" if f.name in relaxed else f.default,
            f.default_factory is not dataclasses.MISSING,
            f.kw_only,
        )
        for f in dataclasses.fields(cls)
    ]


def _src(i: int, shard: str = "shard_0000.tar") -> SourceInfo:
    return SourceInfo(dataset_path="/ds", index=i, shard_name=shard, file_names=(f"k{i}.jpg", f"k{i}.txt"))


def _cap(i: int, w: int = 2, **kw) -> CaptioningSample:
    return CaptioningSample(
        __key__=f"k{i}",
        __restore_key__=("Webdataset", i),
        image=torch.full((1, 2, w), float(i + 1)),
        caption=f"caption {i}",
        **kw,
    )


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_type_has_energons_fields_in_order_with_same_defaults(name):
    """Each sample type (and Batch) has Energon's field names, order, kw_only flags and defaults."""
    ours = getattr(er, name)
    theirs = getattr(energon, name)
    assert _field_table(ours, RELAXED_DEFAULTS) == _field_table(theirs, RELAXED_DEFAULTS)


def test_vqaocr_sample_has_energons_fields_and_defaults():
    """VQAOCRSample (not exported at the top level) matches Energon's field for field."""
    assert _field_table(er.VQAOCRSample, RELAXED_DEFAULTS) == _field_table(EnergonVQAOCRSample, RELAXED_DEFAULTS)


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_type_is_a_slotted_dataclass(name):
    """Every sample type is declared with dataclass(slots=True), like Energon's edataclass."""
    cls = getattr(er, name)
    assert dataclasses.is_dataclass(cls)
    assert "__slots__" in vars(cls)


def test_sample_types_share_the_sample_base():
    """All concrete sample types derive from Sample; Batch does not."""
    for name in TYPE_NAMES[1:-1]:
        assert issubclass(getattr(er, name), Sample)
    assert not issubclass(Batch, Sample)


def test_positional_construction_is_rejected():
    """Sample types are keyword-only: positional arguments raise TypeError."""
    with pytest.raises(TypeError):
        CaptioningSample("k", ("Webdataset", 0), None, None, torch.zeros(1), "c")  # type: ignore[misc]


def test_missing_required_field_is_rejected():
    """Leaving out a field without a default (caption) raises TypeError."""
    with pytest.raises(TypeError, match="caption"):
        CaptioningSample(__key__="k", __restore_key__=(), image=torch.zeros(1))  # type: ignore[call-arg]


def test_optional_fields_default_to_none_and_zero():
    """Optional fields take Energon's defaults (None, and correct_choice_idx=0)."""
    img = torch.zeros(3, 2, 2)
    vqa = er.VQASample(__key__="k", __restore_key__=(), image=img, context="q?")
    mc = er.MultiChoiceVQASample(__key__="k", __restore_key__=(), image=img, context="q?")
    ocr = er.OCRSample(__key__="k", __restore_key__=(), image=img, text="t")
    assert (vqa.answers, vqa.answer_weights, vqa.__subflavors__, vqa.__sources__) == (None, None, None, None)
    assert (mc.choices, mc.correct_choice_idx) == (None, 0)
    assert all(getattr(ocr, f) is None for f in ("block_boxes", "lines_text", "words_boxes", "chars_text"))


def test_edataclass_makes_keyword_only_slotted_subclasses():
    """A user's @edataclass subclass is keyword-only and slotted, with or without parentheses."""

    @edataclass
    class Tokens(TextSample):
        ids: torch.Tensor

    @edataclass()
    class Scored(TextSample):
        score: float = 0.0

    t = Tokens(__key__="k", __restore_key__=(), text="a b", ids=torch.tensor([1, 2]))
    assert t.ids.tolist() == [1, 2]
    assert Scored(__key__="k", __restore_key__=(), text="x").score == 0.0
    assert "__slots__" in vars(Tokens) and "__slots__" in vars(Scored)
    with pytest.raises(TypeError):
        Tokens("k", (), None, None, "a", torch.zeros(1))  # type: ignore[misc]


def test_derive_from_copies_the_four_meta_fields():
    """derive_from takes __key__, __restore_key__, __subflavors__ and __sources__ from the base sample."""
    base = _cap(3, __subflavors__={"lang": "en"}, __sources__=(_src(3),))
    derived = TextSample.derive_from(base, text="hello")
    assert isinstance(derived, TextSample)
    assert derived.__key__ == "k3"
    assert derived.__restore_key__ == ("Webdataset", 3)
    assert derived.__subflavors__ == {"lang": "en"}
    assert derived.__sources__ == (_src(3),)
    assert derived.text == "hello"


def test_derive_from_lets_keyword_fields_override_meta_fields():
    """derive_from(base, __subflavors__=...) overrides the base's meta field, as Energon allows."""
    base = _cap(1, __subflavors__={"lang": "en"})
    derived = CaptioningSample.derive_from(base, __subflavors__={"lang": "de"}, image=base.image, caption="x")
    assert derived.__subflavors__ == {"lang": "de"}
    assert derived.__key__ == "k1"


def test_extend_copies_all_fields_and_adds_new_ones():
    """extend(src, new=...) copies every field of src (meta included) into the subclass and adds the new ones."""

    @edataclass
    class TokenizedCaption(CaptioningSample):
        tokens: torch.Tensor

    src = _cap(2, __subflavors__={"a": 1}, __sources__=(_src(2),))
    out = TokenizedCaption.extend(src, tokens=torch.tensor([5, 6]))
    assert isinstance(out, TokenizedCaption)
    assert (out.__key__, out.__restore_key__, out.__subflavors__, out.__sources__) == (
        "k2",
        ("Webdataset", 2),
        {"a": 1},
        (_src(2),),
    )
    assert out.image is src.image and out.caption == "caption 2"
    assert out.tokens.tolist() == [5, 6]


def test_extend_leaves_out_fields_declared_without_init():
    """A field declared ``init=False`` is not passed to the subclass (it sets its own, as Energon's
    extend does); it was passed, and extend raised TypeError 'unexpected keyword argument'."""

    @edataclass
    class Counted(Sample):
        text: str
        length: int = dataclasses.field(init=False, default=-1)

    @edataclass
    class Tagged(Counted):
        tag: str

    src = Counted(__key__="k", __restore_key__=("Webdataset", 3), text="abc")
    src.length = 3
    out = Tagged.extend(src, tag="t")
    assert (out.__key__, out.__restore_key__, out.text, out.length, out.tag) == ("k", ("Webdataset", 3), "abc", -1, "t")


def test_extend_keyword_overrides_a_copied_field():
    """A keyword passed to extend wins over the field copied from src."""
    src = _cap(0)
    assert CaptioningSample.extend(src, caption="new").caption == "new"


def test_from_joined_uses_primary_meta_and_later_samples_override_fields():
    """from_joined: the primary gives key/restore key/subflavors; later samples override other fields."""
    primary = _cap(0, __subflavors__={"p": 1}, __sources__=(_src(0),))
    secondary = _cap(9, __subflavors__={"s": 2}, __sources__=(_src(9, "other.tar"),))
    joined = CaptioningSample.from_joined(primary, secondary)
    assert joined.__key__ == "k0"
    assert joined.__restore_key__ == ("Webdataset", 0)
    assert joined.__subflavors__ == {"p": 1}
    assert joined.caption == "caption 9"
    assert torch.equal(joined.image, secondary.image)


def test_from_joined_concatenates_sources_in_argument_order():
    """from_joined's __sources__ are the joined samples' sources, primary first."""
    a = _cap(0, __sources__=(_src(0),))
    b = TextSample(__key__="t", __restore_key__=(), text="x", __sources__=(_src(5, "txt.tar"), _src(6, "txt.tar")))
    joined = CaptioningSample.from_joined(a, b)
    assert joined.__sources__ == (_src(0), _src(5, "txt.tar"), _src(6, "txt.tar"))


def test_from_joined_lists_the_primarys_sources_once_where_energon_repeats_them():
    """from_joined lists each sample's sources once; Energon's lists the primary's twice (a kept
    difference: the same file named twice)."""
    primary, secondary = _src(0), _src(5, "txt.tar")
    joined = TextSample.from_joined(
        TextSample(__key__="p", __restore_key__=(), text="p", __sources__=(primary,)),
        TextSample(__key__="s", __restore_key__=(), text="s", __sources__=(secondary,)),
    )
    theirs = energon.TextSample.from_joined(
        energon.TextSample(__key__="p", __restore_key__=(), text="p", __sources__=(primary,)),
        energon.TextSample(__key__="s", __restore_key__=(), text="s", __sources__=(secondary,)),
    )
    assert joined.__sources__ == (primary, secondary)
    assert theirs.__sources__ == (primary, primary, secondary)


def test_from_joined_builds_a_type_from_fields_of_different_samples():
    """Joining an ImageSample and a TextSample fills a sample type that needs fields of both."""

    @edataclass
    class ImageText(Sample):
        image: torch.Tensor
        text: str

    img = ImageSample(__key__="i", __restore_key__=("a", 1), image=torch.ones(1))
    txt = TextSample(__key__="t", __restore_key__=("b", 2), text="words")
    joined = ImageText.from_joined(img, txt)
    assert (joined.__key__, joined.text) == ("i", "words")
    assert torch.equal(joined.image, torch.ones(1))


def test_from_joined_skips_missing_secondary_samples():
    """A None secondary (a join with no match) is skipped, as Energon's default joiner does."""
    primary = _cap(0)
    joined = CaptioningSample.from_joined(primary, None)
    assert joined.__key__ == "k0" and joined.caption == "caption 0"


def test_from_joined_without_samples_raises():
    """from_joined() with no samples raises ValueError."""
    with pytest.raises(ValueError):
        CaptioningSample.from_joined()


@edataclass
class CapBatch(Batch):
    image: torch.Tensor
    caption: list


@energon.edataclass
class EnergonCapBatch(energon.Batch):
    image: torch.Tensor
    caption: list


def _energon_cap(i: int, w: int = 2, **kw) -> energon.CaptioningSample:
    ours = _cap(i, w, **kw)
    return energon.CaptioningSample(**{f.name: getattr(ours, f.name) for f in dataclasses.fields(ours)})


def test_batch_from_samples_lists_every_field_tensors_too():
    """Batch.from_samples lists each field, tensors unstacked (the same tensors, in order), as Energon's."""
    images = [_cap(0, w=2).image, _cap(1, w=3).image]
    batch = CapBatch.from_samples([_cap(0, w=2), _cap(1, w=3)])
    theirs = EnergonCapBatch.from_samples([_energon_cap(0, w=2), _energon_cap(1, w=3)])
    assert type(batch.image) is list and type(theirs.image) is list
    assert [t.tolist() for t in batch.image] == [t.tolist() for t in theirs.image] == [t.tolist() for t in images]
    assert batch.caption == theirs.caption == ["caption 0", "caption 1"]
    assert batch.__key__ == ["k0", "k1"]


def test_batch_from_samples_restore_key_is_the_list_of_the_samples_keys():
    """Batch.from_samples' __restore_key__ is a list of the samples' restore keys, as Energon's."""
    batch = CapBatch.from_samples([_cap(0), _cap(1)])
    theirs = EnergonCapBatch.from_samples([_energon_cap(0), _energon_cap(1)])
    assert batch.__restore_key__ == theirs.__restore_key__ == [("Webdataset", 0), ("Webdataset", 1)]
    assert type(batch.__restore_key__) is type(theirs.__restore_key__) is list


def test_batch_from_samples_flattens_sources_and_lists_subflavors():
    """__sources__ of all samples are flattened in order; __subflavors__ become a per-sample list."""
    samples = [
        _cap(0, __subflavors__={"a": 0}, __sources__=(_src(0), _src(10))),
        _cap(1, __subflavors__={"a": 1}, __sources__=(_src(1),)),
    ]
    batch = CapBatch.from_samples(samples)
    assert batch.__sources__ == (_src(0), _src(10), _src(1))
    assert batch.__subflavors__ == [{"a": 0}, {"a": 1}]


def test_batch_from_samples_keeps_one_subflavors_entry_per_sample_where_energon_drops_empty_ones():
    """__subflavors__ lines up with the samples, {} and None included; Energon's leaves those out
    (a kept difference: its list no longer says which sample has which subflavors)."""
    subflavors = [{}, {"src": "b"}, None, {"src": "d"}]
    batch = CapBatch.from_samples([_cap(i, __subflavors__=sf) for i, sf in enumerate(subflavors)])
    theirs = EnergonCapBatch.from_samples([_energon_cap(i, __subflavors__=sf) for i, sf in enumerate(subflavors)])
    assert batch.__subflavors__ == [{}, {"src": "b"}, None, {"src": "d"}]
    assert theirs.__subflavors__ == [{"src": "b"}, {"src": "d"}]
    no_subflavors = [_cap(i, __subflavors__={}) for i in range(2)]
    assert CapBatch.from_samples(no_subflavors).__subflavors__ == [{}, {}]
    assert EnergonCapBatch.from_samples([_energon_cap(i, __subflavors__={}) for i in range(2)]).__subflavors__ == []


def test_batch_from_samples_leaves_absent_meta_as_none():
    """Without sources or subflavors on any sample, the batch's __sources__/__subflavors__ stay None."""
    batch = CapBatch.from_samples([_cap(0), _cap(1)])
    assert batch.__sources__ is None and batch.__subflavors__ is None


def test_batch_from_samples_of_samples_with_empty_sources_has_empty_sources():
    """Samples whose __sources__ are () (one of them None) batch to __sources__ == (), as Energon's."""
    sources = [(), None, ()]
    batch = CapBatch.from_samples([_cap(i, __sources__=s) for i, s in enumerate(sources)])
    theirs = EnergonCapBatch.from_samples([_energon_cap(i, __sources__=s) for i, s in enumerate(sources)])
    assert batch.__sources__ == theirs.__sources__ == ()


def test_batch_from_samples_keyword_overrides_a_field():
    """Keywords given to from_samples replace the batched value of that field."""
    batch = CapBatch.from_samples([_cap(0), _cap(1)], caption=["x", "y"])
    assert batch.caption == ["x", "y"]


def test_batch_from_samples_rejects_non_dataclasses():
    """from_samples raises TypeError for non-dataclass samples."""
    with pytest.raises(TypeError):
        CapBatch.from_samples([{"image": torch.zeros(1), "caption": "c", "__key__": "k"}])


def test_batch_from_samples_of_no_samples_is_energons_empty_batch():
    """from_samples([]) is an empty batch as Energon's: every field [], sources and subflavors None."""
    batch = CapBatch.from_samples([])
    theirs = EnergonCapBatch.from_samples([])
    expected = {
        "__key__": [], "__restore_key__": [], "__subflavors__": None, "__sources__": None, "image": [], "caption": []
    }
    for name, value in expected.items():
        assert getattr(batch, name) == getattr(theirs, name) == value, name
        assert type(getattr(batch, name)) is type(getattr(theirs, name)), name
    assert Batch.from_samples([], __key__=["x"]).__key__ == ["x"]


def test_batch_derive_from_copies_meta_fields():
    """Batch.derive_from copies the four meta fields of the base batch and sets the given fields."""
    base = CapBatch.from_samples([_cap(0, __sources__=(_src(0),)), _cap(1)])

    @edataclass
    class Encoded(Batch):
        n: int

    out = Encoded.derive_from(base, n=2)
    assert out.__key__ == ["k0", "k1"]
    assert out.__restore_key__ == base.__restore_key__
    assert out.__sources__ == (_src(0),)
    assert out.n == 2


def test_pin_memory_is_available_on_samples_and_batches():
    """Samples and batches have a callable pin_memory method (Energon's PinMemoryMixin)."""
    assert callable(getattr(_cap(0), "pin_memory", None))
    assert callable(getattr(CapBatch.from_samples([_cap(0)]), "pin_memory", None))


def test_pin_leaves_non_tensor_values_untouched():
    """_pin returns strings, numbers, None and containers of them unchanged."""
    value = {"a": ["x", 1, None], "b": ("y", 2.5), "c": None}
    assert _pin(value) == value
    assert _pin("s") == "s" and _pin(None) is None


def _fake_pin(tensor, *args, **kwargs):
    """Stand-in for Tensor.pin_memory on a CPU-only torch: returns a marked clone."""
    out = tensor.clone()
    out.fake_pinned = True
    return out


def _pinned(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, "fake_pinned", False)


def test_pin_memory_reaches_tensors_in_fields_lists_tuples_and_dicts(monkeypatch):
    """pin_memory pins tensor fields and tensors nested in lists, tuples and dicts, keeping the rest."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", _fake_pin)

    @edataclass
    class Rich(Batch):
        x: torch.Tensor
        nested: dict
        caption: list

    b = Rich(
        __key__=["k"], __restore_key__=(), x=torch.ones(2), nested={"l": [torch.zeros(1)], "t": (torch.ones(1), "s")},
        caption=["c"],
    )
    out = b.pin_memory()
    assert _pinned(out.x)
    assert _pinned(out.nested["l"][0]) and _pinned(out.nested["t"][0]) and out.nested["t"][1] == "s"
    assert out.caption == ["c"] and out.__key__ == ["k"]


def test_pin_memory_reaches_tensors_inside_namedtuples(monkeypatch):
    """Tensors inside a NamedTuple field are pinned too (Energon's _pin_memory recurses into NamedTuples)."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", _fake_pin)

    class Tok(NamedTuple):
        ids: torch.Tensor
        mask: torch.Tensor

    @edataclass
    class TokBatch(Batch):
        tok: Tok

    b = TokBatch(__key__=["k"], __restore_key__=(), tok=Tok(ids=torch.ones(2), mask=torch.zeros(2)))
    out = b.pin_memory()
    assert isinstance(out.tok, Tok)
    assert _pinned(out.tok.ids) and _pinned(out.tok.mask)


def test_source_info_is_frozen_and_readable():
    """SourceInfo is immutable and its str names the dataset, shard, index and files."""
    s = _src(4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.index = 5  # type: ignore[misc]
    assert str(s) == "/ds/shard_0000.tar[4] ['k4.jpg', 'k4.txt']"


@pytest.mark.parametrize("sources", [(), ("a.tar",)])
def test_basic_sample_keys_keeps_the_crude_samples_sources_as_energon(sources):
    """A crude sample's ``__sources__`` is forwarded as it is, an empty tuple as an empty tuple
    (Energon's ``basic_sample_keys``), not turned into None."""
    import energon_ray

    crude = {"__key__": "k", "__restore_key__": ("Webdataset", 1), "__subflavors__": {"a": 1}, "__sources__": sources}
    ours, theirs = energon_ray.basic_sample_keys(crude), energon.basic_sample_keys(crude)
    assert ours["__sources__"] == theirs["__sources__"] == sources
    assert {k: ours[k] for k in theirs} == theirs
