"""Raw tar parts → typed samples (SampleLoader) and dataset.yaml validation (read_dataset_spec)."""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path
from typing import Dict

import pytest
import torch
import yaml

from energon_ray.decode.sample_decoder import SampleDecoder, trusting
from energon_ray.errors import TRUST_ENV, DatasetConfigError, MediaTooLargeError, SampleException, UntrustedCodeError, resolve_trust
from energon_ray.format.dataset_yaml import read_dataset_spec, write_dataset_yaml
from energon_ray import samples as samples_module
from energon_ray.pipeline.load import SampleLoader
from energon_ray.samples import (
    CaptioningSample,
    CrudeSample,
    ImageClassificationSample,
    Sample,
    SourceInfo,
    edataclass,
)
from energon_ray.synthetic import encode_image, sample_image

W, H = 8, 6
JPG = encode_image(sample_image(1, (W, H)), "JPEG")
PNG = encode_image(sample_image(2, (W, H)), "PNG")
META = json.dumps({"meta": {"id": 7}, "tags": ["t0", "t1"]}).encode()
SHARD = "parts/shard_0003.tar"


def _raw(key: str, index: int = 3, **parts: bytes) -> Dict:
    """A raw sample as the shard reader yields it: parts plus __key__/__shard__/__restore_key__/__sources__."""
    raw: Dict = dict(parts)
    raw["__key__"] = key
    raw["__shard__"] = SHARD
    raw["__restore_key__"] = ("Webdataset", index)
    raw["__sources__"] = (
        SourceInfo(dataset_path="/ds", index=index, shard_name=SHARD, file_names=tuple(f"{key}.{p}" for p in parts)),
    )
    return raw


def _add_to_yaml(root: Path, **entries) -> None:
    path = root / ".nv-meta" / "dataset.yaml"
    data = yaml.safe_load(path.read_text())
    data.update(entries)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture
def classification(tmp_path) -> Path:
    """A dataset.yaml: ImageClassificationSample with jpg,png alternatives and nested json access."""
    write_dataset_yaml(
        tmp_path,
        "ImageClassificationSample",
        field_map={"image": "jpg,png", "label": "json[meta][id]", "label_name": "json[tags][1]"},
    )
    return tmp_path


LOADER_PY = textwrap.dedent(
    """
    def load(raw):
        return {"image": raw["png"], "caption": raw["txt"].upper(), "__key__": "must be ignored"}

    def parts(part):
        return part in ("png", "txt")
    """
)


@pytest.fixture
def loader_dataset(tmp_path) -> Path:
    """A dataset.yaml using sample_loader: loader.py:load with part_filter: loader.py:parts."""
    write_dataset_yaml(tmp_path, "CaptioningSample", sample_loader="loader.py:load", part_filter="loader.py:parts")
    (tmp_path / ".nv-meta" / "loader.py").write_text(LOADER_PY)
    return tmp_path


# -- field_map ----------------------------------------------------------------------------------


def test_field_map_reads_the_first_present_alternative_and_nested_json(classification):
    """'jpg,png' falls back to png when jpg is absent; 'json[meta][id]' and 'json[tags][1]' reach nested values."""
    spec = read_dataset_spec(classification)
    sample = SampleLoader(spec, SampleDecoder(), None)(_raw("k1", png=PNG, json=META))
    assert isinstance(sample, ImageClassificationSample)
    assert sample.image.shape == (3, H, W) and sample.image.dtype == torch.float32
    assert torch.allclose(sample.image, SampleDecoder().decode_part("png", PNG))
    assert sample.label == 7 and sample.label_name == "t1"


def test_field_map_prefers_the_first_alternative_when_both_exist(classification):
    """With both jpg and png present, 'jpg,png' takes the jpg."""
    spec = read_dataset_spec(classification)
    sample = SampleLoader(spec, SampleDecoder(), None)(_raw("k1", jpg=JPG, png=PNG, json=META))
    assert torch.equal(sample.image, SampleDecoder().decode_part("jpg", JPG))


def test_loaded_sample_carries_key_restore_key_and_sources(classification):
    """The sample's meta fields come from the raw sample: key, restore key and sources."""
    raw = _raw("sample_9", index=9, jpg=JPG, json=META)
    sample = SampleLoader(read_dataset_spec(classification), SampleDecoder(), None)(raw)
    assert sample.__key__ == "sample_9"
    assert sample.__restore_key__ == ("Webdataset", 9)
    assert sample.__sources__ == raw["__sources__"]


def test_spec_parts_are_the_parts_the_field_map_needs(classification):
    """The spec only wants the parts its field_map names (every alternative)."""
    spec = read_dataset_spec(classification)
    assert spec.parts == frozenset({"jpg", "png", "json"})
    assert spec.wants_part("png") and not spec.wants_part("txt")


def test_missing_part_raises_naming_shard_key_and_field(classification):
    """A sample without any of the field's parts raises SampleException naming shard, key and field."""
    loader = SampleLoader(read_dataset_spec(classification), SampleDecoder(), None)
    with pytest.raises(SampleException) as info:
        loader(_raw("sample_17", json=META))
    message = str(info.value)
    assert SHARD in message and "sample_17" in message and "'image'" in message
    assert "jpg" in message and "png" in message


