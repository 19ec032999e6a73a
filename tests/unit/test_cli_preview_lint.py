"""``energon-ray preview`` and ``energon-ray lint`` on tiny prepared datasets of real JPEGs (no Ray)."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import PIL.Image
import PIL.ImageOps
import pytest
from click.testing import CliRunner

from energon_ray.cli.gallery import LABEL_HEIGHT, PAD, grid_size
from energon_ray.cli.main import main
from energon_ray.format.jsonl import prepare_jsonl
from energon_ray.format.prepare import prepare_dataset
from energon_ray.synthetic import captioning_samples, encode_image, sample_image, write_shards
from tests.helpers import captioning_dataset

CAPTIONS = {
    0: "a red bus parked near the station (sample 0)",
    1: "two dogs playing in the snow (sample 1)",
    2: "a bowl of fresh fruit (sample 2)",
    3: "an old bridge over a quiet river (sample 3)",
    4: "a cat sleeping on a sofa (sample 4)",
}


def run_cli(*args) -> "CliRunner.invoke":
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def dataset(tmp_path) -> Path:
    """10 captioning samples (64×48 JPEGs) in shards of 4, all in train."""
    return captioning_dataset(tmp_path / "ds", n=10, per_shard=4)


def broken_dataset(root: Path) -> Path:
    """12 samples in shards of 4: sample 2's JPEG cut in half, sample 9 without its caption part."""
    samples = captioning_samples(12)
    for key, parts in samples:
        del parts["json"]
    samples[2][1]["jpg"] = samples[2][1]["jpg"][: len(samples[2][1]["jpg"]) // 2]
    del samples[9][1]["txt"]
    write_shards(root / "shards", samples, 4)
    prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="CaptioningSample",
                    field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
    return root


def columns(line: str) -> list:
    """``shard  key  field  reason`` split into its four columns."""
    return line.split("  ", 3)


def test_preview_prints_the_first_n_keys_in_order_with_types_and_shapes(dataset):
    res = run_cli("preview", dataset, "-n", 5)
    assert res.exit_code == 0, res.output
    expected = [f"Dataset {dataset} [train: 3 shards, 10 samples, CaptioningSample]"]
    for i in range(5):
        expected += [
            f"[{i}] sample_{i:06d}  (shards/shard_{i // 4:04d}.tar)",
            "  image: Tensor float32 [3, 48, 64]",
            f"  caption: str {CAPTIONS[i]!r}",
        ]
    assert res.stdout.splitlines() == expected


def test_preview_reads_the_given_split_part_with_the_given_image_decode(tmp_path):
    root = captioning_dataset(tmp_path / "ds", n=8, per_shard=4,
                              split_parts={"train": ["shards/shard_0000.tar"], "val": ["shards/shard_0001.tar"]})  # fmt: skip
    res = run_cli("preview", root, "--split-part", "val", "-n", 20, "--image-decode", "pil")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("[")] == [f"sample_{i:06d}" for i in range(4, 8)]
    assert lines[2] == "  image: PIL.Image RGB 64x48"


