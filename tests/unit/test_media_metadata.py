"""Media metadata: Energon's JSON form, the ``media_metadata`` table of ``index.sqlite`` (written by
``energon-ray prepare --media-metadata-by-…`` and by Energon, read by both), and ``AVWebdatasetDecoder``."""

from __future__ import annotations

import inspect
import io
import json
import re
import sqlite3
import tarfile
from pathlib import Path
from typing import Dict, List, Tuple

import megatron.energon.av as energon_av
import megatron.energon.media as energon_media
import pytest
from click.testing import CliRunner
from megatron.energon.cache.file_store import WebdatasetFileStore
from megatron.energon.epathlib import EPath
from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory
from megatron.energon.media.extractor import MediaFilterConfig
from PIL import Image

from energon_ray import SampleDecoder
from energon_ray.cache.stores import DatasetFileStore
from energon_ray.av import AVData, AVDecoder, AVWebdatasetDecoder
from energon_ray.cli.main import main
from energon_ray.cli.prepare import prepare_command
from energon_ray.errors import DatasetConfigError
from energon_ray.format.media_index import MediaFilter
from energon_ray.format.prepare import prepare_dataset
from energon_ray.media import (
    AVMetadata,
    ImageMetadata,
    MediaMetadataBase,
    MediaMetadataType,
    deserialize_media_metadata,
    serialize_media_metadata,
)
from energon_ray.synthetic_media import encode_video, encode_wav, tone, video_frames
from tests.helpers import ONE_PROCESS

IMAGE = ImageMetadata(width=4, height=3, format="PNG", mode="RGB")
AV = AVMetadata(video_duration=0.3, video_num_frames=3, video_fps=10.0, video_width=16, video_height=16)


def _image(fmt: str, size: Tuple[int, int], mode: str) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 128).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def members() -> List[Tuple[str, bytes]]:
    return [
        ("s0.png", _image("PNG", (4, 3), "RGB")),
        ("s0.txt", b"hello"),
        ("s1.jpg", _image("JPEG", (5, 2), "L")),
        ("s1.wav", encode_wav(tone(0, 0.25, 8000), 8000)),
        ("s2.mp4", encode_video(video_frames(0, 3, (16, 16)))),
        ("s2.dat", _image("GIF", (2, 2), "P")),  # an image only its header tells
        ("s3.png", b"not an image"),  # unreadable: no row
    ]


#: What both prepares store with --media-metadata-by-extension (s2.dat only by header).
EXPECTED = {
    "s0.png": ("image", {"width": 4, "height": 3, "format": "PNG", "mode": "RGB"}),
    "s1.jpg": ("image", {"width": 5, "height": 2, "format": "JPEG", "mode": "L"}),
    "s1.wav": ("av", {"audio_duration": 0.25, "audio_channels": 1, "audio_sample_rate": 8000, "audio_num_samples": 2000}),
    "s2.mp4": ("av", {"video_duration": 0.3, "video_num_frames": 3, "video_fps": 10.0, "video_width": 16, "video_height": 16}),
}
BY_HEADER = {**EXPECTED, "s2.dat": ("image", {"width": 2, "height": 2, "format": "GIF", "mode": "P"})}