def test_missing_nested_key_raises_naming_the_field_and_key(classification):
    """A json without the mapped nested key raises SampleException naming the field and the key."""
    loader = SampleLoader(read_dataset_spec(classification), SampleDecoder(), None)
    with pytest.raises(SampleException) as info:
        loader(_raw("sample_5", jpg=JPG, json=json.dumps({"meta": {}, "tags": ["a", "b"]}).encode()))
    message = str(info.value)
    assert "sample_5" in message and "'label'" in message and "'id'" in message


def test_corrupt_jpeg_raises_naming_the_part(classification):
    """An undecodable JPEG raises SampleException naming shard, key and the part 'jpg'."""
    loader = SampleLoader(read_dataset_spec(classification), SampleDecoder(), None)
    with pytest.raises(SampleException) as info:
        loader(_raw("sample_2", jpg=JPG[:60], json=META))
    message = str(info.value)
    assert "'jpg'" in message and "sample_2" in message and SHARD in message


def test_sample_exception_is_a_value_error():
    """SampleException is a ValueError, so the error policy counts it as a data error."""
    assert issubclass(SampleException, ValueError)


def test_decoder_none_keeps_raw_bytes(tmp_path):
    """With decoder=None the mapped fields get the raw bytes."""
    write_dataset_yaml(tmp_path, "CaptioningSample", field_map={"image": "jpg", "caption": "txt"})
    sample = SampleLoader(read_dataset_spec(tmp_path), None, None)(_raw("k", jpg=JPG, txt=b"cap"))
    assert sample.image == JPG and sample.caption == b"cap"


def test_image_decode_setting_is_used_for_mapped_images(classification):
    """The decoder's image_decode decides the mapped image's form (rgb8 → uint8 HWC array)."""
    sample = SampleLoader(read_dataset_spec(classification), SampleDecoder(image_decode="rgb8"), None)(
        _raw("k", jpg=JPG, json=META)
    )
    assert sample.image.shape == (H, W, 3) and str(sample.image.dtype) == "uint8"


class _UpperCaptions(SampleDecoder):
    """Energon's way to change decoding: a SampleDecoder subclass overriding ``__call__(sample)``."""

    def __call__(self, sample):
        out = super().__call__(sample)
        out["txt"] = out["txt"].upper()
        return out


class _OwnDecoder:
    """A decoder of the user's own: a callable on the raw sample with a ``config()``, as Energon calls it."""

    def __call__(self, sample):
        return {k: (v.decode()[::-1] if k == "txt" else v) for k, v in sample.items()}

    def config(self):
        return {"own": True}


@pytest.mark.parametrize("decoder, caption", [(_UpperCaptions(), "A CAT"), (_OwnDecoder(), "tac a")])
def test_a_decoder_overriding_call_gets_the_whole_sample_as_in_energon(tmp_path, decoder, caption):
    """A decoder whose __call__ is not SampleDecoder's decodes the raw sample (Energon's decoder(sample)); meta stays."""
    write_dataset_yaml(tmp_path, "CaptioningSample", field_map={"image": "png", "caption": "txt"})
    raw = _raw("k4", index=4, png=PNG, txt=b"a cat")
    sample = SampleLoader(read_dataset_spec(tmp_path), decoder, None)(raw)
    assert sample.caption == caption
    assert sample.__key__ == "k4" and sample.__restore_key__ == ("Webdataset", 4) and sample.__sources__ == raw["__sources__"]


def test_a_failing_decoder_of_the_users_own_names_shard_key_and_decoder(tmp_path):
    """A user decoder that raises, or returns no dict, fails the sample with SampleException naming shard, key and decoder."""
    write_dataset_yaml(tmp_path, "CaptioningSample", field_map={"image": "png", "caption": "txt"})
    spec = read_dataset_spec(tmp_path)
    with pytest.raises(SampleException, match=rf"{SHARD}: sample 'k5': decoder _OwnDecoder failed: UnicodeDecodeError"):
        SampleLoader(spec, _OwnDecoder(), None)(_raw("k5", png=PNG, txt=b"\xff"))
    with pytest.raises(SampleException, match=rf"{SHARD}: sample 'k6': decoder function must return .* got list"):
        SampleLoader(spec, lambda sample: [sample], None)(_raw("k6", png=PNG, txt=b"x"))


def test_trusting_a_decoder_of_the_users_own_leaves_it_as_it_is(tmp_path):
    """trust_dataset_code=True gives our decoder a trusting copy and keeps a decoder of the user's own (no with_trust)."""
    import energon_ray as er
    from tests.helpers import captioning_dataset

    class OwnDecoderTask(er.DefaultTaskEncoder):
        decoder = _OwnDecoder()

    path = captioning_dataset(tmp_path / "ds", n=3, per_shard=3)
    ds = er.get_val_dataset(path, split_part="train", batch_size=1, task_encoder=OwnDecoderTask(), trust_dataset_code=True)
    assert ds.decoder is OwnDecoderTask.decoder
    ours = SampleDecoder()
    assert trusting(ours).trust_dataset_code is True and ours.trust_dataset_code is False


# -- subflavors ---------------------------------------------------------------------------------


