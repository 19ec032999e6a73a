"""Bad input: config errors fail fast in the driver; data errors are skipped, logged and counted."""

from __future__ import annotations

import importlib
import logging
import os
import re
import shutil
import threading

import pytest
import ray

import energon_ray as er
from energon_ray.synthetic import captioning_samples
from tests.helpers import captioning_dataset, keys_of, prepared

WC = er.WorkerConfig(rank=0, world_size=1, num_workers=2)


def _val(path, **kwargs):
    kwargs.setdefault("batch_size", 4)
    return er.get_loader(er.get_val_dataset(path, split_part="train", worker_config=WC, **kwargs))


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return captioning_dataset(tmp_path_factory.mktemp("bad") / "good", n=20, per_shard=5)


def test_corrupt_jpeg_and_missing_part_are_skipped_logged_and_counted(tmp_path, caplog):
    """A corrupt JPEG and a sample without its caption are dropped, named in the log, counted; batches stay full."""
    samples = captioning_samples(24)
    samples[5][1]["jpg"] = b"\xff\xd8 this is not a jpeg"
    del samples[14][1]["txt"]
    path = prepared(tmp_path / "ds", samples, 6)
    caplog.set_level(logging.WARNING, logger="energon_ray")
    loader = _val(path, batch_size=4)
    batches = keys_of(loader)
    keys = [k for b in batches for k in b]
    assert sorted(keys) == sorted(f"sample_{i:06d}" for i in range(24) if i not in (5, 14))
    assert [len(b) for b in batches].count(4) >= len(batches) - 2
    assert loader.stats.skipped == {"load": 2}
    log = caplog.text
    # the dataset too (a blend's datasets often share shard names and keys)
    assert f"dataset {path}: shards/shard_0000.tar: sample 'sample_000005'" in log and "'jpg'" in log
    assert "sample 'sample_000014'" in log and "field 'caption'" in log and "'txt'" in log


def test_captioning_skips_a_caption_that_is_not_a_string_without_losing_its_batch(tmp_path, caplog):
    """The ready captioning task drops a sample whose caption is a JSON list or null, counted under
    encode_sample and logged with its field; the other samples of its batch stay."""
    import json

    from energon_ray.tasks.captioning import CaptioningTaskEncoder

    samples = captioning_samples(12)
    for key, parts in samples:
        parts["json"] = json.dumps({"caption": parts["txt"].decode()}).encode()
    samples[5][1]["json"] = json.dumps({"caption": ["a cat", "a dog"]}).encode()
    samples[9][1]["json"] = json.dumps({"caption": None}).encode()
    path = prepared(tmp_path / "ds", samples, 6, field_map={"image": "jpg", "caption": "json[caption]"})
    caplog.set_level(logging.WARNING, logger="energon_ray")
    loader = _val(path, task_encoder=CaptioningTaskEncoder(), batch_size=4)
    keys = [k for b in loader for k in b.__keys__]
    assert sorted(keys) == [f"sample_{i:06d}" for i in range(12) if i not in (5, 9)]
    assert loader.stats.skipped == {"encode_sample": 2}
    assert "sample 'sample_000005'" in caplog.text and "field 'caption': must be a string, got ['a cat', 'a dog']" in caplog.text
    assert "sample 'sample_000009'" in caplog.text and "field 'caption': must be a string, got None" in caplog.text


class SmallParts(er.DefaultTaskEncoder):
    """Decodes with max_part_bytes=64 KiB; yields each sample's key and caption."""

    decoder = er.SampleDecoder(max_part_bytes=64 * 1024)

    def encode_sample(self, sample):
        return {"__key__": sample.__key__, "caption": sample.caption}


