"""Metadataset YAML parsing (no Ray): flattening, weights, subflavors, subsets, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from energon_ray.blend.metadataset import is_metadataset_path, parse_file
from energon_ray.errors import DatasetConfigError


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("coco", "coyo", "ocr"):
        (tmp_path / name).mkdir()
    return tmp_path


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_v2_blend_weights_subflavors_subsets(tree):
    """Weights are normalised, subflavors and split parts and subset ranges land on the leaves."""
    f = _write(tree / "mix.yaml", """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - {weight: 5, path: ./coco, subflavors: {aug: small}}
      - {weight: 2, path: ./coyo, subset: {range: [0%, 80%]}}
      - {weight: 1, path: ./coyo, split_part: val}
""")
    flat = parse_file(f, "train")
    assert flat.mode == "blend"
    assert [(l.path.name, l.split_part, round(l.weight, 4)) for l in flat.leaves] == [
        ("coco", "train", 0.625), ("coyo", "train", 0.25), ("coyo", "val", 0.125)
    ]
    assert flat.leaves[0].subflavors == {"aug": "small"} and flat.leaves[1].ratio == (0.0, 0.8)


def test_nested_blends_multiply_and_outer_subflavors_win(tree):
    """A nested YAML's weights multiply with the outer ones; outer subflavors override inner ones."""
    _write(tree / "inner.yaml", """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - {weight: 3, path: ./coyo, subflavors: {src: coyo, level: inner}}
      - {weight: 1, path: ./ocr, subset: {range: [50%, 100%]}}
""")
    f = _write(tree / "outer.yaml", """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - {weight: 1, path: ./coco}
      - {weight: 1, path: ./inner.yaml, subflavors: {level: outer}, subset: {range: [0%, 50%]}}
""")
    flat = parse_file(f, "train")
    weights = {l.path.name: round(l.weight, 4) for l in flat.leaves}
    assert weights == {"coco": 0.5, "coyo": 0.375, "ocr": 0.125}
    coyo = next(l for l in flat.leaves if l.path.name == "coyo")
    assert coyo.subflavors == {"src": "coyo", "level": "outer"}
    ocr = next(l for l in flat.leaves if l.path.name == "ocr")
    assert ocr.ratio == (0.5, 0.75)


def test_blend_epochized_repetitions_and_absolute_subset(tree):
    """blend_epochized carries repetitions (fractional too); absolute subsets stay at the leaves."""
    f = _write(tree / "ep.yaml", """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend_epochized:
      - {repetitions: 2, path: coco, subset: {range: [10, end]}}
      - {repetitions: 0.5, path: coyo}
""")
    flat = parse_file(f, "train")
    assert flat.mode == "blend_epochized"
    assert [(l.repetitions, l.absolute) for l in flat.leaves] == [(2.0, (10, None)), (0.5, None)]


def test_v1_metadataset(tree):
    """A V1 file (splits → datasets with weights, subflavor) becomes a blend."""
    f = _write(tree / "v1.yaml", """
splits:
  train:
    datasets:
      - {weight: 1, path: coco, subflavor: a}
      - {weight: 3, path: coyo, subflavors: {x: 1}}
""")
    with pytest.warns(FutureWarning) as caught:
        flat = parse_file(f, "train")
    assert [round(l.weight, 2) for l in flat.leaves] == [0.25, 0.75]
    assert flat.leaves[0].subflavors == {"__subflavor__": "a"}
    assert [str(w.message) for w in caught] == [
        f"{f}: splits.train.blend[0]: subflavor is deprecated (as in megatron-energon), use subflavors instead: "
        "`subflavors: {__subflavor__: 'a'}` gives the samples the same __subflavors__"
    ]
    assert [w.filename for w in caught] == [__file__]  # the user's call (was metadataset.py, inside energon_ray)


def test_the_subflavor_warning_is_given_once_per_node_and_process(tree):
    """Reading the same V1 file again (val datasets are built one leaf at a time) warns no more."""
    import warnings

    f = _write(tree / "v1again.yaml", "splits:\n  train:\n    datasets:\n      - {weight: 1, path: coco, subflavor: b}\n")
    with pytest.warns(FutureWarning, match=r"v1again\.yaml: splits\.train\.blend\[0\]: subflavor is deprecated"):
        parse_file(f, "train")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parse_file(f, "train").leaves[0].subflavors == {"__subflavor__": "b"}


