"""The Hydra configs of the tasks (composition, overrides, interpolation between groups) and the
pieces they build, without Ray: tokenizers, the pixel quantiser, masks, the data module's checks."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
import torch
from omegaconf import OmegaConf

from energon_ray.tasks.datamodule import EnergonDataModule
from energon_ray.tasks.layers import document_causal_mask
from energon_ray.tasks.tokenizer import ByteTokenizer, HFTokenizer
from energon_ray.tasks.vision.igpt.encoder import PixelQuantizer
from energon_ray.train import build, compose
from energon_ray.train.config import BUILTIN_TASKS
from tests.helpers import captioning_dataset


def captioning_cli_error(monkeypatch, tmp_path, *overrides: str):
    """The exit code (an "error: …" line) of the train CLI on the captioning task and synthetic
    dataset with ``overrides``, run in ``tmp_path``; fails if it does not exit."""
    from energon_ray.train.__main__ import main

    argv = ["energon_ray.train", "+task=vision/captioning", "+dataset=vision/captioning/synthetic", f"work_dir={tmp_path}",
            *overrides, f"hydra.run.dir={tmp_path / 'out'}"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as caught:
        main()
    return caught.value.code


def _task(name: str, *overrides: str):
    return compose([f"+task={name}", f"+dataset={BUILTIN_TASKS[name]}", "work_dir=/data/work", *overrides])


def test_captioning_composes_with_overrides_and_interpolates_the_tokenizer():
    """Command-line overrides land in their groups; the backbone takes vocab size and length from the tokenizer."""
    cfg = _task("vision/captioning", "tokenizer.max_length=32", "loader.num_workers=3", "trainer.max_steps=7", "task.optimizer.lr=0.01")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["backbone"]["_target_"] == "energon_ray.tasks.vision.captioning.backbone.TinyCaptioner"
    assert (resolved["backbone"]["vocab_size"], resolved["backbone"]["max_positions"]) == (259, 32)
    assert resolved["task"]["backbone"] == resolved["backbone"]
    assert resolved["task"]["optimizer"] == {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.01, "weight_decay": 0.0}
    assert resolved["dataset"]["task_encoder"]["tokenizer"] == {
        "_target_": "energon_ray.tasks.tokenizer.ByteTokenizer", "max_length": 32, "vocab_size": 259,
    }  # fmt: skip
    assert resolved["dataset"]["loader"] == {"num_workers": 3, "prefetch_batches": 4, "pin_memory": None, "ray_remote_args": None, "executor": None}
    assert resolved["dataset"]["path"] == "/data/work/data/vision_captioning_synthetic"
    assert resolved["dataset"]["prepare"]["root"] == "/data/work/data/vision_captioning_synthetic"
    assert resolved["trainer"]["max_steps"] == 7 and resolved["trainer"]["ray"]["num_workers"] == 0
    assert resolved["trainer"]["ray"]["storage_path"] == "/data/work/ray_results"


def test_another_tokenizer_or_backbone_size_by_override():
    """tokenizer=hash swaps the group (the backbone follows its vocab size); backbone keys override the task's default."""
    cfg = _task("vision/captioning", "tokenizer=hash", "backbone.embed_dim=32")
    assert cfg.tokenizer._target_ == "energon_ray.tasks.tokenizer.HashTokenizer"
    assert (cfg.backbone.vocab_size, cfg.task.backbone.vocab_size, cfg.task.backbone.embed_dim) == (4096, 4096, 32)
    hf = _task("vision/captioning", "tokenizer=autotokenizer")
    assert (hf.tokenizer.pretrained_model_name_or_path, hf.backbone.vocab_size) == ("gpt2", 50257)


def test_igpt_overrides_the_tokenizer_with_pixels_and_takes_classes_from_the_dataset():
    """The iGPT task sets tokenizer=pixels in its defaults; the command line still wins; num_classes comes from the dataset."""
    cfg = _task("vision/igpt", "dataset.model_data_kwargs.num_classes=3", "task.classify=true")
    assert cfg.tokenizer._target_ == "energon_ray.tasks.vision.igpt.encoder.PixelQuantizer"
    assert (cfg.backbone.num_vocab, cfg.backbone.num_classes, cfg.dataset.prepare.num_classes) == (27, 3, 3)
    assert cfg.task.classify is True and (cfg.task.optimizer.lr, cfg.task.optimizer.weight_decay) == (0.003, 0.0)
    assert _task("vision/igpt", "tokenizer.vocab_size=64").backbone.num_vocab == 64
    assert _task("vision/igpt", "tokenizer=byte").tokenizer._target_ == "energon_ray.tasks.tokenizer.ByteTokenizer"


def test_lm_packing_backbone_length_follows_the_packed_row_length():
    """The LM's position table is the task encoder's packed row length."""
    cfg = _task("text/lm_packing", "dataset.task_encoder.max_length=256")
    assert (cfg.backbone.max_positions, cfg.dataset.packing_buffer_size, cfg.dataset.dataset_options.samples_per_segment) == (256, 32, 64)