def test_a_gzip_bomb_part_is_skipped_counted_and_named_without_inflating_it(tmp_path, caplog):
    """Captions stored as txt.gz; one is 64 MiB of spaces in a 64 KiB gzip: only its sample is dropped,
    counted under load and logged with dataset, shard, key, part and the limit; the others decode."""
    import gzip

    samples = captioning_samples(8)
    for _, parts in samples:
        parts["txt.gz"] = gzip.compress(parts.pop("txt"))
    bomb = samples[3][1]["txt.gz"] = gzip.compress(b" " * (64 * 1024 * 1024))
    path = prepared(tmp_path / "ds", samples, 4, field_map={"image": "jpg", "caption": "txt.gz"})
    caplog.set_level(logging.WARNING, logger="energon_ray")
    loader = _val(path, task_encoder=SmallParts(), batch_size=None)
    items = {item["__key__"]: item["caption"] for item in loader}
    assert sorted(items) == [f"sample_{i:06d}" for i in range(8) if i != 3]
    assert items["sample_000004"] == "a cat sleeping on a sofa (sample 4)"
    assert loader.stats.skipped == {"load": 1}
    lines = [r.getMessage() for r in caplog.records if "sample_000003" in r.getMessage()]
    assert len(lines) == 1
    assert f"dataset {path}: shards/shard_0000.tar: sample 'sample_000003'" in lines[0]
    assert (
        f"cannot decode part 'txt.gz' ({len(bomb)} bytes): MediaTooLargeError: txt.gz: gzip of {len(bomb):,} bytes "
        "inflates to more than 65,536 bytes, over the limit of 65,536 bytes per part (max_part_bytes)"
    ) in lines[0]


class FailSome(er.DefaultTaskEncoder):
    def encode_sample(self, sample):
        index = int(sample.__key__[-6:])
        if index % 5 == 0:
            raise ValueError(f"cannot encode {index}")
        if index % 7 == 0:
            raise er.IgnoreSample()
        return sample


def test_hook_errors_are_skipped_and_ignores_are_silent(good):
    """ValueError in encode_sample skips and counts; IgnoreSample drops without counting as an error."""
    loader = _val(good, task_encoder=FailSome(), batch_size=3)
    keys = [k for b in keys_of(loader) for k in b]
    assert sorted(keys) == [f"sample_{i:06d}" for i in range(20) if i % 5 and i % 7]
    assert loader.stats.skipped == {"encode_sample": 4}
    assert loader.stats.ignored == {"encode_sample": 2}


class ForgetsReturn(er.DefaultTaskEncoder):
    """encode_sample gives None for sample 3, batch for the batch holding sample 8 (no ``return``)."""

    def encode_sample(self, sample):
        if sample.__key__ != "sample_000003":
            return sample

    def batch(self, samples):
        if "sample_000008" not in [s.__key__ for s in samples]:
            return super().batch(samples)


def test_a_hook_returning_none_is_its_own_items_failure_naming_the_hook(good, caplog):
    """encode_sample returning None skips that sample only (counted and logged under encode_sample,
    its batch-mate stays); batch returning None skips that batch: no None reaches the trainer."""
    caplog.set_level(logging.WARNING, logger="energon_ray")
    loader = _val(good, task_encoder=ForgetsReturn(), batch_size=2)
    batches = list(loader)
    assert None not in batches and loader.stats.skipped == {"encode_sample": 1, "batch": 1}
    keys = sorted(k for b in keys_of(batches) for k in b)
    assert keys == [f"sample_{i:06d}" for i in range(20) if i not in (3, 7, 8)]
    assert "sample 'sample_000003': TypeError: encode_sample returned None (a missing `return`?)" in caplog.text
    assert "batch of 2 starting at " in caplog.text and "sample 'sample_000007': TypeError: batch returned None" in caplog.text


class SkipsAll(er.DefaultTaskEncoder):
    def encode_sample(self, sample):
        raise er.SkipSample()