@pytest.mark.parametrize(
    "split,got",
    [("[{path: coco}]", "[{'path': 'coco'}]"), ("{datasets: []}", "{'datasets': []}"), ("coco", "'coco'"), ("", "None")],
)
def test_a_bad_v1_split_names_file_node_and_value(tree, split, got):
    """A V1 split that is a list (not ``{datasets: [...]}``) raised AttributeError; now file, node and value are named."""
    f = _write(tree / "v1bad.yaml", f"splits:\n  train: {split}\n")
    with pytest.raises(DatasetConfigError) as info:
        parse_file(f, "train")
    assert str(info.value) == f"{f}: splits.train: a V1 split needs a mapping with a non-empty 'datasets' list, got {got}"


@pytest.mark.parametrize(
    "body,message",
    [
        ("blend: [{weight: -1, path: coco}]", r"splits.train.blend\[0\]: weight must be a finite number >= 0, got -1"),
        ("blend: [{weight: .nan, path: coco}]", r"weight must be a number, got '.nan'"),  # text in Energon's YAML too
        ("blend: [{weight: nan, path: coco}]", r"weight must be a finite number >= 0, got 'nan'"),
        ("blend: [{weight: 1e999, path: coco}]", r"weight must be a finite number >= 0, got inf"),
        ("blend: [{weight: 0, path: coco}, {weight: 0, path: coyo}]", r"splits.train.blend: weights \[0.0, 0.0\] are all zero"),
        ("blend: [{weight: 1e308, path: coco}, {weight: 1e308, path: coyo}]", r"splits.train.blend: weights \[1e\+308, 1e\+308\] sum to inf \(too large for a float\); scale them down"),
        ("blend: [{weight: 1, path: missing}]", r"splits.train.blend\[0\]: path 'missing' does not exist"),
        ("blend: [{weight: 1, path: coco, blend_epochized: []}]", r"exactly one of path, blend, blend_epochized"),
        ("blend: [{weight: 1, blend_epochized: [{path: coco}]}]", r"cannot combine 'blend' and 'blend_epochized'"),
        ("blend_epochized: [{repetitions: 0, path: coco}]", r"repetitions must be a finite number > 0"),
        ("blend: []", r"splits.train.blend: must be a non-empty list"),
        ("{path: coco, subset: {range: [0%, 10]}}", r"mixes percentages and sample indices"),
        ("{path: coco, subset: {range: [a%, 50%]}}", r"splits.train: subset bounds are 'N%', sample indices or 'end', got 'a%'"),
        ("{path: coco, colour: red}", r"unknown keys \['colour'\]"),
        ("{path: coco, shuffle_over_epochs_multiplier: 0}", r"splits.train: shuffle_over_epochs_multiplier must be a positive int, -1 .* got 0"),
        ("blend: [{path: coco, shuffle_over_epochs_multiplier: 1.5}]", r"splits.train.blend\[0\]: shuffle_over_epochs_multiplier .* got 1.5"),
        ("{path: coco, subflavors: small}", r"splits.train: subflavors must be a mapping of names to values, got 'small'"),
        ("blend: [{path: coco, subflavors: [aug, small]}]", r"splits.train.blend\[0\]: subflavors must be a mapping.*got \['aug', 'small'\]"),
    ],
)
def test_bad_metadatasets_name_file_node_and_value(tree, body, message):
    """Bad YAML raises DatasetConfigError naming the file, the node and the value."""
    node = body if body.startswith("{") else "{" + body + "}"
    f = _write(tree / "bad.yaml", f"__class__: MetadatasetV2\nsplits:\n  train: {node}\n")
    with pytest.raises(DatasetConfigError, match=message) as info:
        parse_file(f, "train")
    assert "bad.yaml" in str(info.value)


def test_an_unknown_top_level_key_is_refused_as_energon_refuses_it(tree):
    """``subflavours:`` beside ``splits:`` (misspelled) would do nothing: named, with the keys a
    metadataset has (Energon: "Unexpected arguments")."""
    f = _write(tree / "top.yaml", "__module__: megatron.energon\n__class__: MetadatasetV2\nsubflavours: {x: 1}\nsplits:\n  train: {path: coco}\n")
    with pytest.raises(DatasetConfigError, match=r"top.yaml.*top level.*unknown keys \['subflavours'\]; a metadataset has \['__class__', '__module__', 'path', 'splits'\]"):
        parse_file(f, "train")