def test_every_builtin_task_builds_its_datamodule_and_task_without_ray():
    """build() instantiates the data module (task encoder and tokenizer inside) and the task (backbone inside)."""
    expected = {
        "vision/captioning": ("CaptioningTaskEncoder", "ByteTokenizer", "CaptioningTask", "TinyCaptioner"),
        "vision/igpt": ("ImageGPTTaskEncoder", "PixelQuantizer", "GenerativePixelsTask", "GPT2"),
        "video/vqa": ("VideoQATaskEncoder", "ByteTokenizer", "VideoQATask", "TinyVideoQA"),
        "text/lm_packing": ("TextPackingTaskEncoder", "ByteTokenizer", "PackedLMTask", "PackedGPT"),
    }
    for name, (encoder, tokenizer, task_type, backbone) in expected.items():
        datamodule, task = build(_task(name, "tokenizer.max_length=48") if name != "vision/igpt" else _task(name))
        assert isinstance(datamodule, EnergonDataModule)
        got = (type(datamodule.task_encoder).__name__, type(datamodule.task_encoder.tokenizer).__name__, type(task).__name__, type(task.model).__name__)
        assert got == (encoder, tokenizer, task_type, backbone), name
        assert (datamodule.batch_size, datamodule.num_workers, datamodule.loader_options) == (8, 2, {"prefetch_batches": 4, "pin_memory": None, "ray_remote_args": None, "executor": None})
        assert callable(datamodule.prepare) and datamodule.path.startswith("/data/work/data/")
    datamodule, task = build(_task("vision/captioning", "tokenizer.max_length=48"))
    assert datamodule.task_encoder.tokenizer.max_length == 48 and task.model.decoder.max_positions == 48


def test_missing_task_or_dataset_is_a_clear_error():
    """Without +task/+dataset, build() names what to choose."""
    with pytest.raises(ValueError, match=r"choose task and dataset on the command line; built in: \+task=vision/captioning"):
        build(compose([]))