def test_many_samples_in_a_row_none_encoded_is_said_in_a_warning(good, caplog, monkeypatch):
    """Every sample skipped (SkipSample is never a failure, so no tolerance ends it): a warning says
    so once that many samples were read, where an endless loader would otherwise wait silently
    forever (Energon's does); not repeated until ten times as many. (1000 samples by default.)"""
    import energon_ray.loader.stats as stats

    monkeypatch.setattr(stats, "DRY_WARNING_SAMPLES", 8)
    caplog.set_level(logging.WARNING, logger="energon_ray")
    loader = _val(good, task_encoder=SkipsAll())
    assert list(loader) == [] and loader.stats.samples_read == 20 and loader.stats.ignored == {"encode_sample": 20}
    warned = [r.getMessage() for r in caplog.records if "was encoded" in r.getMessage()]
    assert len(warned) == 1 and "an endless loader waits forever" in warned[0], warned
    assert warned[0].startswith("none of the last ") and "ignored, e.g. SkipSample: {'encode_sample': " in warned[0]
    caplog.clear()
    assert len(list(_val(good))) == 6 and not [r for r in caplog.records if "was encoded" in r.getMessage()]


def test_a_pass_that_reads_samples_and_gives_no_batch_says_so(good, caplog):
    """20 samples read, each skipped by SkipSample (fewer than the dry-run warning's 1000): the pass
    ended with no batch and no word; one warning now says so with the counts. A good pass says nothing."""
    caplog.set_level(logging.WARNING, logger="energon_ray")
    assert list(_val(good, task_encoder=SkipsAll())) == []
    warned = [r.getMessage() for r in caplog.records if "gave no batch" in r.getMessage()]
    assert warned == [
        "pass 0 gave no batch although it read 20 samples (skipped so far: {}; ignored so far, e.g. SkipSample or a "
        "generator hook that yielded nothing: {'encode_sample': 20}; encoded in all: 0)"
    ]
    caplog.clear()
    assert len(list(_val(good))) == 6 and "gave no batch" not in caplog.text


def test_the_no_batch_warning_is_said_once_per_loader(good, caplog):
    """Two empty passes of one loader: one warning (an endless loader over such data would repeat it every pass)."""
    caplog.set_level(logging.WARNING, logger="energon_ray")
    loader = _val(good, task_encoder=SkipsAll())
    assert list(loader) == [] and list(loader) == [] and loader.stats.samples_read == 40
    assert len([r for r in caplog.records if "gave no batch" in r.getMessage()]) == 1


class AlwaysFail(er.DefaultTaskEncoder):
    def encode_sample(self, sample):
        raise ValueError("broken augmentation")


def test_many_consecutive_failures_raise_fatal_error_in_driver(good):
    """Consecutive failures beyond the tolerance raise FatalSampleError (not a Ray error) with the cause."""
    encoder = AlwaysFail()
    encoder.__default_failure_tolerance__ = 8
    with pytest.raises(er.FatalSampleError, match="consecutive failures.*broken augmentation"):
        list(_val(good, task_encoder=encoder))


class SystemFail(er.DefaultTaskEncoder):
    def encode_sample(self, sample):
        importlib.import_module("not_a_module_that_exists")


def test_system_errors_are_fatal_at_once(good):
    """An ImportError inside a hook aborts loading at once with FatalSampleError naming the sample."""
    with pytest.raises(er.FatalSampleError, match="ImportError|ModuleNotFoundError"):
        list(_val(good, task_encoder=SystemFail()))


class HoldsALock(er.DefaultTaskEncoder):
    def encode_sample(self, sample):
        return {"__key__": sample.__key__, "caption": sample.caption, "lock": threading.Lock() if sample.__key__ == "sample_000007" else None}


@pytest.mark.parametrize("batch_size, named", [(None, "sample 'sample_000007'"), (4, "batch of 4 starting at sample 'sample_000004'")])
def test_a_hook_result_that_does_not_pickle_is_named_by_its_key_and_field(good, batch_size, named):
    """A hook result that cannot be sent names the sample (a batch: its first sample) and the field,
    and travels in its segment's report (a FatalSampleError of the loader, not a Ray task error,
    which left Ray to log "Unhandled error" for the other tasks in flight)."""
    with pytest.raises(er.FatalSampleError) as info:
        list(_val(good, task_encoder=HoldsALock(), batch_size=batch_size))
    assert not isinstance(info.value.__context__, ray.exceptions.RayTaskError)  # raised from the report
    assert re.fullmatch(
        rf"a hook returned a dict \({named}, batch/sample \d+ of segment \d+ of worker stream \d+\) that cannot be sent to the "
        r"driver: field 'lock': TypeError: cannot pickle '_thread.lock' object\. Return tensors .*",
        str(info.value),
    )