def _write(root: Path, members: List[Tuple[str, bytes]]) -> Path:
    root.mkdir(parents=True)
    with tarfile.open(root / "data.tar", "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return root


def _ours(root: Path, members, **filter_args) -> Path:
    _write(root, members)
    result = prepare_dataset(root, split_ratio=[1, 0, 0], progress=False, media_filter=MediaFilter.parse(**filter_args))
    assert result.media_metadata == sum(1 for _ in _rows(root))
    return root


def _theirs(root: Path, members, header: bool = False) -> Path:
    _write(root, members)
    BaseWebdatasetFactory.prepare_dataset(
        root, ["data.tar"], split_parts_ratio=[("train", 1.0)], workers=1,
        media_filter=MediaFilterConfig.parse(None, header, not header),
    )  # fmt: skip
    return root


def _rows(root: Path) -> List[Tuple[str, str, str]]:
    with sqlite3.connect(root / ".nv-meta" / "index.sqlite") as db:
        return db.execute("SELECT * FROM media_metadata ORDER BY entry_key").fetchall()


def _table(root: Path) -> Dict[str, Tuple[str, dict]]:
    return {key: (kind, json.loads(text)) for key, kind, text in _rows(root)}


def _assert_table(found: Dict[str, Tuple[str, dict]], expected: Dict[str, Tuple[str, dict]]) -> None:
    assert sorted(found) == sorted(expected)
    for key, (kind, payload) in expected.items():
        assert found[key][0] == kind, key
        assert _close(found[key][1], payload), (key, found[key][1], payload)


def _close(found: dict, expected: dict) -> bool:
    """Equal dicts, floats to 1e-9 relative (Energon stores 0.30000000000000004 where we store 0.3)."""
    return found.keys() == expected.keys() and all(
        found[k] == pytest.approx(v, rel=1e-9) if isinstance(v, float) else found[k] == v for k, v in expected.items()
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, members) -> Tuple[Path, Path]:
    base = tmp_path_factory.mktemp("media")
    return _ours(base / "ours", members, extension=True), _theirs(base / "theirs", members)


def test_serialized_form_is_energons_both_ways():
    """Our serialize gives Energon's exact (type, JSON); each side deserializes the other's into equal fields."""
    energon_image = energon_media.ImageMetadata(width=4, height=3, format="PNG", mode="RGB")
    energon_avm = energon_media.AVMetadata(**AV.to_dict())
    for ours, theirs in ((IMAGE, energon_image), (AV, energon_avm)):
        kind, text = serialize_media_metadata(ours)
        their_kind, their_text = energon_media.serialize_media_metadata(theirs)
        assert (kind.value, text) == (their_kind.value, their_text)
        assert energon_media.deserialize_media_metadata(kind.value, text) == theirs
        assert deserialize_media_metadata(their_kind, their_text) == ours
    assert serialize_media_metadata(IMAGE) == (MediaMetadataType.IMAGE, '{"width":4,"height":3,"format":"PNG","mode":"RGB"}')
    assert deserialize_media_metadata("av", "") == AVMetadata()
    assert [m.value for m in MediaMetadataType] == [m.value for m in energon_media.MediaMetadataType] == ["av", "image"]
    assert isinstance(AV, MediaMetadataBase) and AVMetadata.metadata_type is MediaMetadataType.AV


def test_bad_stored_metadata_raises_value_errors_naming_the_problem():
    """Unknown types, non-object JSON, unknown and missing fields are ValueErrors that say which."""
    with pytest.raises(ValueError, match="unknown media metadata type 'video'"):
        deserialize_media_metadata("video", "{}")
    with pytest.raises(ValueError, match="must be a JSON object"):
        deserialize_media_metadata("image", "[1]")
    with pytest.raises(ValueError, match=r"ImageMetadata has no fields \['depth'\]"):
        deserialize_media_metadata("image", '{"width":1,"height":1,"format":"PNG","mode":"L","depth":8}')
    with pytest.raises(ValueError, match=r"ImageMetadata needs the fields \['mode'\]"):
        deserialize_media_metadata("image", '{"width":1,"height":1,"format":"PNG"}')
    with pytest.raises(TypeError, match="expected ImageMetadata or AVMetadata, got dict"):
        serialize_media_metadata({"width": 1})  # type: ignore[arg-type]


def test_prepare_by_extension_writes_energons_table(prepared):
    """Both prepares store the same rows (AV floats to 1e-9), table layout and filter row."""
    ours, theirs = prepared
    _assert_table(_table(ours), EXPECTED)
    _assert_table(_table(theirs), EXPECTED)
    for root in prepared:
        with sqlite3.connect(root / ".nv-meta" / "index.sqlite") as db:
            assert db.execute("SELECT strategy, patterns FROM media_filters").fetchall() == [("EXTENSION", "")]
    with sqlite3.connect(ours / ".nv-meta" / "index.sqlite") as a, sqlite3.connect(theirs / ".nv-meta" / "index.sqlite") as b:
        for table in ("media_metadata", "media_filters"):
            assert a.execute(f"PRAGMA table_info({table})").fetchall() == b.execute(f"PRAGMA table_info({table})").fetchall()


def test_each_reader_reads_the_others_table(prepared):
    """Energon's WebdatasetFileStore reads our table; our DatasetFileStore reads Energon's."""
    ours, theirs = prepared
    energon_store = WebdatasetFileStore(EPath(ours))
    assert energon_store.get_media_metadata("s0.png") == energon_media.ImageMetadata(width=4, height=3, format="PNG", mode="RGB")
    assert energon_store.get_media_metadata("s1.wav").audio_num_samples == 2000
    store = DatasetFileStore(theirs)
    assert store.get_media_metadata("s0.png") == IMAGE
    assert store.get_media_metadata("s1.jpg") == ImageMetadata(width=5, height=2, format="JPEG", mode="L")
    video = store.get_media_metadata("s2.mp4")
    assert isinstance(video, AVMetadata) and _close(video.to_dict(), AV.to_dict())
    assert DatasetFileStore(ours).get_media_metadata("s2.mp4") == AV
    with pytest.raises(KeyError, match="no media metadata for 's0.txt'"):
        store.get_media_metadata("s0.txt")


def test_prepare_by_header_matches_energon(tmp_path, members):
    """--media-metadata-by-header also finds the GIF stored as s2.dat, in both."""
    ours = _ours(tmp_path / "ours", members, header=True)
    theirs = _theirs(tmp_path / "theirs", members, header=True)
    _assert_table(_table(ours), BY_HEADER)
    _assert_table(_table(theirs), BY_HEADER)


def test_prepare_by_glob_stores_only_matching_entries(tmp_path, members):
    """--media-metadata-by-glob '*.png,*.dat' stores the readable matches (kind by header) and records the patterns."""
    root = _ours(tmp_path / "ds", members, glob="*.png,*.dat")
    _assert_table(_table(root), {k: BY_HEADER[k] for k in ("s0.png", "s2.dat")})
    with sqlite3.connect(root / ".nv-meta" / "index.sqlite") as db:
        assert db.execute("SELECT strategy, patterns FROM media_filters").fetchall() == [("GLOB", "*.png,*.dat")]


def test_store_without_media_metadata_says_how_to_make_it(tmp_path, members):
    """A dataset prepared without a media filter has no table: DatasetConfigError naming the option."""
    root = _write(tmp_path / "plain", members)
    assert prepare_dataset(root, split_ratio=[1, 0, 0], progress=False).media_metadata is None
    with pytest.raises(DatasetConfigError, match="--media-metadata-by-extension"):
        DatasetFileStore(root).get_media_metadata("s0.png")


def test_filter_arguments_are_checked(tmp_path):
    """Exactly one strategy; empty globs and tar_index_only combinations are refused."""
    with pytest.raises(ValueError, match="exactly one of"):
        MediaFilter.parse(header=True, extension=True)
    with pytest.raises(ValueError, match="exactly one of"):
        MediaFilter.parse()
    with pytest.raises(ValueError, match="empty pattern"):
        MediaFilter.parse(glob="*.jpg,")
    with pytest.raises(ValueError, match="tar_index_only"):
        prepare_dataset(tmp_path, tar_index_only=True, media_filter=MediaFilter.parse(extension=True))


def test_cli_option_prepares_media_metadata(tmp_path, members):
    """`energon-ray prepare --media-metadata-by-extension` stores the rows and reports their number."""
    root = _write(tmp_path / "cli", members)
    args = [str(root), "--non-interactive", "--split-ratio", "1,0,0", "--skip-dataset-yaml", "--no-progress",
            "--media-metadata-by-extension"]  # fmt: skip
    result = CliRunner().invoke(prepare_command, args)
    assert result.exit_code == 0, result.output
    assert "Stored media metadata of 4 files." in result.output
    _assert_table(_table(root), EXPECTED)
    bad = CliRunner().invoke(prepare_command, [str(root), "--tar-index-only", "--media-metadata-by-header"])
    assert bad.exit_code == 2 and "cannot be combined with --tar-index-only" in bad.output


def test_av_webdataset_decoder_has_energons_signature_and_modes(members):
    """AVWebdatasetDecoder takes Energon's arguments, returns a lazy decoder / AVData / None, and is SampleDecoder's AV handler."""
    ours = list(inspect.signature(AVWebdatasetDecoder).parameters)
    theirs = list(inspect.signature(energon_av.AVWebdatasetDecoder).parameters)
    assert ours[: len(theirs)] == theirs == ["video_decode_audio", "av_decode"]
    wav = dict(members)["s1.wav"]
    lazy = AVWebdatasetDecoder(False)("s1.wav", wav)
    assert isinstance(lazy, AVDecoder) and lazy.get_metadata().audio_sample_rate == 8000
    decoded = AVWebdatasetDecoder(video_decode_audio=True, av_decode="torch")(".wav", wav)
    assert isinstance(decoded, AVData) and tuple(decoded.audio_clips[0].shape) == (1, 2000)
    assert AVWebdatasetDecoder(False)("txt", b"hi") is None
    assert isinstance(AVWebdatasetDecoder(False).read_av_data(wav), AVDecoder)
    with pytest.raises(ValueError, match="av_decode='frames'"):
        AVWebdatasetDecoder(False, "frames")
    assert repr(AVWebdatasetDecoder(False)).startswith("AVWebdatasetDecoder(av_decode='AVDecoder', video_decode_audio=False")
    handlers = SampleDecoder()._build().handlers
    assert sum(isinstance(h, AVWebdatasetDecoder) for h in handlers) == 1


def test_factory_prepare_takes_energons_media_filter_config(tmp_path, members):
    """BaseWebdatasetFactory.prepare_dataset(media_filter=MediaFilterConfig…) writes the same rows as Energon's."""
    from energon_ray.format.factories import BaseWebdatasetFactory as OurFactory

    root = _write(tmp_path / "ds", members)
    OurFactory.prepare_dataset(
        root, ["data.tar"], split_parts_ratio=[("train", 1.0)], workers=1,
        media_filter=MediaFilterConfig.parse(None, True, False),
    )  # fmt: skip
    _assert_table(_table(root), BY_HEADER)
    with pytest.raises(ValueError, match="media_filter cannot be combined with tar_index_only"):
        OurFactory.prepare_dataset(root, ["data.tar"], tar_index_only=True, media_filter=MediaFilter.parse(extension=True))
    with pytest.raises(TypeError, match="expected a MediaFilter"):
        MediaFilter.coerce("EXTENSION")


def _folder(root: Path, members) -> Path:
    for name, data in members:
        (root / "sub" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "sub" / name).write_bytes(data)
    return root


def test_folder_media_metadata_matches_energons_prepare_media(tmp_path, members):
    """`energon-ray prepare-media FOLDER` stores what Energon's does, keyed by relative path; each SystemFileStore reads the other's."""
    from megatron.energon.cache.file_store import SystemFileStore as EnergonSystemFileStore
    from megatron.energon.media.filesystem_prepare import prepare_filesystem_dataset

    from energon_ray.cache.stores import SystemFileStore

    ours, theirs = _folder(tmp_path / "ours", members), _folder(tmp_path / "theirs", members)
    result = CliRunner().invoke(main, ["prepare-media", str(ours), *ONE_PROCESS, "--media-metadata-by-extension", "--no-progress"])
    assert result.exit_code == 0 and "Stored media metadata of 4 files; 1 unreadable, left out." in result.output, result.output
    prepare_filesystem_dataset(EPath(theirs), MediaFilterConfig.parse(None, False, True), progress=False, workers=1)
    expected = {f"sub/{k}": v for k, v in EXPECTED.items()}
    _assert_table(_table(ours), expected)
    _assert_table(_table(theirs), expected)
    assert SystemFileStore(theirs).get_media_metadata("sub/s0.png") == IMAGE
    assert EnergonSystemFileStore(EPath(ours)).get_media_metadata("sub/s1.wav").audio_num_samples == 2000
    with pytest.raises(KeyError, match="no media metadata for 'sub/s0.txt'"):
        SystemFileStore(ours).get_media_metadata("sub/s0.txt")
    with pytest.raises(DatasetConfigError, match="prepare-media"):
        SystemFileStore(tmp_path).get_media_metadata("x.png")


def test_prepare_media_adds_the_table_to_a_prepared_dataset(tmp_path, members):
    """`energon-ray prepare-media` on a dataset prepared without media metadata adds it; samples tables stay."""
    root = _write(tmp_path / "ds", members)
    prepare_dataset(root, split_ratio=[1, 0, 0], progress=False)
    result = CliRunner().invoke(main, ["prepare-media", str(root), *ONE_PROCESS, "--media-metadata-by-header", "--no-progress"])
    assert result.exit_code == 0, result.output
    _assert_table(_table(root), BY_HEADER)
    assert DatasetFileStore(root)["s0.txt"][0] == b"hello"
    assert CliRunner().invoke(main, ["prepare-media", str(root)]).exit_code == 2


def test_unreadable_media_are_left_out_counted_and_named(tmp_path, members):
    """s3.png is not an image: no row (as Energon stores none), and prepare's warnings and
    prepare-media's output count and name it (they said nothing)."""
    root = _write(tmp_path / "ds", members)
    result = prepare_dataset(root, split_ratio=[1, 0, 0], progress=False, media_filter=MediaFilter.parse(extension=True))
    assert "s3.png" not in _table(root)
    assert [w for w in result.warnings if "media" in w] == [
        "1 media file(s) could not be read and have no metadata row, e.g. data.tar: s3.png: UnidentifiedImageError: "
        + next(w for w in result.warnings if "media" in w).split("UnidentifiedImageError: ", 1)[1]
    ]
    for path in (root, _folder(tmp_path / "fs", members)):
        res = CliRunner().invoke(main, ["prepare-media", str(path), *ONE_PROCESS, "--media-metadata-by-extension", "--no-progress"])
        assert res.exit_code == 0, res.output
        assert "Warning: 1 media file(s) could not be read and have no metadata row, e.g. " in res.output
        assert ("data.tar: s3.png: " if path == root else "sub/s3.png: ") in res.output
        assert res.output.rstrip().endswith("Stored media metadata of 4 files; 1 unreadable, left out.")


def test_aux_folder_with_only_media_metadata_is_a_plain_folder(tmp_path, members):
    """An aux folder whose .nv-meta holds only prepare-media's index.sqlite, written filesystem://, is
    read by relative path (Energon's filesystem dataset); as a plain aux path it is no prepared dataset
    and refused (Energon fails opening it too)."""
    from energon_ray.cache.aux import aux_stores
    from energon_ray.cache.stores import SystemFileStore

    folder = _folder(tmp_path / "fs", members)
    assert CliRunner().invoke(main, ["prepare-media", str(folder), *ONE_PROCESS, "--media-metadata-by-extension"]).exit_code == 0
    store = aux_stores({"media": folder}, "test", filesystem=("media",))["media"]
    assert isinstance(store, SystemFileStore) and store.get_media_metadata("sub/s0.png") == IMAGE
    with pytest.raises(DatasetConfigError, match=rf"^test: aux.media: {re.escape(str(folder))} is a folder but no prepared dataset"):
        aux_stores({"media": folder}, "test")


def test_prepare_media_num_workers_stores_the_same_rows_as_one_process(tmp_path, members):
    """Energon's `prepare-media --num-workers N` reads shards (or a folder's files) in N processes: the
    same rows and the same unreadable file named as with one; so does `prepare --num-workers N`."""
    root = tmp_path / "ds"
    root.mkdir()
    for key in ("s0", "s1", "s2", "s3"):  # a shard per sample
        with tarfile.open(root / f"{key}.tar", "w") as tar:
            for name, data in members:
                if name.startswith(key + "."):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    prepare_dataset(root, split_ratio=[1, 0, 0], progress=False)
    folder = _folder(tmp_path / "fs", members)
    in_folder = {f"sub/{k}": v for k, v in BY_HEADER.items()}
    for path, expected, unreadable in ((root, BY_HEADER, "s3.tar: s3.png: "), (folder, in_folder, "sub/s3.png: ")):
        tables = []
        for workers in (1, 3):
            res = CliRunner().invoke(main, ["prepare-media", str(path), "--media-metadata-by-header", "--no-progress",
                                            "--num-workers", str(workers)])  # fmt: skip
            assert res.exit_code == 0, res.output
            assert unreadable in res.output and res.output.rstrip().endswith(
                f"Stored media metadata of {len(expected)} files; 1 unreadable, left out."
            )
            tables.append(_rows(path))
        assert tables[0] == tables[1]
        _assert_table(_table(path), expected)
    prepare_dataset(root, split_ratio=[1, 0, 0], progress=False, media_filter=MediaFilter.parse(header=True),
                    num_workers=3, force_overwrite=True)  # fmt: skip
    _assert_table(_table(root), BY_HEADER)