def test_subflavors_of_dataset_yaml_land_on_every_sample(classification):
    """subflavors written in dataset.yaml are parsed and set on each sample's __subflavors__."""
    _add_to_yaml(classification, subflavors={"source": "web", "quality": 2})
    spec = read_dataset_spec(classification)
    assert spec.subflavors == {"source": "web", "quality": 2}
    loader = SampleLoader(spec, SampleDecoder(), spec.subflavors)
    first = loader(_raw("a", jpg=JPG, json=META))
    second = loader(_raw("b", jpg=JPG, json=META))
    assert first.__subflavors__ == {"source": "web", "quality": 2}
    first.__subflavors__["source"] = "changed"
    assert second.__subflavors__ == {"source": "web", "quality": 2}


def test_subflavors_are_not_mistaken_for_extra_options(classification):
    """subflavors is consumed by the parser, not left among the extra YAML options."""
    _add_to_yaml(classification, subflavors={"a": 1})
    assert "subflavors" not in read_dataset_spec(classification).extra


# -- sample_loader -------------------------------------------------------------------------------


def test_sample_loader_and_part_filter_functions_are_used(loader_dataset):
    """sample_loader: loader.py:load builds the fields and part_filter: loader.py:parts selects parts."""
    spec = read_dataset_spec(loader_dataset, trusted=True)
    assert spec.wants_part("png") and spec.wants_part("txt") and not spec.wants_part("jpg")
    sample = SampleLoader(spec, SampleDecoder(image_decode="torchrgb8"), {"x": 1})(_raw("k7", png=PNG, txt=b"a dog"))
    assert isinstance(sample, CaptioningSample)
    assert sample.caption == "A DOG"
    assert sample.image.dtype == torch.uint8 and sample.image.shape == (3, H, W)
    assert sample.__key__ == "k7" and sample.__subflavors__ == {"x": 1}


def test_sample_loader_errors_are_wrapped_naming_the_sample(loader_dataset):
    """An exception inside the user's sample_loader becomes SampleException naming shard and key."""
    loader = SampleLoader(read_dataset_spec(loader_dataset, trusted=True), SampleDecoder(), None)
    with pytest.raises(SampleException) as info:
        loader(_raw("k8", txt=b"no image"))
    assert "k8" in str(info.value) and SHARD in str(info.value)


def test_sample_loader_returning_an_unknown_field_raises_naming_the_type(tmp_path):
    """A sample_loader result the sample type cannot take raises SampleException naming the type and key."""
    write_dataset_yaml(tmp_path, "TextSample", sample_loader="loader.py:load", part_filter=["txt"])
    (tmp_path / ".nv-meta" / "loader.py").write_text(
        "def load(raw):\n    return {'text': raw['txt'], 'colour': 'red'}\n"
    )
    with pytest.raises(SampleException) as info:
        SampleLoader(read_dataset_spec(tmp_path, trusted=True), SampleDecoder(), None)(_raw("k3", txt=b"x"))
    assert "TextSample" in str(info.value) and "k3" in str(info.value)


def test_part_filter_may_be_a_list(tmp_path):
    """part_filter given as a list of part names selects exactly those parts."""
    write_dataset_yaml(tmp_path, "CaptioningSample", sample_loader="loader.py:load", part_filter=["png", "txt"])
    (tmp_path / ".nv-meta" / "loader.py").write_text(LOADER_PY)
    spec = read_dataset_spec(tmp_path, trusted=True)
    assert spec.wants_part("txt") and not spec.wants_part("json")


def test_dataset_spec_pickles_by_rereading_the_yaml(loader_dataset):
    """A pickled DatasetSpec re-reads dataset.yaml when unpickled and loads samples the same way."""
    spec = read_dataset_spec(loader_dataset, trusted=True)
    clone = pickle.loads(pickle.dumps(spec))
    assert clone.trusted and clone.file == spec.file and clone.sample_type is CaptioningSample
    assert clone.wants_part("png") and not clone.wants_part("json")
    sample = SampleLoader(clone, SampleDecoder(), None)(_raw("k", png=PNG, txt=b"x y"))
    assert sample.caption == "X Y"


def test_dataset_spec_with_another_config_name_pickles(tmp_path):
    """A spec read from a non-default config file name re-reads that same file when unpickled."""
    write_dataset_yaml(tmp_path, "TextSample", field_map={"text": "txt"}, dataset_config="alt.yaml")
    spec = read_dataset_spec(tmp_path, dataset_config="alt.yaml")
    clone = pickle.loads(pickle.dumps(spec))
    assert clone.file.endswith("alt.yaml") and clone.sample_type is spec.sample_type
    assert clone.field_map == {"text": [["txt"]]}


def test_sample_loader_object_pickles(classification):
    """A SampleLoader (spec, decoder, subflavors) survives pickling and still builds samples."""
    loader = SampleLoader(read_dataset_spec(classification), SampleDecoder(image_decode="rgb8"), {"s": 1})
    clone = pickle.loads(pickle.dumps(loader))
    sample = clone(_raw("k", jpg=JPG, json=META))
    assert sample.label == 7 and sample.__subflavors__ == {"s": 1} and sample.image.shape == (H, W, 3)