def _reraise(exc, sample, sources):
    raise exc


def test_custom_error_handler_can_abort(good):
    """A global_error_handler that re-raises aborts loading at the first failure with that exception
    (raised in the training process, where the handler runs), as in Energon."""
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1, global_error_handler=_reraise)
    loader = er.get_loader(er.get_val_dataset(good, split_part="train", worker_config=wc, batch_size=2, task_encoder=FailSome()))
    with pytest.raises(ValueError, match="cannot encode 0"):
        list(loader)


def test_custom_error_handler_runs_in_the_loader_process(good, caplog):
    """A global_error_handler is called in the training process (its state is the user's), once per
    failed sample, with the exception, the sample and its sources, in the loader's order; it replaces
    the default handler's log, as in Energon (a quiet handler is quiet)."""
    caplog.set_level(logging.WARNING, logger="energon_ray")
    calls = []

    def collect(exc, sample, sources):
        calls.append((type(exc).__name__, str(exc), sample.__key__, [s.shard_name for s in sources]))

    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2, global_error_handler=collect)
    loader = er.get_loader(er.get_val_dataset(good, split_part="train", worker_config=wc, batch_size=2, task_encoder=FailSome()))
    batches = list(loader)
    failed = sorted(int(key[-6:]) for _, _, key, _ in calls)
    assert failed == [i for i in range(20) if i % 5 == 0] == sorted(int(m.split()[-1]) for _, m, _, _ in calls)
    assert all(kind == "ValueError" and shards and shards[0].endswith(".tar") for kind, _, _, shards in calls)
    assert loader.stats.skipped == {"encode_sample": 4} and sum(len(b.__key__) for b in batches) == 20 - 4 - 2
    assert [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()] == []


def test_a_map_fn_failure_goes_to_the_error_handler_and_only_the_default_logs_it(good, caplog):
    """A MapDataset's map_fn that fails is skipped and counted; the default handler logs it, a
    global_error_handler of the user's gets it instead of the log."""
    caplog.set_level(logging.WARNING, logger="energon_ray")

    def map_fn(batch):
        if "sample_000005" in batch.__key__:
            raise ValueError("cannot map")
        return batch

    calls = []
    quiet = er.WorkerConfig(rank=0, world_size=1, num_workers=2, global_error_handler=lambda e, s, src: calls.append(str(e)))
    for wc in (WC, quiet):
        loader = er.get_loader(er.MapDataset(er.get_val_dataset(good, split_part="train", worker_config=wc, batch_size=4), map_fn))
        assert len(list(loader)) == 5 and loader.stats.skipped == {"map_fn": 1}
    assert calls == ["cannot map"]
    assert [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()] == [
        "skipped (map_fn): map_fn on an item of worker stream 0: ValueError: cannot map "
        f"(at {__file__}:{map_fn.__code__.co_firstlineno + 2} in map_fn)"
    ]