@pytest.mark.parametrize(
    "body,message",
    [
        ("blend: [{weight: 1, path: coco}, {weight: 1, path: coyo, repetitions: 3}]",
         r"bad.yaml: splits.train.blend\[1\]: 'repetitions' \(3\) only applies to an entry of a 'blend_epochized' list"),
        ("blend_epochized: [{path: coco, weight: 5}, {path: coyo}]",
         r"bad.yaml: splits.train.blend_epochized\[0\]: 'weight' \(5\) only applies to an entry of a 'blend' list"),
        ("{path: coco, weight: 3}", r"bad.yaml: splits.train: 'weight' \(3\) only applies to an entry of a 'blend' list"),
        ("{path: coco, joiner: x}", r"bad.yaml: splits.train: 'joiner' only applies to a 'join' node"),
        ("{blend: [{path: coco}], dataset_config: other.yaml}",
         r"bad.yaml: splits.train: \['dataset_config'\] only apply to a 'path' to a prepared dataset"),
        ("blend: [{path: inner.yaml, aux: {x: ocr}}]",
         r"bad.yaml: splits.train.blend\[0\]: \['aux'\] cannot be set on a reference to a metadataset \(inner.yaml\)"),
        ("blend: [{path: inner.yaml, split_config: other.yaml}]",
         r"bad.yaml: splits.train.blend\[0\]: \['split_config'\] cannot be set on a reference to a metadataset"),
    ],
)
def test_a_key_the_node_would_ignore_is_refused_naming_file_and_node(tree, body, message):
    """``repetitions`` in a ``blend`` entry, ``weight`` in a ``blend_epochized`` entry or outside a
    blend, and a dataset's ``dataset_config``/``split_config``/``aux`` on a blend or on a reference
    to another metadataset were accepted and read nowhere: the mix silently ignored them (Energon's
    schema refuses each)."""
    _write(tree / "inner.yaml", "__class__: MetadatasetV2\nsplits:\n  train: {path: coco}\n")
    node = body if body.startswith("{") else "{" + body + "}"
    f = _write(tree / "bad.yaml", f"__class__: MetadatasetV2\nsplits:\n  train: {node}\n")
    with pytest.raises(DatasetConfigError, match=message):
        parse_file(f, "train")


def test_a_top_level_path_says_where_relative_paths_start(tree, monkeypatch):
    """Energon's top-level ``path:`` (the file a metadataset stands for) was refused as an unknown
    key: relative paths start from its folder (a relative one from the working directory), in V2 and
    V1 alike, as in Energon; one that is not a string is named."""
    (tree / "elsewhere").mkdir()
    v2 = _write(tree / "elsewhere" / "v2.yaml", "__class__: MetadatasetV2\npath: ../stands.yaml\nsplits:\n  train: {blend: [{path: coco}, {path: ocr}]}\n")
    v1 = _write(tree / "elsewhere" / "v1.yaml", f"__class__: Metadataset\npath: {tree / 'x.yaml'}\nsplits:\n  train: {{datasets: [{{path: coyo}}]}}\n")
    monkeypatch.chdir(tree / "elsewhere")
    assert [leaf.path for leaf in parse_file(v2, "train").leaves] == [tree / "coco", tree / "ocr"]
    assert [leaf.path for leaf in parse_file(v1, "train").leaves] == [tree / "coyo"]
    bad = _write(tree / "bad.yaml", "__class__: MetadatasetV2\npath: 3\nsplits:\n  train: {path: coco}\n")
    with pytest.raises(DatasetConfigError, match=r"bad.yaml: path: a metadataset's top-level path is the file it stands for .*, a string; got 3"):
        parse_file(bad, "train")


def test_unknown_split_and_detection(tree):
    """Unknown split parts are named; YAML files and dicts count as metadatasets, folders do not."""
    f = _write(tree / "m.yaml", "__class__: MetadatasetV2\nsplits:\n  train: {path: coco}\n")
    with pytest.raises(DatasetConfigError, match=r"unknown split part 'val'; the file defines \['train'\]"):
        parse_file(f, "val")
    assert is_metadataset_path(f) and is_metadataset_path({"splits": {}}) and not is_metadataset_path(tree / "coco")