def test_preview_out_png_is_a_grid_of_the_samples_images(dataset, tmp_path):
    out = tmp_path / "grid.png"
    res = run_cli("preview", dataset, "-n", 6, "--out", out, "--columns", 4, "--thumb-size", 32)
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[-1] == f"Wrote {out} (148x104 grid)"
    grid = PIL.Image.open(out)
    assert grid.format == "PNG" and grid.size == grid_size(6, 4, 32) == (4 * 36 + 4, 2 * (32 + LABEL_HEIGHT + 4) + 4)
    for n in range(6):  # each cell holds exactly that sample's JPEG, scaled to 32×24, on the cell's bottom edge
        expected = PIL.ImageOps.contain(PIL.Image.open(io.BytesIO(encode_image(sample_image(n)))).convert("RGB"), (32, 32))
        x, y = PAD + (n % 4) * (32 + PAD), PAD + (n // 4) * (32 + LABEL_HEIGHT + PAD) + 32 - 24
        assert grid.convert("RGB").crop((x, y, x + 32, y + 24)).tobytes() == expected.tobytes()


@pytest.mark.parametrize("name", ["grid.png", "page.html"])
def test_preview_out_in_a_folder_that_does_not_exist_is_a_usage_error_before_reading(dataset, tmp_path, name):
    out = tmp_path / "no" / "such" / name
    res = run_cli("preview", dataset, "-n", 2, "--out", out)
    assert res.exit_code == 2 and f"folder {out.parent} does not exist" in res.output
    assert "sample" not in res.stdout  # nothing read (it was a bare FileNotFoundError after reading)


def test_preview_out_html_holds_each_caption_and_an_inline_png_per_sample(dataset, tmp_path):
    out = tmp_path / "page.html"
    res = run_cli("preview", dataset, "-n", 3, "--out", out)
    assert res.exit_code == 0, res.output
    page = out.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3
    assert [PIL.Image.open(io.BytesIO(base64.b64decode(b))).size for b in images] == [(64, 48)] * 3
    for i in range(3):
        assert f"caption: {CAPTIONS[i]}" in page and f"<b>sample_{i:06d}</b>" in page
    assert page.index("sample_000000") < page.index("sample_000001") < page.index("sample_000002")


def test_preview_out_draws_a_video_as_a_strip_of_frames_and_audio_as_its_waveform(tmp_path, caplog):
    """A video part becomes a strip of ``STRIP_FRAMES`` frames (each the video's frame at that time),
    an audio part its waveform; a part that does not decode is left out with a warning naming the
    sample and field, the others drawn."""
    import av

    from energon_ray.cli.gallery import STRIP_FRAMES, WAVE_SIZE
    from energon_ray.synthetic_media import encode_video, encode_wav, tone, video_frames

    frames = video_frames(0, STRIP_FRAMES, (32, 24))
    samples = [("v0", {"mp4": encode_video(frames), "txt": b"a video"}),
               ("a1", {"wav": encode_wav(tone(1, 0.5, 8000), 8000), "txt": b"a tone"}),
               ("b2", {"mp4": b"not a video", "txt": b"broken"})]  # fmt: skip
    write_shards(tmp_path / "ds" / "shards", samples, 4)
    prepare_dataset(tmp_path / "ds", split_ratio=(1, 0, 0), sample_type="CrudeWebdataset", progress=False)
    out = tmp_path / "page.html"
    with caplog.at_level("WARNING", logger="energon_ray.cli.gallery"):
        res = run_cli("preview", tmp_path / "ds", "-n", 3, "--out", out)
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[-1] == f"Wrote {out} (2 images, 3 samples)"
    assert [r.getMessage().split(": left out")[0] for r in caplog.records] == ["energon_ray preview: sample b2, field mp4"]
    strip, wave = [PIL.Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB")
                   for b in re.findall(r'src="data:image/png;base64,([^"]+)"', out.read_text())]  # fmt: skip
    assert strip.size == (32 * STRIP_FRAMES, 24) and wave.size == (WAVE_SIZE[0] // 2, WAVE_SIZE[1] // 2)  # (in 256-pixel thumbnails)
    with av.open(io.BytesIO(samples[0][1]["mp4"])) as container:  # the decoded frames, side by side
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert np.array_equal(np.asarray(strip), np.concatenate(decoded, axis=1))
    pixels = np.asarray(wave)
    drawn = [(pixels[:, x] < 160).any(axis=-1).sum() for x in range(wave.width)]  # the wave's blue, not the grey centre line
    assert drawn[0] > wave.height // 2 and drawn[-1] < drawn[0] // 4  # a decaying tone: loud, then quiet


def test_preview_runs_no_dataset_code_unless_trusted(dataset, tmp_path):
    marker = tmp_path / "ran"
    meta = dataset / ".nv-meta"
    (meta / "loader.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "def load(raw):\n    return {'image': raw['jpg'], 'caption': raw['txt'].upper()}\n"
    )
    (meta / "dataset.yaml").write_text(
        "sample_type: {__module__: megatron.energon, __class__: CaptioningSample}\n"
        "sample_loader: loader.py:load\npart_filter: [jpg, txt]\n"
    )
    res = run_cli("preview", dataset, "-n", 1)
    assert res.exit_code == 1 and "--trust-dataset-code" in res.output and "loader.py" in res.output
    assert not marker.exists()
    res = run_cli("preview", dataset, "-n", 1, "--trust-dataset-code")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[3] == f"  caption: str {CAPTIONS[0].upper()!r}" and marker.exists()


def test_lint_on_a_clean_dataset_exits_0_with_the_summary(dataset):
    res = run_cli("lint", dataset)
    assert (res.exit_code, res.stdout, res.stderr) == (0, "10 samples checked, 0 bad\n", "")  # no bar: stderr is no TTY
    res = run_cli("lint", dataset, "--limit", 5)
    assert (res.exit_code, res.stdout) == (0, "5 samples checked, 0 bad\n")


@pytest.mark.parametrize("jobs", [1, 2])
def test_lint_lists_the_corrupt_jpeg_and_the_missing_field_and_exits_1(tmp_path, jobs):
    root = broken_dataset(tmp_path / "ds")
    res = run_cli("lint", root, "--jobs", jobs)
    assert res.exit_code == 1, res.output
    lines = res.stdout.splitlines()
    assert lines[-1] == "12 samples checked, 2 bad"
    assert [columns(line)[:3] for line in lines[:-1]] == [
        ["shards/shard_0000.tar", "sample_000002", "image"],
        ["shards/shard_0002.tar", "sample_000009", "caption"],
    ]
    assert re.fullmatch(r"cannot decode part 'jpg' \(\d+ bytes\): OSError: image file is truncated.*", columns(lines[0])[3])
    assert columns(lines[1])[3] == "field 'caption' (field_map 'txt'): part 'txt' missing; parts present: ['jpg']"


def _four_samples_with(root: Path, index: int, part: str, data: bytes) -> Path:
    """A prepared 4-sample captioning dataset whose sample ``index`` has ``data`` as its ``part``."""
    samples = captioning_samples(4)
    samples[index][1][part] = data
    write_shards(root / "shards", samples, 4)
    prepare_dataset(root, split_ratio=(1, 0, 0), sample_type="CaptioningSample",
                    field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
    return root


def test_lint_reports_images_over_max_image_pixels_as_media_too_large(tmp_path):
    _four_samples_with(tmp_path, 3, "jpg", encode_image(sample_image(3, (80, 60))))
    res = run_cli("lint", tmp_path, "--max-image-pixels", 4000)
    assert res.exit_code == 1, res.output
    shard, key, field, reason = columns(res.stdout.splitlines()[0])
    assert (shard, key, field) == ("shards/shard_0000.tar", "sample_000003", "image")
    assert "MediaTooLargeError: jpg: image of 80×60 = 4,800 pixels exceeds the limit of 4,000 pixels" in reason
    assert res.stdout.splitlines()[1:] == ["4 samples checked, 1 bad"]


def test_lint_reports_a_part_over_max_part_bytes_as_media_too_large(tmp_path):
    _four_samples_with(tmp_path, 1, "txt", b"x" * 300)
    assert run_cli("lint", tmp_path).exit_code == 0  # the default bound (512 MiB) takes it
    res = run_cli("lint", tmp_path, "--max-part-bytes", 200)
    assert res.exit_code == 1, res.output
    shard, key, field, reason = columns(res.stdout.splitlines()[0])
    assert (shard, key, field) == ("shards/shard_0000.tar", "sample_000001", "caption")
    assert "MediaTooLargeError: txt: 300 bytes, over the limit of 200 bytes per part (max_part_bytes)" in reason
    assert res.stdout.splitlines()[1:] == ["4 samples checked, 1 bad"]


def test_lint_reports_a_tar_with_samples_after_its_index(dataset, tmp_path):
    samples = captioning_samples(5, start=4)
    write_shards(tmp_path / "longer", samples, 5)  # shard_0001's 4 samples, then one more
    shutil.copy(tmp_path / "longer" / "shard_0000.tar", dataset / "shards" / "shard_0001.tar")
    res = run_cli("lint", dataset)
    assert res.exit_code == 1, res.output
    shard, key, field, reason = columns(res.stdout.splitlines()[0])
    assert (shard, key, field) == ("shards/shard_0001.tar", "-", "index")
    assert re.fullmatch(r".*shard_0001\.tar\.idx: tar member 'sample_000008\.jpg' follows the index's end \(byte \d+\); "
                        r"re-run `energon-ray prepare --tar-index-only .*`", reason)  # fmt: skip
    assert res.stdout.splitlines()[1:] == ["10 samples checked, 0 bad, 1 index problems"]


def test_lint_reports_a_truncated_shard_and_its_cut_off_sample(dataset):
    shard = dataset / "shards" / "shard_0002.tar"
    offsets = (Path(str(shard) + ".idx")).read_bytes()
    last_start = int.from_bytes(offsets[-16:-8], "little")
    shard.write_bytes(shard.read_bytes()[: last_start + 512 + 100])  # sample 9's header and 100 bytes of its JPEG
    res = run_cli("lint", dataset)
    assert res.exit_code == 1, res.output
    lines = [columns(line) for line in res.stdout.splitlines()]
    assert [line[:3] for line in lines[:-1]] == [["shards/shard_0002.tar", "-", "index"], ["shards/shard_0002.tar", "sample_000009", "-"]]
    assert "tar is truncated or does not match" in lines[0][3] and "truncated shard" in lines[1][3]
    assert res.stdout.splitlines()[-1] == "10 samples checked, 1 bad, 1 index problems"


def suggested_command(message: str) -> list:
    """The arguments of the `energon-ray …` command an error message suggests."""
    (command,) = re.findall(r"`energon-ray ([^`]*)`", message)
    return command.split()


def test_lint_names_a_lost_index_and_the_command_that_rebuilds_it(dataset):
    """A shard without .tar.idx: lint names it and suggests `prepare --tar-index-only ROOT`; running that makes lint clean."""
    (dataset / "shards" / "shard_0001.tar.idx").unlink()
    res = run_cli("lint", dataset)
    assert res.exit_code == 1, res.output
    shard, key, field, reason = columns(res.stdout.splitlines()[0])
    assert (shard, key, field) == ("shards/shard_0001.tar", "-", "index")
    assert f"missing index of {dataset / 'shards' / 'shard_0001.tar'}" in reason
    assert suggested_command(reason) == ["prepare", "--tar-index-only", str(dataset)]
    preview = run_cli("preview", dataset, "-n", 10)
    assert preview.exit_code == 1 and f"`energon-ray prepare --tar-index-only {dataset}`" in preview.output
    fix = run_cli(*suggested_command(reason), "--no-progress")
    assert fix.exit_code == 0, fix.output
    res = run_cli("lint", dataset)
    assert res.exit_code == 0 and res.stdout.splitlines() == ["10 samples checked, 0 bad"], res.output


def test_lint_checks_index_sqlite_opens_and_counts_the_samples_and_names_it(dataset):
    """A corrupt, emptied or short index.sqlite passed lint: it is an index problem naming the file and the
    command that rebuilds it; running that makes lint clean."""
    import sqlite3

    db_file = dataset / ".nv-meta" / "index.sqlite"
    good = db_file.read_bytes()

    def lint_index_line():
        res = run_cli("lint", dataset)
        assert res.exit_code == 1 and res.stdout.splitlines()[1:] == ["10 samples checked, 0 bad, 1 index problems"], res.output
        shard, key, field, reason = columns(res.stdout.splitlines()[0])
        assert (shard, key, field) == (".nv-meta/index.sqlite", "-", "index")
        assert suggested_command(reason) == ["prepare", "--tar-index-only", str(dataset)]
        return reason

    db_file.write_bytes(b"not a database" * 100)
    assert lint_index_line() == (f"{db_file}: cannot be read as SQLite (file is not a database); "
                                 f"re-run `energon-ray prepare --tar-index-only {dataset}`")  # fmt: skip
    db_file.write_bytes(good)
    with sqlite3.connect(db_file) as db:
        db.execute("DELETE FROM samples WHERE sample_key = 'sample_000003'")
    assert lint_index_line().startswith(f"{db_file}: holds 9 samples, .info.json counts 10; ")
    with sqlite3.connect(db_file) as db:
        db.execute("DROP TABLE sample_parts")
    assert lint_index_line().startswith(f"{db_file}: has no table sample_parts; ")
    fix = run_cli("prepare", "--tar-index-only", dataset, "--no-progress")
    assert fix.exit_code == 0, fix.output
    res = run_cli("lint", dataset)
    assert res.exit_code == 0 and res.stdout.splitlines() == ["10 samples checked, 0 bad"], res.output


def test_lint_on_the_shard_folder_instead_of_the_dataset_says_it_is_not_prepared(dataset):
    """lint of a folder without .nv-meta (here the shards' folder) names it and the command to run, as
    preview does; it said only `.../shards/.nv-meta/split.yaml: split file not found`."""
    shards = dataset / "shards"
    for command in ("lint", "preview"):
        res = run_cli(command, shards)
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
        assert res.output == f"Error: {shards}: not a prepared dataset (missing .nv-meta/); run `energon-ray prepare {shards}`\n"


def test_a_lost_jsonl_index_suggests_preparing_the_file(tmp_path):
    """A .jsonl without its .jsonl.idx: the error suggests `prepare FILE`, which restores it."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "hello"}) + "\n")
    prepare_jsonl(corpus, progress=False)
    (tmp_path / "corpus.jsonl.idx").unlink()
    res = run_cli("lint", corpus)
    assert res.exit_code == 1 and suggested_command(res.output) == ["prepare", str(corpus)], res.output
    assert run_cli(*suggested_command(res.output), "--no-progress").exit_code == 0
    assert run_cli("lint", corpus).stdout.splitlines() == ["1 samples checked, 0 bad"]


def test_lint_and_preview_refuse_an_index_offset_of_2_63_as_an_index_problem(dataset):
    """An end offset of exactly 2**63 (negative as int64): an index problem naming file, entry and value, no crash."""
    idx = dataset / "shards" / "shard_0001.tar.idx"
    offsets = np.frombuffer(idx.read_bytes(), dtype=np.uint64).copy()
    offsets[-1] = np.uint64(2**63)
    idx.write_bytes(offsets.tobytes())
    expected = f"{idx}: entry #4 of 5 is {2**63}, not a byte offset"
    res = run_cli("lint", dataset)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    shard, key, field, reason = columns(res.stdout.splitlines()[0])
    assert (shard, key, field) == ("shards/shard_0001.tar", "-", "index") and reason.startswith(expected)
    assert res.stdout.splitlines()[1:] == ["6 samples checked, 0 bad, 1 index problems"]
    res = run_cli("preview", dataset, "-n", 10)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert f"Error: {expected}" in res.output

def test_preview_and_lint_read_a_jsonl_file(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join([json.dumps({"text": "hello"}), "{not json}", json.dumps({"text": "bye", "n": [1, 2]})]) + "\n")
    prepare_jsonl(corpus, progress=False)
    res = run_cli("preview", corpus, "-n", 3)
    assert res.stdout.splitlines()[1:3] == ["[0] 0  (corpus.jsonl)", "  json: dict[1] {'text': 'hello'}"]
    assert res.stdout.splitlines()[3:7] == [
        "[1] 1  (corpus.jsonl)",
        "  json: ERROR: cannot decode part 'json' (10 bytes): JSONDecodeError: Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1)",
        "[2] 2  (corpus.jsonl)",
        "  json: dict[2] {'text': 'bye', 'n': [1, 2]}",
    ]
    res = run_cli("lint", corpus)
    assert res.exit_code == 1, res.output
    assert [columns(line)[:3] for line in res.stdout.splitlines()[:-1]] == [["corpus.jsonl", "1", "json"]]
    assert res.stdout.splitlines()[-1] == "3 samples checked, 1 bad"


def test_control_characters_of_a_sample_key_are_printed_escaped(tmp_path):
    """A key is the dataset's text: 'k\\x1b[2J\\rfake' printed as it was cleared the terminal and started
    a line of its own; preview and lint now print its control characters escaped."""
    samples = captioning_samples(3)
    samples[1] = ("k\x1b[2J\rfake", samples[1][1])
    del samples[1][1]["txt"]
    write_shards(tmp_path / "ds" / "shards", samples, 4)
    prepare_dataset(tmp_path / "ds", split_ratio=(1, 0, 0), sample_type="CaptioningSample",
                    field_map={"image": "jpg", "caption": "txt"}, progress=False)  # fmt: skip
    shown = "k\\x1b[2J\\rfake"
    preview = run_cli("preview", tmp_path / "ds", "-n", 3)
    assert "\x1b" not in preview.output and "\r" not in preview.output
    assert f"[1] {shown}  (shards/shard_0000.tar)" in preview.output.splitlines()
    lint = run_cli("lint", tmp_path / "ds")
    assert "\x1b" not in lint.output and "\r" not in lint.output and lint.exit_code == 1
    (bad,) = [columns(line) for line in lint.output.splitlines() if line.startswith("shards/")]
    assert bad[:3] == ["shards/shard_0000.tar", shown, "caption"]


def three_part_dataset(root: Path) -> Path:
    """10 captioning samples in shards of 4: train shard 0, val shards 1 and 2, test listed with no shards
    (as Energon's prepare writes an empty part)."""
    captioning_dataset(root, n=10, per_shard=4)
    (root / ".nv-meta" / "split.yaml").write_text(
        "split_parts:\n  train: [shards/shard_0000.tar]\n  val: [shards/shard_0001.tar, shards/shard_0002.tar]\n"
        "  test: []\nexclude: []\n"
    )
    return root


@pytest.mark.parametrize("parallel", [0, 2])
def test_lint_takes_energons_split_parts_list_and_parallel_and_skips_an_empty_part(tmp_path, parallel):
    root = three_part_dataset(tmp_path / "ds")
    res = run_cli("lint", root, "--split-parts", "train,val,test", "--parallel", parallel)
    assert (res.exit_code, res.stdout) == (0, "Skipping empty split part test\n10 samples checked, 0 bad\n")
    res = run_cli("lint", root, "--split-parts", "val")
    assert (res.exit_code, res.stdout) == (0, "6 samples checked, 0 bad\n")


def test_lint_and_preview_of_parts_without_shards_skip_them_and_exit_0_as_energons(tmp_path):
    root = three_part_dataset(tmp_path / "ds")
    res = run_cli("lint", root, "--split-parts", "test")
    assert (res.exit_code, res.output) == (0, "Skipping empty split part test\n0 samples checked, 0 bad\n")
    res = run_cli("preview", root, "--split-parts", "test,test")
    assert (res.exit_code, res.output) == (0, "Skipping empty split part test\n")


def test_lint_of_empty_parts_still_checks_dataset_yaml(tmp_path):
    root = three_part_dataset(tmp_path / "ds")
    (root / ".nv-meta" / "dataset.yaml").write_text("sample_type:\n  __module__: nowhere.samples\n  __class__: Thing\n")
    res = run_cli("lint", root, "--split-parts", "test")
    assert res.exit_code == 1 and res.output.startswith(
        f"Error: {root / '.nv-meta' / 'dataset.yaml'}: refusing to run code the dataset brings"
    )


def test_lint_of_all_parts_of_a_split_file_without_shards_is_an_error(tmp_path):
    root = three_part_dataset(tmp_path / "ds")
    (root / ".nv-meta" / "split.yaml").write_text("split_parts:\n  train: []\n  val: []\nexclude: []\n")
    res = run_cli("lint", root)
    assert (res.exit_code, res.output) == (1, f"Error: {root}: split.yaml lists no shards in any split part\n")


def test_split_parts_badly_listed_are_usage_errors(tmp_path):
    root = three_part_dataset(tmp_path / "ds")
    res = run_cli("lint", root, "--split-parts", "train,,val")
    assert res.exit_code == 2 and res.output.endswith(
        "Invalid value for '--split-part' / '--split-parts': expected split part names separated by commas, "
        "got 'train,,val'\n"
    )
    res = run_cli("preview", root, "--split-part", "all,val")
    assert res.exit_code == 2 and res.output.endswith("'all' already names every split part, got 'all,val'\n")


def test_preview_shows_the_first_samples_of_each_listed_split_part_in_turn(tmp_path):
    root = three_part_dataset(tmp_path / "ds")
    res = run_cli("preview", root, "--split-parts", "val,test,train", "-n", 1)
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        f"Dataset {root} [val: 2 shards, 6 samples, CaptioningSample]",
        "[0] sample_000004  (shards/shard_0001.tar)",
        "  image: Tensor float32 [3, 48, 64]",
        f"  caption: str {CAPTIONS[4]!r}",
        "Skipping empty split part test",
        f"Dataset {root} [train: 1 shards, 4 samples, CaptioningSample]",
        "[0] sample_000000  (shards/shard_0000.tar)",
        "  image: Tensor float32 [3, 48, 64]",
        f"  caption: str {CAPTIONS[0]!r}",
    ]


def test_lint_and_preview_read_the_dataset_and_split_config_files_given(dataset):
    meta = dataset / ".nv-meta"
    (meta / "dataset.yaml").rename(meta / "captioning.yaml")
    (meta / "last_shard.yaml").write_text("split_parts:\n  train: [shards/shard_0002.tar]\n")
    res = run_cli("lint", dataset)
    assert (res.exit_code, res.output) == (1, f"Error: {meta / 'dataset.yaml'}: dataset config not found\n")
    configs = ("--dataset-config", "captioning.yaml", "--split-config", "last_shard.yaml")
    res = run_cli("lint", dataset, *configs)
    assert (res.exit_code, res.stdout) == (0, "2 samples checked, 0 bad\n")
    res = run_cli("preview", dataset, *configs, "-n", 1)
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[:2] == [
        f"Dataset {dataset} [train: 1 shards, 2 samples, CaptioningSample]", "[0] sample_000008  (shards/shard_0002.tar)"
    ]


def test_config_file_options_on_a_jsonl_file_are_a_usage_error(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "hello"}) + "\n")
    prepare_jsonl(corpus, progress=False)
    res = run_cli("lint", corpus, "--dataset-config", "other.yaml")
    assert res.exit_code == 2 and res.output.endswith(
        f"Error: {corpus}: a .jsonl file has no .nv-meta config files; --dataset-config cannot apply\n"
    )