def test_unpickled_spec_sees_changes_to_the_yaml(classification):
    """Because unpickling re-reads the file, an edited field_map is what the clone uses."""
    spec = read_dataset_spec(classification)
    payload = pickle.dumps(spec)
    new_map = {"image": "png", "label": "json[meta][id]"}
    write_dataset_yaml(classification, "ImageClassificationSample", field_map=new_map)
    clone = pickle.loads(payload)
    assert clone.parts == frozenset({"png", "json"})


# -- crude datasets ------------------------------------------------------------------------------


def test_crude_dataset_gives_crude_samples_with_decoded_parts(tmp_path):
    """A CrudeWebdataset yields CrudeSample dicts of decoded parts plus the meta keys."""
    write_dataset_yaml(tmp_path, "CrudeWebdataset", part_filter=["jpg", "txt"])
    spec = read_dataset_spec(tmp_path)
    assert spec.is_crude and spec.wants_part("jpg") and not spec.wants_part("json")
    crude = SampleLoader(spec, SampleDecoder(), {"k": "v"})(_raw("c1", jpg=JPG, txt=b"t"))
    assert isinstance(crude, CrudeSample)
    assert crude["txt"] == "t" and crude["jpg"].shape == (3, H, W)
    assert crude["__key__"] == "c1" and crude["__subflavors__"] == {"k": "v"}


def test_crude_sample_has_energons_keys_in_energons_order(tmp_path):
    """A crude sample holds __key__, __shard__, __restore_key__, __sources__, the parts, then __subflavors__ (Energon's dict)."""
    write_dataset_yaml(tmp_path, "CrudeWebdataset")
    crude = SampleLoader(read_dataset_spec(tmp_path), SampleDecoder(), {"k": "v"})(_raw("c1", txt=b"t", json=b"{}"))
    assert list(crude) == ["__key__", "__shard__", "__restore_key__", "__sources__", "txt", "json", "__subflavors__"]
    assert crude["__shard__"] == SHARD


def test_a_part_named_with_two_underscores_is_kept_as_energons_decoder_keeps_it(tmp_path):
    """A part like key.__meta is no meta key: kept in the reader's order, as text with a decoder (webdataset's rule for __ keys), as bytes without."""
    write_dataset_yaml(tmp_path, "CrudeWebdataset")
    raw = _raw("c1", txt=b"t", __meta=b"m\xc3\xa9", __bin=b"\xff")
    crude = SampleLoader(read_dataset_spec(tmp_path), SampleDecoder(), {})(raw)
    assert list(crude) == ["__key__", "__shard__", "__restore_key__", "__sources__", "txt", "__meta", "__bin", "__subflavors__"]
    assert (crude["txt"], crude["__meta"], crude["__bin"]) == ("t", "m\u00e9", b"\xff")
    assert SampleLoader(read_dataset_spec(tmp_path), None, {})(raw)["__meta"] == b"m\xc3\xa9"


# -- legacy top-level __class__ -------------------------------------------------------------------

LEGACY = [
    "Captioning",
    "Image",
    "ImageClassification",
    "OCR",
    "Text",
    "VQA",
    "VQAOCR",
    "MultiChoiceVQA",
    "VidQA",
    "Interleaved",
    "SimilarityInterleaved",
]


def _write_raw_yaml(root: Path, data: dict) -> None:
    meta = root / ".nv-meta"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "dataset.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def test_legacy_captioning_webdataset_yaml_loads_captioning_samples(tmp_path):
    """A legacy 'CaptioningWebdataset' dataset.yaml with a field_map yields CaptioningSamples with its subflavors."""
    _write_raw_yaml(
        tmp_path,
        {
            "__module__": "megatron.energon",
            "__class__": "CaptioningWebdataset",
            "field_map": {"image": "jpg", "caption": "txt"},
            "subflavors": {"legacy": True},
        },
    )
    spec = read_dataset_spec(tmp_path)
    assert spec.sample_type is CaptioningSample and spec.subflavors == {"legacy": True}
    sample = SampleLoader(spec, SampleDecoder(), spec.subflavors)(_raw("k", jpg=JPG, txt=b"old"))
    assert sample.caption == "old" and sample.__subflavors__ == {"legacy": True}