def test_custom_error_handler_sees_where_the_hook_failed(good, monkeypatch):
    """The handler runs as Energon's does, inside the ``except`` that caught the failure: a handler
    that logs the exception being handled (``traceback.format_exc``, ``logger.exception``) shows it,
    and the exception's chain holds the traceback from the Ray task, down to the task encoder's line
    that raised (the exception crossed the object store without its traceback: "NoneType: None", and
    nothing said where the hook failed)."""
    import traceback

    seen = []

    def trace(exc, sample, sources):
        seen.append((traceback.format_exc(), "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))

    monkeypatch.setenv("ENERGON_RAY_LOCAL_START", "off")  # the samples are encoded by a Ray task, never in this process
    wc = er.WorkerConfig(rank=0, world_size=1, num_workers=1, global_error_handler=trace)
    list(er.get_loader(er.get_val_dataset(good, split_part="train", worker_config=wc, batch_size=2, task_encoder=FailSome())))
    assert len(seen) == 4
    for handled, formatted in seen:
        assert handled == formatted
        # the hook's frame, with its file and source line, also for this class, which the Ray
        # tasks get pickled by value (cloudpickle names its code "<dynamic-code>")
        raised = FailSome.encode_sample.__code__.co_firstlineno + 3
        frame = f'File "{__file__}", line {raised}, in encode_sample\n    raise ValueError(f"cannot encode {{index}}")\n'
        assert re.search(rf'RemoteTraceback: \n"""\nTraceback .*{re.escape(frame)}', handled, re.S), handled
        assert handled.rstrip().splitlines()[-1].startswith("ValueError: cannot encode ")


@pytest.mark.parametrize("segment", [6, None])
def test_custom_error_handler_is_called_once_per_failure_across_a_save_and_restore(good, segment):
    """Each failure reaches the handler once, when the loader reaches its place: a loader saved after
    k batches and one restored from its state call it, together, for the same failures in the same
    order as one loader that runs through (the handler was called for a whole segment's failures as
    its block arrived: before the batches ahead of them, and again after the restore, which reads that
    segment once more)."""

    def run(calls, k=None, state=None):
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2, global_error_handler=lambda e, s, src: calls.append(s.__key__))
        loader = er.get_savable_loader(er.get_val_dataset(good, split_part="train", worker_config=wc, batch_size=2,
                                                          task_encoder=FailSome(), samples_per_segment=segment))  # fmt: skip
        if state is not None:
            loader.restore_state_rank(state)
        batches, it = [], iter(loader)
        while len(batches) != k:
            batch = next(it, None)
            if batch is None:
                break
            batches.append(list(batch.__key__))
        state = loader.save_state_rank()
        loader.close()
        return batches, state

    whole, _ = run(reference := [])
    assert len(reference) == 4
    for k in range(1, len(whole)):
        first, state = run(before := [], k)
        rest, _ = run(after := [], state=state)
        assert first + rest == whole and before + after == reference, k


# -- configuration errors: raised by get_*_dataset, before any Ray task ---------------------


def test_missing_nv_meta(tmp_path):
    """A folder without .nv-meta names the folder and the command to run."""
    (tmp_path / "raw").mkdir()
    with pytest.raises(er.DatasetConfigError, match=r"raw: not a prepared dataset .*energon-ray prepare"):
        er.get_val_dataset(tmp_path / "raw", batch_size=2)


def test_unknown_split_part(good):
    """An unknown split part names split.yaml and the parts it defines."""
    with pytest.raises(er.DatasetConfigError, match=r"split.yaml: unknown split part 'training'.*\['test', 'train', 'val'\]"):
        er.get_val_dataset(good, split_part="training", batch_size=2)


def test_bad_batch_size(good):
    """batch_size <= 0 is rejected with its value."""
    with pytest.raises(ValueError, match="batch_size must be a positive int or None, got 0"):
        er.get_val_dataset(good, split_part="train", batch_size=0)


@pytest.mark.parametrize("value", [0, -2, 2.5, "2"])
def test_bad_shuffle_over_epochs_multiplier(good, value):
    """A multiplier other than a positive int, -1 or None is rejected with its value (0 and -2 shuffled as 1 did)."""
    with pytest.raises(ValueError, match=rf"shuffle_over_epochs_multiplier must be a positive int, -1 .*, got {value!r}"):
        er.get_train_dataset(good, batch_size=2, shuffle_over_epochs_multiplier=value)


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("virtual_epoch_length", 2.5, "virtual_epoch_length must be an int >= 0 (0: one pass / endless), got 2.5"),
        ("virtual_epoch_length", "3", "virtual_epoch_length must be an int >= 0 (0: one pass / endless), got '3'"),
        ("virtual_epoch_length", None, "virtual_epoch_length must be an int >= 0 (0: one pass / endless), got None"),
        ("parallel_shard_iters", 0, "parallel_shard_iters must be a positive int or None, got 0"),
        ("parallel_shard_iters", -1, "parallel_shard_iters must be a positive int or None, got -1"),
        ("parallel_shard_iters", 2.5, "parallel_shard_iters must be a positive int or None, got 2.5"),
        ("shuffle_buffer_size", -1, "shuffle_buffer_size must be an int >= 0 or None (0 or 1: no shuffle buffer), got -1"),
        ("shuffle_buffer_size", 0.5, "shuffle_buffer_size must be an int >= 0 or None (0 or 1: no shuffle buffer), got 0.5"),
    ],
)
def test_bad_virtual_epoch_length_and_parallel_shard_iters(good, name, value, message):
    """Non-int or out-of-range values are rejected with their value (2.5 batches per epoch gave 3; 0 iters gave 16;
    a shuffle buffer of -1 was refused as not "a positive int", which 0 is not either and is taken, and 0.5 was
    taken)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        er.get_train_dataset(good, batch_size=2, **{name: value})


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda good: er.get_train_dataset(good, batch_size=2, limit=2), "get_train_dataset() got unexpected keyword argument(s) ['limit']"),
        (lambda good: er.get_val_dataset(good, split_part="train", batch_size=2, shufle=1), "get_val_dataset() got unexpected keyword argument(s) ['shufle']"),
        (lambda good: er.get_train_dataset(good, batch_size=2, split_config=5), "split_config must be a file name in .nv-meta (or a path), got 5"),
        (lambda good: er.get_val_dataset(good, batch_size=2, dataset_config=["a.yaml"]), "dataset_config must be a file name in .nv-meta (or a path), got ['a.yaml']"),
    ],
)
def test_unknown_keywords_and_config_names_of_another_type_are_named(good, build, message):
    """An unknown keyword names the function it went to (it said "unexpected keyword arguments" alone);
    split_config/dataset_config that are no file name are refused by name (an int failed inside, "argument
    of type 'int' is not iterable")."""
    with pytest.raises(TypeError) as caught:
        build(good)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda good: er.get_train_dataset(good, batch_size=2, repeat="no"), "repeat must be a bool, got 'no'"),
        (lambda good: er.get_train_dataset(good, batch_size=2, batch_drop_last="yes"), "batch_drop_last must be a bool, got 'yes'"),
        (lambda good: er.get_val_dataset(good, split_part="train", batch_size=2, batch_drop_last=1), "batch_drop_last must be a bool, got 1"),
        (lambda good: er.get_loader(er.get_val_dataset(good, split_part="train", batch_size=2), pin_memory="no"), "pin_memory must be a bool or None, got 'no'"),
        (lambda good: er.get_savable_loader(er.get_val_dataset(good, split_part="train", batch_size=2), pin_memory=0), "pin_memory must be a bool or None, got 0"),
    ],
)
def test_bool_options_refuse_other_values(good, build, message):
    """A flag given as a string or number is refused with its name and value ("no" was read as True)."""
    with pytest.raises(TypeError, match=re.escape(message)):
        build(good)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"prefetch_batches": "x"}, "prefetch_batches must be a whole number >= 0, got 'x'"),
        ({"prefetch_batches": -1, "executor": "ray_data"}, "prefetch_batches must be a whole number >= 0, got -1"),
        ({"prefetch_factor": 1.5}, "prefetch_batches must be a whole number >= 0, got 1.5"),
        ({"object_store_limit": "1GiB"}, "object_store_limit must be a whole number of bytes >= 0 (or null), got '1GiB'"),
        ({"object_store_limit": True}, "object_store_limit must be a whole number of bytes >= 0 (or null), got True"),
    ],
)
def test_loader_amounts_refuse_other_values(good, options, message):
    """prefetch_batches and object_store_limit that are not whole numbers >= 0 are refused by get_loader with
    their name and value (before: accepted, and failed inside a pass's Ray calls, or never read)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        er.get_loader(er.get_val_dataset(good, split_part="train", batch_size=2), **options)


def test_loader_amounts_take_whole_numbers_given_as_floats(good):
    """object_store_limit=1e9 (a float without fraction) and prefetch_batches=0 are taken, as whole numbers."""
    loader = er.get_loader(er.get_val_dataset(good, split_part="train", batch_size=2), object_store_limit=1e9, prefetch_batches=0)
    assert (loader.object_store_limit, loader.prefetch_batches) == (10**9, 0)
    loader.close()


@pytest.mark.parametrize("get", [er.get_train_dataset, er.get_val_dataset, er.get_val_datasets])
@pytest.mark.parametrize("value", [[1, 2], "aug"])
def test_subflavors_that_are_not_a_mapping_are_refused(good, get, value):
    """subflavors=[1, 2] gave a bare "'list' object is not a mapping"; now the argument and value are named."""
    with pytest.raises(TypeError, match=re.escape(f"subflavors must be a mapping of names to values or None, got {value!r}")):
        get(good, split_part="train", batch_size=2, subflavors=value)


def test_unknown_sample_type_and_bad_field_map(tmp_path, good):
    """dataset.yaml errors name the file, the value and the valid choices."""
    path = tmp_path / "copy"
    shutil.copytree(good, path)
    yaml_file = path / ".nv-meta" / "dataset.yaml"
    yaml_file.write_text("sample_type: {__module__: megatron.energon, __class__: CaptionSample}\nfield_map: {image: jpg}\n")
    with pytest.raises(er.DatasetConfigError, match=r"dataset.yaml: unknown sample_type 'CaptionSample'"):
        er.get_val_dataset(path, split_part="train", batch_size=2)
    yaml_file.write_text(
        "sample_type: {__module__: megatron.energon, __class__: CaptioningSample}\n"
        "field_map: {image: jpg, caption: txt, label: cls}\n"
    )
    with pytest.raises(er.DatasetConfigError, match=r"field_map names field 'label', which CaptioningSample does not have"):
        er.get_val_dataset(path, split_part="train", batch_size=2)


def test_index_disagreeing_with_tar(tmp_path, good):
    """A .tar.idx whose count differs from .info.json, and a truncated tar, are named with their paths."""
    path = tmp_path / "copy"
    shutil.copytree(good, path)
    idx = path / "shards" / "shard_0001.tar.idx"
    data = idx.read_bytes()
    idx.write_bytes(data[:-8])
    with pytest.raises(er.DatasetConfigError, match=r"shard_0001.tar.idx: index lists 4 samples but .* says 5"):
        er.get_val_dataset(path, split_part="train", batch_size=2)
    idx.write_bytes(data)
    tar = path / "shards" / "shard_0002.tar"
    os.truncate(tar, os.path.getsize(tar) // 2)
    with pytest.raises(er.DatasetConfigError, match=r"shard_0002.tar: tar is truncated"):
        er.get_val_dataset(path, split_part="train", batch_size=2)


def test_corrupt_tar_record_is_skipped_with_its_path(tmp_path, good):
    """Garbage where a sample's tar header should be is a counted, logged skip naming the shard."""
    path = tmp_path / "copy"
    shutil.copytree(good, path)
    import numpy as np

    tar = path / "shards" / "shard_0001.tar"
    offsets = np.fromfile(str(tar) + ".idx", dtype=np.uint64)
    with open(tar, "r+b") as f:
        f.seek(int(offsets[2]))
        f.write(b"\x00garbage" * 64)
    loader = _val(path, batch_size=4)
    keys = [k for b in keys_of(loader) for k in b]
    assert len(keys) == 19 and "sample_000007" not in keys
    assert loader.stats.skipped == {"read": 1}