def test_a_joins_own_shuffle_over_epochs_multiplier_is_not_applied_as_in_energon(tree):
    """Energon's join shuffles by its caller's multiplier and ignores its own node's (its batches are
    those without it); it was applied (3 here), giving other batches. A referencing entry's still
    multiplies, as for any dataset; a bad value on the join is still named."""
    join = ("{shuffle_over_epochs_multiplier: 3, join: [{path: coco}, {path: coyo}], "
            "joiner: {__module__: megatron.energon, __class__: TextSample}}")
    inner = _write(tree / "inner.yaml", f"__class__: MetadatasetV2\nsplits:\n  train: {join}\n")
    outer = _write(tree / "outer.yaml", "__class__: MetadatasetV2\nsplits:\n  train: {blend: [{path: inner.yaml, shuffle_over_epochs_multiplier: 2}]}\n")
    assert [leaf.shuffle_over_epochs for leaf in parse_file(inner, "train").leaves] == [1]
    assert [leaf.shuffle_over_epochs for leaf in parse_file(outer, "train").leaves] == [2]
    bad = _write(tree / "bad.yaml", "__class__: MetadatasetV2\nsplits:\n  train: " + join.replace(": 3,", ": 0,") + "\n")
    with pytest.raises(DatasetConfigError, match=r"bad.yaml: splits.train: shuffle_over_epochs_multiplier must be .*, got 0"):
        parse_file(bad, "train")


@pytest.mark.parametrize("node, where, raw", [
    ("path: ../../ds", "splits.train", "../../ds"),
    ("path: ds\n    aux:\n      media: filesystem://../../media", "splits.train.aux.media", "../../media"),
    ("join:\n      - path: ds\n      - path: ../../other\n    joiner: {__module__: m, __function__: f}", "splits.train.join[1]", "../../other"),
])  # fmt: skip
def test_a_path_above_the_bucket_of_a_yaml_in_a_bucket_names_the_file_and_node(node, where, raw):
    """A relative path in a YAML in a bucket that leads above the bucket is a DatasetConfigError naming the
    file and the node, like every other metadataset error (it was a bare ValueError naming neither)."""
    import yaml

    from energon_ray.blend.metadataset import parse
    from energon_ray.storage import RemotePath

    data = yaml.safe_load(f"__class__: MetadatasetV2\nsplits:\n  train:\n    {node}\n")
    file = "s3://bkt/data/mix.yaml"
    with pytest.raises(DatasetConfigError) as exc:
        parse(data, file, RemotePath("s3://bkt/data", settings="x"), "train", check=False)
    assert str(exc.value) == f"{file}: {where}: path {raw!r}: s3://bkt/data/{raw}: the path leads above the bucket or profile root"


def test_a_url_without_a_bucket_names_the_file_and_node(tmp_path):
    """`path: s3:///ds` (no bucket) is a DatasetConfigError naming the file and the node (a bare ValueError before)."""
    f = _write(tmp_path / "mix.yaml", "__class__: MetadatasetV2\nsplits:\n  train:\n    path: s3:///ds\n")
    with pytest.raises(DatasetConfigError, match=r"mix\.yaml: splits\.train: path 's3:///ds': 's3:///ds' is not a storage URL"):
        parse_file(f, "train")


def test_an_msc_profile_no_config_defines_names_the_file_and_node(tmp_path, monkeypatch):
    """`path: msc://nope/ds` with no MSC config defining `nope` is a DatasetConfigError naming the file and the
    node (a StorageError naming only the profile before)."""
    pytest.importorskip("multistorageclient")
    config = _write(tmp_path / "msc.yaml", "profiles:\n  other:\n    storage_provider:\n      type: file\n      options:\n        base_path: /\n")
    monkeypatch.setenv("MSC_CONFIG", str(config))
    f = _write(tmp_path / "mix.yaml", "__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - path: msc://nope/ds\n")
    with pytest.raises(DatasetConfigError) as exc:
        parse_file(f, "train")
    assert str(exc.value) == (
        f"{f}: splits.train.blend[0]: path 'msc://nope/ds': msc://nope: profile 'nope' is not defined in the MSC config ({config})"
    )