def test_a_legacy_class_is_warned_about_once_where_the_dataset_is_opened_and_never_when_rebuilt(tmp_path):
    """Energon's FutureWarning for `__class__: CaptioningWebdataset`, naming the file and the sample_type
    to write, once per file and process where the driver opens the dataset; rebuilding the spec (what
    a Ray worker does with the spec it is sent) is silent."""
    import warnings

    from energon_ray import WorkerConfig, get_val_dataset
    from energon_ray.format.dataset import PreparedDataset
    from energon_ray.synthetic import captioning_samples, write_shards
    from energon_ray.format.prepare import prepare_dataset

    write_shards(tmp_path / "shards", captioning_samples(3), 3)
    prepare_dataset(tmp_path, split_ratio=(1, 0, 0), sample_type="CaptioningSample",
                    field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
    config = tmp_path / ".nv-meta" / "dataset.yaml"
    _write_raw_yaml(tmp_path, {"__module__": "megatron.energon", "__class__": "CaptioningWebdataset",
                               "field_map": {"image": "jpg", "caption": "txt"}})  # fmt: skip
    with pytest.warns(FutureWarning) as caught:  # the user's get_val_dataset call opens it
        get_val_dataset(tmp_path, split_part="train", batch_size=1, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1))
    assert [str(w.message) for w in caught] == [
        f"{config}: __class__: CaptioningWebdataset is deprecated (as in megatron-energon): drop the top-level "
        "__module__/__class__ and write `sample_type: {__module__: megatron.energon, __class__: CaptioningSample}` "
        "instead, keeping the rest"
    ]
    assert [w.filename for w in caught] == [__file__]  # the user's call (was inside energon_ray: loader/factory.py)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opened = PreparedDataset.open(tmp_path, "train")
        rebuilt = pickle.loads(pickle.dumps(opened.spec))
        assert read_dataset_spec(tmp_path).legacy_class == rebuilt.legacy_class == "CaptioningWebdataset"
        assert PreparedDataset.open(tmp_path, "train").spec.sample_type is CaptioningSample


def test_every_legacy_webdataset_class_resolves_to_its_sample_type(tmp_path):
    """Each deprecated '<Name>Webdataset' __class__ resolves to energon_ray's '<Name>Sample'."""
    resolved, expected = {}, {}
    for name in LEGACY:
        root = tmp_path / name
        _write_raw_yaml(
            root,
            {
                "__module__": "megatron.energon",
                "__class__": f"{name}Webdataset",
                "sample_loader": "loader.py:load",
                "part_filter": ["png"],
            },
        )
        (root / ".nv-meta" / "loader.py").write_text(LOADER_PY)
        expected[name] = getattr(samples_module, f"{name}Sample").__name__
        try:
            resolved[name] = read_dataset_spec(root, trusted=True).sample_type.__name__
        except DatasetConfigError as exc:
            resolved[name] = f"DatasetConfigError: {exc}"
    assert resolved == expected


# -- read_dataset_spec errors --------------------------------------------------------------------


def test_unknown_sample_type_is_rejected_naming_file_and_type(tmp_path):
    """An unknown sample_type raises DatasetConfigError naming the file and the type."""
    write_dataset_yaml(tmp_path, "PhotoSample", field_map={"image": "jpg"})
    with pytest.raises(DatasetConfigError) as info:
        read_dataset_spec(tmp_path)
    assert "PhotoSample" in str(info.value) and "dataset.yaml" in str(info.value)


def test_field_map_with_an_unknown_field_names_file_field_and_type(tmp_path):
    """A field_map naming a field the type lacks raises naming the file, the field and the sample type."""
    write_dataset_yaml(tmp_path, "CaptioningSample", field_map={"image": "jpg", "caption": "txt", "colour": "json"})
    with pytest.raises(DatasetConfigError) as info:
        read_dataset_spec(tmp_path)
    message = str(info.value)
    assert str(tmp_path / ".nv-meta" / "dataset.yaml") in message
    assert "'colour'" in message and "CaptioningSample" in message


@pytest.mark.parametrize(
    "text, message",
    [
        ("sample_type: CaptioningSample\nfield_map: {image: 5, caption: txt}", r"field_map\['image'\] must be a part name .* got int 5$"),
        ("sample_type: CaptioningSample\nfield_map: {image: null, caption: txt}", r"field_map\['image'\] must be a part name .* got NoneType None$"),
        ("sample_type: CaptioningSample\nfield_map: {image: [jpg, png], caption: txt}", r"got list \['jpg', 'png'\]; alternatives are written 'jpg,png'"),
        ("sample_type: {__module__: 5, __class__: CaptioningSample}\nfield_map: {image: jpg, caption: txt}", r"sample_type __module__ must be a name, got int 5"),
        ("sample_type: {__class__: [1]}\nfield_map: {image: jpg, caption: txt}", r"sample_type __class__ must be a name, got list \[1\]"),
        ("__class__: 5\nfield_map: {image: jpg, caption: txt}", r"dataset __class__ must be a name, got int 5"),
        ("__module__: 5\n__class__: CaptioningWebdataset\nfield_map: {image: jpg, caption: txt}", r"dataset __module__ must be a name, got int 5"),
        ("sample_type: CaptioningSample\nsubflavors: [1, 2]\nfield_map: {image: jpg, caption: txt}", r"subflavors must be a mapping .* got list \[1, 2\]"),
        ("sample_type: CaptioningSample\nsubflavors: abc\nfield_map: {image: jpg, caption: txt}", r"subflavors must be a mapping .* got str 'abc'"),
    ],
)
def test_dataset_yaml_values_of_the_wrong_type_are_errors_naming_file_and_key(tmp_path, text, message):
    """Hand-written configs: a value of the wrong type is a DatasetConfigError naming the file and
    key (it was a bare AttributeError/TypeError, or a field mapped to a part named '5' or 'None')."""
    (tmp_path / ".nv-meta").mkdir()
    (tmp_path / ".nv-meta" / "dataset.yaml").write_text(text + "\n")
    with pytest.raises(DatasetConfigError, match=message) as info:
        read_dataset_spec(tmp_path)
    assert str(info.value).startswith(str(tmp_path / ".nv-meta" / "dataset.yaml") + ": ")