@pytest.mark.parametrize("chosen, missing", [((), "task and dataset"), (("+task=vision/captioning",), "dataset")])
@pytest.mark.parametrize("ray_workers", [0, 1])
def test_command_line_without_task_or_dataset_exits_naming_what_to_choose(monkeypatch, tmp_path, chosen, missing, ray_workers):
    """No +task/+dataset on the command line: "error: choose …" and exit 1, before anything is built or Ray
    started (before: a Hydra traceback of build()'s ValueError; with ray.train workers, after Ray started)."""
    from energon_ray.train.__main__ import main

    argv = ["energon_ray.train", *chosen, f"work_dir={tmp_path}", f"trainer.ray.num_workers={ray_workers}", f"hydra.run.dir={tmp_path / 'out'}"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as caught:
        main()
    assert caught.value.code == f"error: choose {missing} on the command line; built in: " + ", ".join(
        f"+task={task} +dataset={dataset}" for task, dataset in BUILTIN_TASKS.items()
    )


def test_command_line_entry_point_prints_the_composed_config(monkeypatch, capsys):
    """`python -m energon_ray.train … --cfg job` composes from the packaged configs (task folders on the search path)."""
    from energon_ray.train.__main__ import main

    monkeypatch.setattr(sys, "argv", ["energon_ray.train", "+task=video/vqa", "+dataset=video/vqa/synthetic", "tokenizer.max_length=40", "--cfg", "job", "--resolve"])
    main()
    printed = OmegaConf.create(capsys.readouterr().out)
    assert printed.backbone._target_ == "energon_ray.tasks.video.vqa.backbone.TinyVideoQA"
    assert (printed.backbone.max_positions, printed.dataset.task_encoder.num_frames) == (40, 4)


def test_byte_tokenizer_round_trips_and_pads():
    """Bytes + 3 with begin/end markers; batches padded with 0; too small a vocab_size is refused."""
    tok = ByteTokenizer(max_length=6)
    assert tok.encode("héllo") == [1, 107, 198, 172, 111, 2]  # truncated to 6 tokens (begin, 4 bytes, end)
    assert tok.decode(ByteTokenizer().encode("héllo wörld")) == "héllo wörld"
    out = tok(["ab", "a"])
    assert out["input_ids"].tolist() == [[1, 100, 101, 2], [1, 100, 2, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    with pytest.raises(ValueError, match="vocab_size must be >= 259"):
        ByteTokenizer(vocab_size=100)


def test_hf_tokenizer_without_transformers_says_how_to_install(monkeypatch):
    """A Hugging Face tokenizer config without `transformers` fails with the install command."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"tokenizer 'gpt2' is a Hugging Face tokenizer and needs `transformers` \(pip install transformers\)"):
        HFTokenizer("gpt2")


def test_pixel_quantizer_maps_colours_to_a_grid_and_back():
    """levels**3 ids, row-major; decode gives the grid's colours; a non-cube vocab is refused."""
    q = PixelQuantizer(vocab_size=27)
    image = torch.tensor([[[0.0, 0.5], [1.0, 0.9]], [[0.0, 0.5], [0.0, 0.1]], [[0.0, 0.5], [1.0, 0.0]]])
    ids = q.encode(image)
    assert ids.tolist() == [0, 13, 20, 18]
    assert torch.equal(q.decode(ids, 2, 2), torch.tensor([[[0.0, 0.5], [1.0, 1.0]], [[0.0, 0.5], [0.0, 0.0]], [[0.0, 0.5], [1.0, 0.0]]]))
    with pytest.raises(ValueError, match="vocab_size must be a cube >= 8"):
        PixelQuantizer(vocab_size=30)


def test_document_causal_mask_keeps_attention_inside_each_document():
    """True = masked: later positions and other documents (padding is its own document)."""
    mask = document_causal_mask(torch.tensor([[1, 1, 2, 0]]), num_heads=2)
    assert mask.shape == (2, 4, 4)
    assert mask[0].int().tolist() == [[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 0, 1], [1, 1, 1, 0]]


def test_lightning_moves_batches_that_hold_frozen_sources():
    """Lightning's own transfer (no hook of ours) moves a task's batch: tensors through the dataclass,
    the frozen SourceInfo kept as it is (its ``to`` is itself); without ``to`` Lightning refuses it."""
    from lightning.fabric.utilities.apply_func import move_data_to_device

    from energon_ray.samples import SourceInfo
    from energon_ray.tasks.vision.igpt.encoder import ImageGPTBatch

    source = SourceInfo(dataset_path="/d", index=3, shard_name="s.tar", file_names=("a.png",))
    batch = ImageGPTBatch(__key__=["a"], __restore_key__=(), __sources__=(source,), pixels=torch.zeros(1, 4, dtype=torch.long), labels=torch.zeros(1, dtype=torch.long))
    moved = move_data_to_device(batch, torch.device("cpu"))
    assert moved is not batch and moved.__sources__ == (source,) and moved.__sources__[0].to("cpu") is moved.__sources__[0]
    assert moved.__key__ == ["a"] and torch.equal(moved.pixels, batch.pixels) and torch.equal(moved.labels, batch.labels)
    assert move_data_to_device({"sources": [source], "x": torch.ones(2)}, torch.device("cpu"))["sources"] == [source]


def test_datamodule_checks_its_arguments_and_keeps_states_for_later():
    """Unknown loader options and non-TaskEncoders are refused; a loaded state waits for the training loader."""
    from energon_ray.tasks.captioning import CaptioningTaskEncoder

    with pytest.raises(ValueError, match=r"unknown loader option\(s\) \['prefetch'\]"):
        EnergonDataModule("/d", CaptioningTaskEncoder(), 4, loader={"prefetch": 2})
    with pytest.raises(TypeError, match="task_encoder must be a TaskEncoder, got str"):
        EnergonDataModule("/d", "captioning", 4)
    for bad in ("abc", 2.7, True, -1, "-2"):  # int() said "invalid literal for int()" (no key), and truncated 2.7; -1 failed in setup()
        with pytest.raises(ValueError, match=re.escape(f"loader.num_workers must be a whole number >= 0, got {bad!r}")):
            EnergonDataModule("/d", CaptioningTaskEncoder(), 4, loader={"num_workers": bad})
    assert EnergonDataModule("/d", CaptioningTaskEncoder(), 4, loader={"num_workers": "3"}).num_workers == 3
    data = EnergonDataModule("/d", CaptioningTaskEncoder(), 4, loader={"num_workers": 3, "prefetch_batches": 2}, model_data_kwargs={"num_classes": 5})
    assert (data.num_workers, data.loader_options, data.model_data_kwargs) == (3, {"prefetch_batches": 2}, {"num_classes": 5})
    assert EnergonDataModule("/d", CaptioningTaskEncoder(), 4, loader={"executor": "ray_data"}).loader_options == {"executor": "ray_data"}
    assert data.state_dict() == {}
    data.load_state_dict({"train_loader_states": [{"version": 1}]})
    assert data._pending_states == [{"version": 1}]
    data.setup()
    assert (data.worker_config.rank, data.worker_config.world_size, data.worker_config.num_workers) == (0, 1, 3)


def test_datamodule_setup_names_a_val_or_test_split_without_shards_before_any_loader_is_built(tmp_path):
    """setup('fit'/'validate'/'test') builds the stage's evaluation dataset: a split part with no shards
    fails there (it failed when Lightning first asked for the loader, mid-fit); a split set to None is not read."""
    from energon_ray.errors import DatasetConfigError
    from energon_ray.tasks.captioning import CaptioningTaskEncoder

    path = captioning_dataset(tmp_path / "ds", n=8, per_shard=4)  # split 1,0,0: val and test have no shards
    for stage, which in (("fit", "val"), ("validate", "val"), ("test", "test")):
        data = EnergonDataModule(path, CaptioningTaskEncoder(), 4, loader={"num_workers": 1})
        with pytest.raises(DatasetConfigError) as raised:
            data.setup(stage)
        assert str(raised.value) == (
            f"EnergonDataModule: the {which} split {which!r} of {path} cannot be read: {path}/.nv-meta/split.yaml: split part "
            f"{which!r} has no shards (after excludes) ({which}_split=None, or dataset.{which}_split=null on the command "
            "line, runs without it)")  # fmt: skip
    data = EnergonDataModule(path, CaptioningTaskEncoder(), 4, val_split=None, test_split=None, loader={"num_workers": 1})
    for stage in ("fit", "validate", "test", "predict"):
        data.setup(stage)
    assert data._eval_datasets == {} and data.val_dataloader() == [] and data.test_dataloader() == []
    data = EnergonDataModule(path, CaptioningTaskEncoder(), 4, val_split="train", loader={"num_workers": 1})
    data.setup("fit")  # a split with shards: built once, here, and kept for the validation loader
    assert list(data._eval_datasets) == ["val"] and len(data._eval_datasets["val"]) == 2  # batches of 4


def test_checkpointing_turned_off_drops_the_configured_model_checkpoint(tmp_path):
    """``trainer.enable_checkpointing=false`` failed in Lightning (a ModelCheckpoint in the default
    callbacks); the ray part of the trainer config names every option ray_launch reads."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from energon_ray.train.build import make_trainer

    on = make_trainer(_task("vision/captioning", f"work_dir={tmp_path}"))
    off = make_trainer(_task("vision/captioning", f"work_dir={tmp_path}", "trainer.enable_checkpointing=false"))
    assert any(isinstance(c, ModelCheckpoint) for c in on.callbacks)
    assert not any(isinstance(c, ModelCheckpoint) for c in off.callbacks) and off.checkpoint_callback is None
    ray_part = OmegaConf.to_container(_task("vision/captioning").trainer.ray, resolve=True)
    assert (ray_part["name"], ray_part["max_failures"]) == (None, 0)


def test_ckpt_path_may_name_a_checkpoint_folder(tmp_path):
    """A ray.train run prints its checkpoint as a folder; Lightning wants the file inside."""
    from energon_ray.train.fit import checkpoint_file

    ray_folder, lightning_folder, other = tmp_path / "checkpoint_2026", tmp_path / "lightning", tmp_path / "other"
    for folder, name in ((ray_folder, "checkpoint.ckpt"), (lightning_folder, "last.ckpt"), (other, "epoch=0-step=5.ckpt")):
        folder.mkdir()
        (folder / name).write_bytes(b"x")
    assert checkpoint_file(str(ray_folder)) == str(ray_folder / "checkpoint.ckpt")
    assert checkpoint_file(str(lightning_folder)) == str(lightning_folder / "last.ckpt")
    assert checkpoint_file(str(other / "epoch=0-step=5.ckpt")) == str(other / "epoch=0-step=5.ckpt")
    assert checkpoint_file(None) is None and checkpoint_file(str(tmp_path / "missing.ckpt")) == str(tmp_path / "missing.ckpt")
    with pytest.raises(FileNotFoundError, match=r"ckpt_path=.*other is a folder without checkpoint.ckpt or last.ckpt; name one of its checkpoints: epoch=0-step=5.ckpt"):
        checkpoint_file(str(other))


def test_command_line_entry_point_names_a_changed_synthetic_parameter(monkeypatch, tmp_path):
    """The igpt dataset in dataset.path was generated with 24 samples; `dataset.prepare.num_samples=32` exits
    with "error: …" naming the folder and both counts (no traceback; before: the old 24 samples, silently)."""
    from energon_ray.tasks.vision.igpt.data import synthetic
    from energon_ray.train.__main__ import main

    synthetic(tmp_path / "data", num_samples=24, samples_per_shard=8)
    argv = ["energon_ray.train", "+task=vision/igpt", "+dataset=vision/igpt/synthetic", "trainer.max_steps=1",
            f"dataset.path={tmp_path / 'data'}", "dataset.prepare.num_samples=32", "dataset.prepare.samples_per_shard=8",
            f"hydra.run.dir={tmp_path / 'out'}"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as caught:
        main()
    assert caught.value.code == (
        f"error: {tmp_path / 'data'}: holds a synthetic dataset written with other parameters (num_samples was 24, "
        "is now 32), so it was not used. It holds only what energon_ray generated: delete the folder to write it "
        "again with the new parameters, or point the dataset path at a new folder"
    )


@pytest.mark.parametrize("ray_workers", [0, 1])
def test_command_line_entry_point_names_a_ckpt_path_that_holds_no_checkpoint(monkeypatch, tmp_path, ray_workers):
    """A ckpt_path that does not exist, or a folder without a checkpoint file, exits with "error: …" naming
    it, before anything is built or Ray started (before: Lightning's FileNotFoundError in a traceback once
    the model and the loaders were built; under ray.train, in every worker)."""
    from energon_ray.train.__main__ import main

    (tmp_path / "empty").mkdir()
    cases = {
        tmp_path / "nope.ckpt": f"error: ckpt_path={tmp_path / 'nope.ckpt'} does not exist (name a checkpoint file, "
                                "or the checkpoint folder a ray.train run printed)",
        tmp_path / "empty": f"error: ckpt_path={tmp_path / 'empty'} is a folder without checkpoint.ckpt or last.ckpt (and no .ckpt file)",
    }  # fmt: skip
    for path, message in cases.items():
        argv = ["energon_ray.train", "+task=vision/captioning", "+dataset=vision/captioning/synthetic", f"work_dir={tmp_path}",
                f"ckpt_path={path}", f"trainer.ray.num_workers={ray_workers}", f"hydra.run.dir={tmp_path / 'out'}"]  # fmt: skip
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as caught:
            main()
        assert caught.value.code == message
    assert not (tmp_path / "data").exists()  # nothing was built: the synthetic dataset was not written


@pytest.mark.parametrize(
    "name, said",
    [
        ("best", "error: ckpt_path=best: a new run has no best checkpoint (Lightning knows it only after a fit in the same "
                 "process); name a checkpoint file, or the checkpoint folder a ray.train run printed, or ckpt_path=last "
                 "for the configured ModelCheckpoint's newest"),
        ("hpc", "error: ckpt_path=hpc: no hpc_ckpt_*.ckpt file in trainer.default_root_dir={root}/lightning; name a "
                "checkpoint file, or the checkpoint folder a ray.train run printed"),
        ("registry:my-model", "error: ckpt_path=registry:my-model needs the litmodels package (pip install litmodels); or "
                              "name a checkpoint file, or the checkpoint folder a ray.train run printed"),
    ],
)  # fmt: skip
def test_command_line_entry_point_names_a_lightning_ckpt_name_that_finds_no_checkpoint(monkeypatch, tmp_path, name, said):
    """ckpt_path=best (never a checkpoint in a new run), hpc without hpc_ckpt_* files, registry without litmodels:
    one "error: …" line before anything is built (before: Lightning's ValueError in a Hydra traceback once the
    model and the loaders were built)."""
    from energon_ray.train.__main__ import main

    if name.startswith("registry") and importlib.util.find_spec("litmodels") is not None:
        said = None  # Lightning resolves it with litmodels: nothing to refuse here
    argv = ["energon_ray.train", "+task=vision/captioning", "+dataset=vision/captioning/synthetic", f"work_dir={tmp_path}",
            f"ckpt_path={name}", f"hydra.run.dir={tmp_path / 'out'}"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    if said is None:
        from energon_ray.train.fit import check_ckpt_path

        check_ckpt_path(name)
        return
    with pytest.raises(SystemExit) as caught:
        main()
    assert caught.value.code == said.format(root=tmp_path)
    assert not (tmp_path / "data").exists()  # nothing was built: the synthetic dataset was not written


def test_ckpt_path_hpc_passes_where_lightning_finds_an_hpc_checkpoint(tmp_path):
    """ckpt_path=hpc is left to Lightning when trainer.default_root_dir holds an hpc_ckpt_<n>.ckpt file; last always is."""
    from energon_ray.train.fit import check_ckpt_path

    (tmp_path / "hpc_ckpt_3.ckpt").write_bytes(b"")
    check_ckpt_path("hpc", root_dir=str(tmp_path))
    check_ckpt_path("last", root_dir=str(tmp_path / "missing"))


@pytest.mark.parametrize("ray_workers", [0, 1])
def test_command_line_entry_point_names_a_cluster_address_nothing_answers_at(tmp_path, ray_workers):
    """RAY_ADDRESS=127.0.0.1:1 (nothing listens): "error: …" naming the address and exit 1, whether the loader
    or ray.train reaches Ray first (before: a Hydra traceback of ensure_ray's ConnectionError). In a
    process of its own: one already connected to Ray (the session's) keeps using it."""
    from tests.helpers import NO_CLUSTER_AT_PORT_1, last_error_line_without_a_cluster

    argv = ["+task=vision/captioning", "+dataset=vision/captioning/synthetic", f"work_dir={tmp_path}",
            "trainer.max_steps=1", "trainer.enable_progress_bar=false",
            f"trainer.ray.num_workers={ray_workers}", f"hydra.run.dir={tmp_path / 'out'}"]  # fmt: skip
    assert last_error_line_without_a_cluster("-m", "energon_ray.train", *argv) == f"error: {NO_CLUSTER_AT_PORT_1}"


def test_command_line_help_lists_the_built_in_tasks(monkeypatch, capsys):
    """`--help` names every built-in task with its dataset (Hydra's own listing showed only `task: default`)."""
    from energon_ray.train.__main__ import main

    monkeypatch.setattr(sys, "argv", ["energon_ray.train", "--help"])
    with pytest.raises(SystemExit) as caught:
        main()
    out = capsys.readouterr().out
    assert caught.value.code == 0 and out.startswith("python -m energon_ray.train +task=<modality>/<task> +dataset=")
    listed = [line.strip() for line in out.splitlines() if line.startswith("  +task=")]
    assert listed == [f"+task={task} +dataset={dataset}" for task, dataset in BUILTIN_TASKS.items()]
    assert "tokenizer: autotokenizer, byte, hash" in out and "max_steps: 50" in out


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.ray.num_workers=two", "trainer.ray.num_workers must be a whole number >= 0, got 'two'"),
        ("trainer.ray.num_workers=2.5", "trainer.ray.num_workers must be a whole number >= 0, got 2.5"),
        ("trainer.ray.max_failures=-2", "trainer.ray.max_failures must be a whole number >= -1, got -2"),
        ("trainer.ray.cpus_per_worker=half", "trainer.ray.cpus_per_worker must be a number >= 0, got 'half'"),
        ("trainer.ray.use_gpu=no", "trainer.ray.use_gpu must be true or false, got 'no'"),
    ],
)
def test_command_line_entry_point_names_a_bad_ray_option(monkeypatch, tmp_path, override, message):
    """A bad trainer.ray value exits with "error: …" naming its key, before anything is built or Ray
    started. Before: `int('two')` said "invalid literal for int() with base 10: 'two'" (no key, a
    traceback), 2.5 workers were 2, and use_gpu=no asked for GPUs (bool('no'))."""
    assert captioning_cli_error(monkeypatch, tmp_path, "trainer.ray.num_workers=1", override) == f"error: {message}"


@pytest.mark.parametrize(
    "override, message",
    [
        ("+loader.ray_remote_args.num_cpu=1", "loader.ray_remote_args: unknown key 'num_cpu' (did you mean 'num_cpus'?); the "
                                              "loader's tasks take num_cpus, num_gpus, memory, resources, accelerator_type, "
                                              "scheduling_strategy, label_selector"),
        ("+loader.ray_remote_args.num_gpus=-1", "loader.ray_remote_args: num_gpus must be a number ≥ 0, got -1"),
        ("loader.ray_remote_args=5", "loader.ray_remote_args must be a dict of Ray task options, got int"),
        ("loader.executor=threads", "loader.executor must be one of 'tasks', 'ray_data', not 'threads'"),
        ("loader.prefetch_batches=x", "loader.prefetch_batches must be a whole number >= 0, got 'x'"),
        ("loader.pin_memory=maybe", "loader.pin_memory must be a bool or None, got 'maybe'"),
        ("+loader.object_store_limit=1GiB", "loader.object_store_limit must be a whole number of bytes >= 0 (or null), got '1GiB'"),
        ("loader.num_workers=-1", "loader.num_workers must be a whole number >= 0, got -1"),
        ("+loader.prefetch_batch=2", "loader.prefetch_batch: not a loader option (did you mean loader.prefetch_batches?); the "
                                     "loader takes num_workers, prefetch_batches, pin_memory, ray_remote_args, object_store_limit, executor"),
    ],
)  # fmt: skip
def test_command_line_entry_point_names_a_bad_loader_option(monkeypatch, tmp_path, override, message):
    """A bad loader.* value exits with "error: loader.<key> …" before anything is built (before: a Hydra
    traceback once the loaders were built, naming get_loader's keyword, not the config key; a misspelt
    key or prefetch_batches=x were no error at all or one from the data module's constructor)."""
    assert captioning_cli_error(monkeypatch, tmp_path, override) == f"error: {message}"
    assert not (tmp_path / "data").exists()  # nothing was built: the synthetic dataset was not written


def test_a_bad_executor_from_the_environment_is_named_as_such(monkeypatch, tmp_path):
    """loader.executor left null reads $ENERGON_RAY_EXECUTOR: a bad value there names the variable (it
    named loader.executor, which was not set)."""
    monkeypatch.setenv("ENERGON_RAY_EXECUTOR", "threads")
    assert captioning_cli_error(monkeypatch, tmp_path) == (
        "error: ENERGON_RAY_EXECUTOR (what an unset loader.executor means) must be one of 'tasks', 'ray_data', not 'threads'"
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ("dataset.batch_size=0", "dataset: EnergonDataModule: batch_size must be a positive int, got 0"),
        ("+dataset.batch_sise=4", "dataset: EnergonDataModule.__init__() got an unexpected keyword argument 'batch_sise'"),
        ("+task.foo=1", "task: TaskModule.__init__() got an unexpected keyword argument 'foo'"),
        ("seed=abc", "seed must be a whole number, got 'abc'"),
        ("test=maybe", "test must be true or false, got 'maybe'"),
    ],
)
def test_command_line_entry_point_names_a_value_the_constructors_refuse(monkeypatch, tmp_path, override, message):
    """A dataset or task value its constructor refuses, a seed that is no number, a test that is no flag: one
    "error: …" line naming the group or key (before: Hydra's "Error in call to target …" lines and a hint;
    int()'s "invalid literal" with no key; test=maybe ran the test split)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert captioning_cli_error(monkeypatch, tmp_path, "trainer.max_steps=1", override) == f"error: {message}"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.accelerator=gpu"], "trainer.accelerator=gpu: with trainer.ray.num_workers=2 the workers' device comes from "
                                      "trainer.ray.use_gpu (now false); set trainer.ray.use_gpu=true and leave trainer.accelerator=auto"),
        (["trainer.accelerator=cpu", "trainer.ray.use_gpu=true"], "trainer.accelerator=cpu: with trainer.ray.num_workers=2 the "
                                      "workers' device comes from trainer.ray.use_gpu (now true); set trainer.ray.use_gpu=false "
                                      "and leave trainer.accelerator=auto"),
        (["trainer.devices=4"], "trainer.devices=4: with trainer.ray.num_workers=2 each ray.train worker is one rank with one "
                                "device; set trainer.ray.num_workers to the number of ranks and leave trainer.devices=1"),
        (["+trainer.strategy=ddp"], "trainer.strategy: with trainer.ray.num_workers=2 the workers use Ray's DDP strategy and "
                                    "environment (RayDDPStrategy, RayLightningEnvironment); drop trainer.strategy"),
    ],
)  # fmt: skip
def test_trainer_values_ray_train_would_replace_are_refused_naming_them(monkeypatch, tmp_path, overrides, message):
    """With trainer.ray.num_workers=2, a trainer.accelerator, devices or strategy the ray.train workers
    would replace with their own (trainer.accelerator=gpu trained on CPUs, devices=4 on one device per
    worker, without a word) is one "error: …" line naming it and the trainer.ray option to use, before
    Ray starts; the defaults (accelerator auto, devices 1) pass the check."""
    import ray

    connected = ray.is_initialized()
    said = captioning_cli_error(monkeypatch, tmp_path, "trainer.max_steps=1", "trainer.ray.num_workers=2", *overrides)
    assert said == f"error: {message}"
    assert ray.is_initialized() == connected and not (tmp_path / "data").exists()
    from energon_ray.train.config import check_ray_trainer

    check_ray_trainer(_task("vision/captioning", "trainer.ray.num_workers=2"))
    check_ray_trainer(_task("vision/captioning", "trainer.ray.num_workers=2", "trainer.ray.use_gpu=true", "trainer.accelerator=gpu"))


@pytest.mark.parametrize(
    "override, message",
    [
        ("dataset.batch_size=0", "dataset: EnergonDataModule: batch_size must be a positive int, got 0"),
        ("+task.foo=1", "task: CaptioningTask.__init__() got an unexpected keyword argument 'foo'"),
    ],
)
def test_command_line_entry_point_names_a_refused_value_before_ray_train_starts(monkeypatch, tmp_path, override, message):
    """With trainer.ray.num_workers=1, a dataset value its constructor refuses, or an argument the task
    does not take, is one "error: …" line said in the driver before Ray or a TorchTrainer starts (before:
    each ray.train worker's traceback, ~150 lines)."""
    import ray

    connected = ray.is_initialized()  # (the suite's shared Ray, if an earlier test started it)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    said = captioning_cli_error(monkeypatch, tmp_path, "trainer.max_steps=1", "trainer.ray.num_workers=1", override)
    assert said == f"error: {message}"
    assert ray.is_initialized() == connected and not (tmp_path / "data").exists()


def test_relative_paths_are_taken_from_the_callers_directory_also_through_an_interpolation(monkeypatch):
    """ray.train workers run in their run's folder: every local path of the config is made absolute from
    the caller's directory, also one an interpolation resolves to a relative path (it stayed relative, so
    a worker looked in its own folder); an interpolation of work_dir follows it, URLs stay."""
    from energon_ray.train.config import with_absolute_paths

    monkeypatch.setenv("ENERGON_RAY_TEST_CKPT", "runs/last.ckpt")
    cfg = with_absolute_paths(_task(
        "vision/captioning", "work_dir=work", "ckpt_path=${oc.env:ENERGON_RAY_TEST_CKPT}", "+dataset.val_path=val",
        "+dataset.test_path=s3://bucket/test", "+trainer.callbacks.0.dirpath=ckpts", "trainer.ray.storage_path=${work_dir}/rr",
    ), base="/caller")  # fmt: skip
    assert (cfg.ckpt_path, cfg.dataset.val_path, cfg.dataset.test_path) == ("/caller/runs/last.ckpt", "/caller/val", "s3://bucket/test")
    assert (cfg.dataset.path, cfg.trainer.callbacks[0].dirpath) == ("/caller/work/data/vision_captioning_synthetic", "/caller/ckpts")
    assert OmegaConf.to_container(cfg.trainer.ray, resolve=False)["storage_path"] == "${work_dir}/rr"
    assert cfg.trainer.ray.storage_path == "/caller/work/rr"


@pytest.mark.parametrize("name", ["last", "best", "hpc", "registry", "registry:my-model:v1"])
def test_lightnings_names_for_ckpt_path_are_not_taken_as_paths(name):
    """ckpt_path=last asks Lightning for the newest checkpoint of the configured ModelCheckpoint; it stays
    `last` (it was made `<cwd>/last`, and Lightning then said "Checkpoint file not found: <cwd>/last");
    a file named so in a folder is still a path."""
    from energon_ray.train.config import with_absolute_paths

    assert with_absolute_paths(_task("vision/captioning", f"ckpt_path={name}"), base="/caller").ckpt_path == name
    assert with_absolute_paths(_task("vision/captioning", f"ckpt_path=runs/{name}"), base="/caller").ckpt_path == f"/caller/runs/{name}"


@pytest.mark.parametrize(
    "arg, said",
    [
        ("+task=vision/captionin", "+task=vision/captionin: no task config of that name (did you mean vision/captioning?); built in: default, text/lm_packing, video/vqa, vision/captioning, vision/igpt"),
        ("+dataset=video/vqa/synthetc", "+dataset=video/vqa/synthetc: no dataset config of that name (did you mean video/vqa/synthetic?); built in: default, text/lm_packing/synthetic, video/vqa/synthetic, vision/captioning/synthetic, vision/igpt/synthetic"),
        ("tokenizer=bite", "tokenizer=bite: no tokenizer config of that name (did you mean byte?); built in: autotokenizer, byte, hash, pixels"),
    ],
)
def test_a_misspelt_choice_names_the_closest_builtin_option(monkeypatch, tmp_path, arg, said):
    """A misspelt task, dataset or tokenizer: "error: …" naming the closest built-in option and all of
    them, exit 1 (Hydra's own message listed only "Available options in 'task': default")."""
    from energon_ray.train.__main__ import main

    chosen = {"+task": "+task=video/vqa", "+dataset": "+dataset=video/vqa/synthetic"}
    chosen[arg.split("=")[0]] = arg
    monkeypatch.setattr(sys, "argv", ["energon_ray.train", *chosen.values(), f"work_dir={tmp_path}", "--cfg", "job"])
    with pytest.raises(SystemExit) as caught:
        main()
    assert caught.value.code == f"error: {said}"


@pytest.mark.parametrize(
    "arg, said",
    [
        ("+task=vision/captionin", "+task=vision/captionin: no task config of that name (did you mean vision/captioning?); built in: default, text/lm_packing, video/vqa, vision/captioning, vision/igpt"),
        ("task=captionning", "task=captionning: no task config of that name (did you mean vision/captioning?); built in: default, text/lm_packing, video/vqa, vision/captioning, vision/igpt"),
        ("+dataset=video/vqa/synthetc", "+dataset=video/vqa/synthetc: no dataset config of that name (did you mean video/vqa/synthetic?); built in: default, text/lm_packing/synthetic, video/vqa/synthetic, vision/captioning/synthetic, vision/igpt/synthetic"),
    ],
)
def test_compose_refuses_a_misspelt_choice_as_the_command_line_does(arg, said):
    """compose() (the Python entry) gives the command line's ConfigError for a misspelt choice (it
    raised Hydra's MissingConfigException, listing only "Available options in 'task': default")."""
    from energon_ray.train.config import ConfigError

    chosen = {"task": "+task=video/vqa", "dataset": "+dataset=video/vqa/synthetic"}
    chosen[arg.split("=")[0].lstrip("+")] = arg
    with pytest.raises(ConfigError) as caught:
        compose(list(chosen.values()))
    assert str(caught.value) == said


def test_choices_of_the_users_own_config_folders_are_left_to_hydra(monkeypatch, tmp_path, capsys):
    """With a config folder of the user's own on the command line, a task only it holds is Hydra's to find."""
    from energon_ray.train.__main__ import main

    (tmp_path / "conf" / "task" / "mine").mkdir(parents=True)
    (tmp_path / "conf" / "task" / "mine" / "cap.yaml").write_text("# @package _global_\nmine_marker: 7\n")
    argv = ["energon_ray.train", "--config-dir", str(tmp_path / "conf"), "+task=mine/cap", "+dataset=vision/captioning/synthetic", "--cfg", "job"]
    monkeypatch.setattr(sys, "argv", argv)
    main()
    assert OmegaConf.create(capsys.readouterr().out).mine_marker == 7


@pytest.mark.parametrize(
    "override, said",
    [
        ("trainer.max_steps=abc", "trainer.max_steps must be a whole number, got 'abc'"),
        ("trainer.max_epochs=1.5", "trainer.max_epochs must be a whole number (or null), got 1.5"),
        ("trainer.enable_progress_bar=3", "trainer.enable_progress_bar must be a flag (or null), got 3"),
        ("+trainer.gradient_clip_val=high", "trainer.gradient_clip_val must be a number (or null), got 'high'"),
        ("+trainer.max_stpes=5", "trainer.max_stpes: not an argument of Trainer (did you mean trainer.max_steps?)"),
    ],
)
def test_a_trainer_value_lightning_would_fail_on_is_named_before_anything_starts(monkeypatch, tmp_path, override, said):
    """trainer.* values of the wrong kind, or an argument the Trainer lacks: "error: trainer.<key> …",
    exit 1, nothing built (Lightning failed later with "'<' not supported between instances of 'str'
    and 'int'", or a TypeError of an unexpected keyword, naming no config key)."""
    assert captioning_cli_error(monkeypatch, tmp_path, override) == f"error: {said}"
    assert not (tmp_path / "data").exists()  # nothing was built: the synthetic dataset was not written


def test_trainer_values_of_the_right_kind_pass_the_check():
    """The built-in tasks' trainer configs and values of each accepted kind pass (val_check_interval
    takes a whole number or a fraction; a null where the Trainer takes None)."""
    from energon_ray.train.config import check_trainer

    for task, dataset in BUILTIN_TASKS.items():
        check_trainer(compose([f"+task={task}", f"+dataset={dataset}"]))
    check_trainer(compose(["+task=vision/captioning", "+dataset=vision/captioning/synthetic", "trainer.max_epochs=null",
                           "trainer.val_check_interval=0.5", "+trainer.gradient_clip_val=1", "trainer.enable_progress_bar=false"]))  # fmt: skip