def test_field_map_may_not_set_meta_fields(tmp_path):
    """A field_map entry for __key__ is rejected like any field the type does not offer."""
    write_dataset_yaml(tmp_path, "CaptioningSample", field_map={"image": "jpg", "caption": "txt", "__key__": "json"})
    with pytest.raises(DatasetConfigError, match="__key__"):
        read_dataset_spec(tmp_path)


def test_field_map_missing_a_required_field_is_rejected(tmp_path):
    """A field_map that leaves out a required field (caption) raises naming it and the type."""
    write_dataset_yaml(tmp_path, "CaptioningSample", field_map={"image": "jpg"})
    with pytest.raises(DatasetConfigError) as info:
        read_dataset_spec(tmp_path)
    assert "caption" in str(info.value) and "CaptioningSample" in str(info.value)


def test_optional_fields_may_be_left_out_of_the_field_map(tmp_path):
    """Fields with defaults (label, label_name) need no field_map entry."""
    write_dataset_yaml(tmp_path, "ImageClassificationSample", field_map={"image": "jpg"})
    sample = SampleLoader(read_dataset_spec(tmp_path), SampleDecoder(), None)(_raw("k", jpg=JPG))
    assert sample.label is None and sample.label_name is None


def test_field_map_and_sample_loader_together_are_rejected(tmp_path):
    """Giving both field_map and sample_loader raises DatasetConfigError naming both."""
    write_dataset_yaml(
        tmp_path,
        "CaptioningSample",
        field_map={"image": "jpg", "caption": "txt"},
        sample_loader="loader.py:load",
        part_filter="loader.py:parts",
    )
    (tmp_path / ".nv-meta" / "loader.py").write_text(LOADER_PY)
    with pytest.raises(DatasetConfigError) as info:
        read_dataset_spec(tmp_path)
    assert "field_map" in str(info.value) and "sample_loader" in str(info.value)


def test_neither_field_map_nor_sample_loader_is_rejected(tmp_path):
    """A typed dataset.yaml with neither field_map nor sample_loader raises DatasetConfigError."""
    write_dataset_yaml(tmp_path, "CaptioningSample")
    with pytest.raises(DatasetConfigError):
        read_dataset_spec(tmp_path)


def test_sample_loader_without_part_filter_is_rejected(tmp_path):
    """sample_loader needs a part_filter, as in Energon."""
    write_dataset_yaml(tmp_path, "CaptioningSample", sample_loader="loader.py:load")
    (tmp_path / ".nv-meta" / "loader.py").write_text(LOADER_PY)
    with pytest.raises(DatasetConfigError, match="part_filter"):
        read_dataset_spec(tmp_path)


def test_sample_loader_naming_a_missing_function_is_rejected(tmp_path):
    """sample_loader: loader.py:nope raises naming the function."""
    write_dataset_yaml(tmp_path, "CaptioningSample", sample_loader="loader.py:nope", part_filter="loader.py:parts")
    (tmp_path / ".nv-meta" / "loader.py").write_text(LOADER_PY)
    with pytest.raises(DatasetConfigError, match="nope"):
        read_dataset_spec(tmp_path)


def test_missing_dataset_yaml_is_rejected_naming_the_path(tmp_path):
    """Without .nv-meta/dataset.yaml read_dataset_spec raises naming the missing file."""
    with pytest.raises(DatasetConfigError, match="dataset.yaml"):
        read_dataset_spec(tmp_path)


def test_dataset_config_error_is_a_value_error():
    """DatasetConfigError is a ValueError."""
    assert issubclass(DatasetConfigError, ValueError)


# -- a dataset runs no code unless trusted -----------------------------------------------------

@edataclass
class LocalSample(Sample):
    text: str


MARKER_PY = "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('yes')\n" + LOADER_PY


def test_untrusted_sample_loader_is_neither_imported_nor_run(tmp_path, monkeypatch):
    """Without the opt-in, a sample_loader/part_filter module is refused before it is imported; the
    error names dataset.yaml, the module file and the opt-in. With it, the module runs."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    write_dataset_yaml(tmp_path, "CaptioningSample", sample_loader="loader.py:load", part_filter="loader.py:parts")
    (tmp_path / ".nv-meta" / "loader.py").write_text(MARKER_PY)
    with pytest.raises(UntrustedCodeError) as info:
        read_dataset_spec(tmp_path)
    message = str(info.value)
    assert str(tmp_path / ".nv-meta" / "dataset.yaml") in message and "loader.py" in message
    assert "trust_dataset_code=True" in message and TRUST_ENV in message
    assert not (tmp_path / ".nv-meta" / "ran").exists()
    read_dataset_spec(tmp_path, trusted=True)
    assert (tmp_path / ".nv-meta" / "ran").read_text() == "yes"


def test_untrusted_crude_part_filter_module_is_refused(tmp_path):
    """A crude dataset's part_filter given as a module function needs the opt-in; a list does not."""
    _write_raw_yaml(tmp_path, {"__module__": "megatron.energon", "__class__": "CrudeWebdataset", "part_filter": "loader.py:parts"})
    (tmp_path / ".nv-meta" / "loader.py").write_text(MARKER_PY)
    with pytest.raises(UntrustedCodeError, match="part_filter"):
        read_dataset_spec(tmp_path)
    assert not (tmp_path / ".nv-meta" / "ran").exists()
    _write_raw_yaml(tmp_path, {"__module__": "megatron.energon", "__class__": "CrudeWebdataset", "part_filter": ["txt"]})
    assert read_dataset_spec(tmp_path).wants_part("txt")


def make_part_filter(wanted):
    """A part_filter factory, as a dataset.yaml names one with {__module__, __function__, wanted}."""
    return lambda part: part in wanted


def text_of(raw):
    return {"text": raw["txt"]}


def make_text_loader():
    return text_of


def test_a_sample_loader_or_part_filter_mapping_is_called_as_energon_and_needs_trust(tmp_path):
    """{__module__, __function__, **kwargs} (Energon calls the function with the kwargs) was read as a
    file name ('would execute .nv-meta/{'__module__'') and, in a crude dataset, ignored (every part read)."""
    here = "tests.unit.test_load"
    crude = {"__module__": "megatron.energon", "__class__": "CrudeWebdataset",
             "part_filter": {"__module__": here, "__function__": "make_part_filter", "wanted": ["txt"]}}
    _write_raw_yaml(tmp_path, crude)
    with pytest.raises(UntrustedCodeError, match=rf"\(part_filter {here}.make_part_filter would import module '{here}'\)"):
        read_dataset_spec(tmp_path)
    spec = read_dataset_spec(tmp_path, trusted=True)
    assert (spec.wants_part("txt"), spec.wants_part("jpg")) == (True, False)
    typed = {"sample_type": "TextSample", "sample_loader": {"__module__": here, "__function__": "make_text_loader"}, "part_filter": ["txt"]}
    _write_raw_yaml(tmp_path, typed)
    with pytest.raises(UntrustedCodeError, match=rf"\(sample_loader {here}.make_text_loader would import module '{here}'\)"):
        read_dataset_spec(tmp_path)
    assert read_dataset_spec(tmp_path, trusted=True).sample_loader is text_of
    _write_raw_yaml(tmp_path, {**crude, "part_filter": 5})
    with pytest.raises(DatasetConfigError) as info:
        read_dataset_spec(tmp_path, trusted=True)
    assert str(info.value) == (
        f"{tmp_path / '.nv-meta' / 'dataset.yaml'}: part_filter must be 'file.py:function' or a mapping of __module__ "
        "and __function__ (or __class__) with its arguments, got int 5"
    )


def test_untrusted_sample_type_may_only_name_our_classes(tmp_path):
    """sample_type from another module is not imported without the opt-in; megatron.energon and
    energon_ray names resolve to our classes either way."""
    _write_raw_yaml(tmp_path, {"sample_type": {"__module__": "tests.unit.test_load", "__class__": "LocalSample"}, "field_map": {"text": "txt"}})
    with pytest.raises(UntrustedCodeError, match="tests.unit.test_load.LocalSample"):
        read_dataset_spec(tmp_path)
    assert read_dataset_spec(tmp_path, trusted=True).sample_type is LocalSample
    for module in ("megatron.energon", "energon_ray", "megatron.energon.flavors"):
        _write_raw_yaml(tmp_path, {"sample_type": {"__module__": module, "__class__": "TextSample"}, "field_map": {"text": "txt"}})
        assert read_dataset_spec(tmp_path).sample_type is samples_module.TextSample


def test_trust_comes_from_the_environment_when_not_given(monkeypatch):
    """resolve_trust: an explicit bool wins; otherwise ENERGON_RAY_TRUST_DATASET_CODE=1 trusts."""
    monkeypatch.setenv(TRUST_ENV, "1")
    assert resolve_trust(None) is True and resolve_trust(False) is False
    monkeypatch.setenv(TRUST_ENV, "0")
    assert resolve_trust(None) is False and resolve_trust(True) is True
    monkeypatch.delenv(TRUST_ENV)
    assert resolve_trust(None) is False
    with pytest.raises(TypeError):
        resolve_trust("yes")


@pytest.mark.parametrize("text, kind", [("- sample_type: CaptioningSample\n", "list"), ("just a string\n", "str")])
def test_a_dataset_yaml_that_is_not_a_mapping_is_refused_naming_the_file(tmp_path, text, kind):
    """A dataset.yaml holding a list or a scalar gets a DatasetConfigError naming the file and what
    it holds, not a TypeError from deep inside the parser."""
    meta = tmp_path / ".nv-meta"
    meta.mkdir()
    (meta / "dataset.yaml").write_text(text)
    with pytest.raises(DatasetConfigError, match=rf"dataset\.yaml: expected a mapping .* got a {kind}"):
        read_dataset_spec(tmp_path)


# -- JSONL ----------------------------------------------------------------------------------------


def _jsonl_raw(line: bytes, index: int = 2) -> Dict:
    """A JSONL line as the reader yields it."""
    return {
        "json": line,
        "__key__": str(index),
        "__shard__": "corpus.jsonl",
        "__restore_key__": ("Webdataset", index),
        "__sources__": (SourceInfo(dataset_path="/d/corpus.jsonl", index=index, shard_name="corpus.jsonl", file_names=(f"{index}.json",)),),
    }


@pytest.mark.parametrize("decoder", [None, SampleDecoder(), SampleDecoder(image_decode="pil")])
def test_jsonl_json_is_parsed_whatever_the_decoder_in_energons_key_order(decoder):
    """A JSONL sample's json is a dict also with decoder None (Energon's loader always parses it); keys in Energon's order."""
    from energon_ray.format.jsonl import jsonl_spec

    crude = SampleLoader(jsonl_spec("/d/corpus.jsonl"), decoder, {"k": 1})(_jsonl_raw(b'{"a": [1, 2]}'))
    assert isinstance(crude, CrudeSample) and crude["json"] == {"a": [1, 2]}
    assert list(crude) == ["__key__", "__restore_key__", "__shard__", "__sources__", "__subflavors__", "json"]
    assert crude["__subflavors__"] == {"k": 1} and crude["__shard__"] == "corpus.jsonl"


def test_jsonl_json_stays_bytes_for_the_raw_factory():
    """parse_json=False (CrudeJsonlDatasetFactory) keeps the line's bytes."""
    from energon_ray.format.jsonl import jsonl_spec

    crude = SampleLoader(jsonl_spec("/d/corpus.jsonl"), None, None, parse_json=False)(_jsonl_raw(b'{"a": 1}'))
    assert crude["json"] == b'{"a": 1}'


def test_a_bad_jsonl_line_names_file_key_and_part():
    """A line that is no JSON: SampleException naming the file, the sample key (line index) and the part."""
    from energon_ray.format.jsonl import jsonl_spec

    with pytest.raises(SampleException) as info:
        SampleLoader(jsonl_spec("/d/corpus.jsonl"), None, None)(_jsonl_raw(b'{"a": 2, bad}', index=5))
    assert str(info.value).startswith("corpus.jsonl: sample '5': cannot decode part 'json' (13 bytes): JSONDecodeError: ")


def test_a_jsonl_line_over_max_part_bytes_is_refused_before_parsing():
    """A line longer than the decoder's max_part_bytes is a SampleException naming file, key, part and
    the limit (a counted skip), not parsed; at the limit it parses."""
    from energon_ray.format.jsonl import jsonl_spec

    line = json.dumps({"text": "x" * 100}).encode()
    small = SampleLoader(jsonl_spec("/d/corpus.jsonl"), SampleDecoder(max_part_bytes=len(line) - 1), None)
    with pytest.raises(MediaTooLargeError) as info:
        small(_jsonl_raw(line, index=4))
    assert str(info.value) == (
        f"corpus.jsonl: sample '4': cannot decode part 'json' ({len(line)} bytes): over the limit of {len(line) - 1} bytes "
        "per part (max_part_bytes); raise it with SampleDecoder(max_part_bytes=...) (None: no limit)"
    )
    exact = SampleLoader(jsonl_spec("/d/corpus.jsonl"), SampleDecoder(max_part_bytes=len(line)), None)
    assert exact(_jsonl_raw(line))["json"] == {"text": "x" * 100}


def test_a_too_deeply_nested_jsonl_line_is_a_sample_error_not_a_fatal_one():
    """A line nested deeper than Python's recursion limit (json raises RecursionError, which the
    error policy would treat as fatal and stop the loader) is a SampleException naming file, key
    and part, as a tar's .json part is: a counted skip under the skip policy."""
    from energon_ray.format.jsonl import jsonl_spec

    line = b"[" * 100000 + b"]" * 100000
    with pytest.raises(SampleException) as info:
        SampleLoader(jsonl_spec("/d/corpus.jsonl"), None, None)(_jsonl_raw(line, index=3))
    assert str(info.value).startswith("corpus.jsonl: sample '3': cannot decode part 'json' (200000 bytes): RecursionError: ")


def test_deprecation_advice_is_shown_to_code_in_a_users_module(tmp_path):
    """A deprecated typed factory or decoder argument used from a user's module (not ``__main__``) warns
    on stderr under Python's default filters: a FutureWarning, Energon's category (a DeprecationWarning
    would be hidden there), at the user's line (the decoder argument's pointed into energon_ray)."""
    import os
    import subprocess
    import sys

    from tests.helpers import captioning_dataset

    path = captioning_dataset(tmp_path / "ds", n=4, per_shard=2)
    (tmp_path / "user_code.py").write_text(
        "import energon_ray as er\n"
        f"path = {str(path)!r}\n"
        "wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1)\n"
        "er.CaptioningWebdataset(path, split_part='train', training=False, worker_config=wc,\n"
        "                        field_map={'image': 'jpg', 'caption': 'txt'})\n"
        "er.get_val_dataset(path, split_part='train', batch_size=None, worker_config=wc, image_decode='pil')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[2])])
    done = subprocess.run([sys.executable, "-c", "import user_code"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    user_code = tmp_path / "user_code.py"
    assert f"{user_code}:4: FutureWarning: CaptioningWebdataset is deprecated: in " in done.stderr
    assert f"{user_code}:6: FutureWarning: ['image_decode'] are deprecated arguments of get_train_dataset/get_val_dataset" in done.stderr
