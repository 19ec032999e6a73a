"""What users hit on day one: re-iteration, misspelled keywords, a wrong field_map, dataset code
without the opt-in, abandoned iterations, user types declared in ``__main__``, exit code and quiet."""

from __future__ import annotations

import gc
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import ray
import torch

import energon_ray as er
from energon_ray.format.dataset_yaml import write_dataset_yaml
from energon_ray.pipeline.build import feeder
from tests.helpers import captioning_dataset, prepared

REPO = Path(__file__).resolve().parents[2]
WC = er.WorkerConfig(rank=0, world_size=1, num_workers=2)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return captioning_dataset(tmp_path_factory.mktemp("day_one") / "ds", n=30, per_shard=7)


def _train(path, **kwargs):
    kwargs.setdefault("worker_config", WC)
    return er.get_train_dataset(path, batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=5, **kwargs)


def test_an_endless_loader_iterated_again_continues_where_it_stopped(ds):
    """After a ``break`` and after ``next(iter(loader))``, the next ``iter()`` goes on with the very
    batches a single uninterrupted iteration gives (as Energon's loaders do), never with nothing."""
    loader = er.get_loader(_train(ds))
    got = []
    for batch in loader:
        got.append(batch.__key__)
        if len(got) == 4:
            break
    got.append(next(iter(loader)).__key__)
    it = iter(loader)
    got += [next(it).__key__ for _ in range(5)]
    loader.close()
    reference = er.get_loader(_train(ds))
    it = iter(reference)
    expected = [next(it).__key__ for _ in range(10)]
    reference.close()
    assert got == expected


class FailsWhileFlagged(er.DefaultTaskEncoder):
    """Raises on one sample while a flag file exists (a fault that goes away)."""

    def __init__(self, flag: str, key: str):
        super().__init__()
        self.flag, self.key = flag, key

    def encode_sample(self, sample):
        if sample.__key__ == self.key and os.path.exists(self.flag):
            raise ValueError(f"flagged sample {self.key}")
        return sample


def _raise(exc, sample, sources):
    raise exc


@pytest.mark.parametrize("fault", ["sample_error", "interrupt"])
def test_an_endless_loader_that_an_exception_stopped_continues_after_its_last_batch(ds, tmp_path, monkeypatch, fault):
    """An exception out of an endless loader's ``next()`` (a sample error the error handler
    raises; Ctrl-C while the trainer waits for a block) is raised, and the next ``iter()`` goes on
    after the last batch handed out: the batches before and after are exactly those of one
    uninterrupted iteration (not a loop that ends at once with no batch, nor the pass's rest lost)."""
    import energon_ray.pipeline.build as build

    reference = er.get_loader(_train(ds))
    it = iter(reference)
    expected = [next(it).__key__ for _ in range(12)]
    reference.close()
    flag = tmp_path / "flag"
    if fault == "sample_error":
        flag.touch()
        culprit = expected[5][1]
        wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2, global_error_handler=_raise)
        loader = er.get_loader(_train(ds, worker_config=wc, task_encoder=FailsWhileFlagged(str(flag), culprit)))
    else:
        culprit = None
        loader = er.get_loader(_train(ds))
        get, calls = build.get, [0]

        def interrupted(ref):  # the second block the trainer waits for: Ctrl-C lands there
            calls[0] += 1
            if calls[0] == 2:
                raise KeyboardInterrupt
            return get(ref)

        monkeypatch.setattr(build, "get", interrupted)
    got = []
    with pytest.raises(ValueError if culprit else KeyboardInterrupt) as raised:
        for batch in loader:
            got.append(batch.__key__)
    assert 0 < len(got) < 12  # raised as the block holding the culprit (or the second block) is read
    if culprit:
        assert culprit in str(raised.value)
        flag.unlink()
    else:  # a state saved now continues there too, in another loader
        monkeypatch.setattr(build, "get", get)
        other = er.get_loader(_train(ds))
        other.restore_state_rank(loader.save_state_rank().to_json())
        it = iter(other)
        assert [next(it).__key__ for _ in range(12 - len(got))] == expected[len(got):]
        other.close()
    for batch in loader:
        got.append(batch.__key__)
        if len(got) == 12:
            break
    loader.close()
    assert got == expected


def test_misspelled_loader_and_map_keywords_raise_and_energon_only_ones_warn_once(ds, caplog):
    """``get_loader(pin_memroy=...)`` and ``MapDataset(..., bad=...)`` raise TypeError naming the
    keyword; Energon's watchdog/cache options are accepted with one warning each."""
    val = er.get_val_dataset(ds, split_part="train", batch_size=5, worker_config=WC)
    with pytest.raises(TypeError, match=r"get_loader\(\) got unexpected keyword argument\(s\) \['pin_memroy'\]"):
        er.get_loader(val, pin_memroy=True)
    with pytest.raises(TypeError, match=r"MapDataset\(\) got unexpected keyword argument\(s\) \['stateles'\]"):
        er.MapDataset(val, lambda b: b, stateles=True)
    caplog.set_level(logging.WARNING, logger="energon_ray")
    for _ in range(2):
        loader = er.get_loader(er.get_val_dataset(ds, split_part="train", batch_size=5, worker_config=WC),
                               watchdog_timeout_seconds=60, fail_on_timeout=False)  # fmt: skip
    warned = [r.getMessage() for r in caplog.records if "does not need" in r.getMessage()]
    assert sorted(w.split("(): ")[1].split("=")[0] for w in warned) == ["fail_on_timeout", "watchdog_timeout_seconds"]
    assert sum(len(b.__key__) for b in loader) == 30


def test_a_field_map_naming_a_missing_part_is_an_error_naming_part_and_sample(ds, tmp_path):
    """A field_map reading ``png`` from a dataset of ``jpg`` fails at get_*_dataset, naming the field,
    the part, a sample key and the parts it has (it used to warn and yield 0 batches)."""
    path = captioning_dataset(tmp_path / "ds", n=6, per_shard=3)
    write_dataset_yaml(path, "CaptioningSample", field_map={"image": "png", "caption": "txt"})
    with pytest.raises(er.DatasetConfigError) as info:
        er.get_val_dataset(path, split_part="train", batch_size=2)
    message = str(info.value)
    assert "field 'image'" in message and "part 'png'" in message and "sample_000000" in message
    assert "its parts: ['jpg', 'json', 'txt']" in message


LOADER_PY = textwrap.dedent(
    """
    import os, pathlib
    pathlib.Path(__file__).with_name(f"ran-{os.getpid()}").write_text("yes")

    def load(raw):
        return {"image": raw["jpg"], "caption": "loaded: " + raw["txt"]}
    """
)


def test_dataset_code_runs_only_with_the_opt_in(tmp_path, monkeypatch):
    """A dataset with a sample_loader.py is refused (nothing imported) unless trust_dataset_code=True
    or ENERGON_RAY_TRUST_DATASET_CODE=1; trusted, its loader runs in the Ray workers too."""
    monkeypatch.delenv("ENERGON_RAY_TRUST_DATASET_CODE", raising=False)
    path = captioning_dataset(tmp_path / "ds", n=8, per_shard=4)
    write_dataset_yaml(path, "CaptioningSample", sample_loader="sample_loader.py:load", part_filter=["jpg", "txt"])
    meta = path / ".nv-meta"
    (meta / "sample_loader.py").write_text(LOADER_PY)
    for build in (er.get_train_dataset, er.get_val_dataset):
        with pytest.raises(er.UntrustedCodeError, match="trust_dataset_code=True") as info:
            build(path, split_part="train", batch_size=2)
        assert "sample_loader.py" in str(info.value) and str(meta / "dataset.yaml") in str(info.value)
    assert not list(meta.glob("ran-*"))
    loader = er.get_loader(er.get_val_dataset(path, split_part="train", batch_size=4, trust_dataset_code=True))
    captions = [c for b in loader for c in b.caption]
    assert len(captions) == 8 and all(c.startswith("loaded: ") for c in captions)
    assert {p.name for p in meta.glob("ran-*")} - {f"ran-{os.getpid()}"}  # the Ray workers ran it too
    monkeypatch.setenv("ENERGON_RAY_TRUST_DATASET_CODE", "1")
    assert er.get_val_dataset(path, split_part="train", batch_size=4).dataset.spec.trusted


def _trainer_threads() -> set:
    return {t.ident for t in threading.enumerate()}


def _settled(probe, ok, timeout: float = 20.0):
    """``probe()`` once ``ok(value)`` holds (or at the timeout), collecting garbage in between."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        value = probe()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


@pytest.mark.parametrize("executor", ["tasks", "ray_data"])
def test_abandoned_iterations_release_their_executions_threads_and_objects(ds, executor):
    """20 iterations abandoned by ``break`` or by an exception in the loop, then an endless loader
    dropped mid-stream: no execution, thread or object reference stays behind (with plain tasks the
    feeder is never used)."""
    warm = er.get_loader(er.get_val_dataset(ds, split_part="train", batch_size=5, worker_config=WC), executor=executor)
    assert sum(len(b.__key__) for b in warm) == 30
    del warm
    gc.collect()  # loaders other tests dropped
    base_threads = _trainer_threads()
    core = ray._private.worker.global_worker.core_worker
    base_refs = len(core.get_all_reference_counts())
    usage = lambda: ray.get(feeder().usage.remote())  # noqa: E731
    base_feeder = usage()
    loader = er.get_loader(er.get_val_dataset(ds, split_part="train", batch_size=5, worker_config=WC), executor=executor)
    for i in range(20):
        try:
            for n, batch in enumerate(loader):
                if n == i % 3:
                    if i % 2:
                        raise ValueError("training step failed")
                    break
        except ValueError:
            pass
    endless = er.get_loader(_train(ds), executor=executor)
    it = iter(endless)
    for _ in range(3):
        next(it)
    if executor == "ray_data":
        # the endless loader's execution runs on (the feeder is a threaded actor: its submit may still be on its way)
        assert _settled(usage, lambda u: u["runs"] >= 1)["runs"] >= 1
    else:
        assert usage()["submitted"] == base_feeder["submitted"]  # plain tasks: the feeder runs nothing
    del loader, endless, it, batch
    left = _settled(usage, lambda u: u["runs"] <= base_feeder["runs"] and u["refs"] <= base_feeder["refs"])
    assert left["runs"] <= base_feeder["runs"] and left["refs"] <= base_feeder["refs"], (left, base_feeder)
    assert _settled(lambda: len(core.get_all_reference_counts()), lambda n: n <= base_refs) <= base_refs
    assert _settled(_trainer_threads, lambda t: t <= base_threads) <= base_threads


SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import energon_ray as er
    from user_types import ModuleBatch

    @er.edataclass
    class MainSample(er.Sample):
        image: torch.Tensor
        caption: str

    @er.edataclass
    class MainBatch(er.Batch):
        image: torch.Tensor
        caption: list

    class Encoder(er.DefaultTaskEncoder):
        def encode_sample(self, sample):
            return MainSample.derive_from(sample, image=sample.image, caption=sample.caption)

        def batch(self, samples):
            return MainBatch.from_samples(samples)

    class ModuleEncoder(er.DefaultTaskEncoder):
        def batch(self, samples):
            return ModuleBatch(__key__=[s.__key__ for s in samples], n=len(samples))

    path = sys.argv[1]
    loader = er.get_loader(er.get_val_dataset(path, split_part="train", batch_size=4, task_encoder=Encoder()))
    batches = list(loader)
    assert all(type(b) is MainBatch for b in batches), {type(b) for b in batches}
    print("main", sum(len(b.caption) for b in batches), type(batches[0].image).__name__, tuple(batches[0].image[0].shape))
    module = er.get_loader(er.get_val_dataset(path, split_part="train", batch_size=4, task_encoder=ModuleEncoder()))
    print("module", sum(b.n for b in module), type(next(iter(module))).__module__)
    endless = er.get_loader(er.get_train_dataset(path, batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=5))
    it = iter(endless)
    print("endless", [len(next(it).__key__) for _ in range(5)])
    if "--shutdown" in sys.argv:  # the user shuts Ray down while the loader still runs
        import ray
        from energon_ray import ray_env

        def keys(executor):
            wc = er.WorkerConfig(rank=0, world_size=1, num_workers=2)
            ds = er.get_val_dataset(path, split_part="train", batch_size=4, worker_config=wc)
            return [key for batch in er.get_loader(ds, executor=executor) for key in batch.__key__]

        before = keys("tasks")
        first = ray_env.connected()
        ray.shutdown()
        # then loads again, as a notebook does: on a new private Ray, which it shuts down too
        after = {executor: keys(executor) for executor in ("ray_data", "tasks")}
        print(len(before), after["tasks"] == before, after["ray_data"] == before)
        print(ray_env.connected() != first, ray_env._warmed == ray_env.connected())
        ray.shutdown()
    """
)

USER_TYPES = textwrap.dedent(
    """
    import energon_ray as er

    @er.edataclass
    class ModuleBatch(er.Batch):
        n: int
    """
)


def test_a_script_with_its_own_types_runs_quietly_exits_0_and_keeps_loading_after_restarting_ray(ds, tmp_path):
    """A user script (own private Ray) declaring @edataclass types in __main__ and in a module next to
    it gets batches of those types, leaves an endless loader running at exit (with Ray up, or after
    shutting Ray down itself), prints nothing of Ray's and exits with code 0. Both exits run side by
    side (two scripts, two private Rays); the second with ``RAY_AUTH_MODE`` unset, as a user's
    shell has it (Ray then turns token authentication on and would announce it).

    The second then keeps loading, as a notebook's `ray.shutdown()` and a new loader do: the new
    private Ray gets its own feeder actor and warm-up (both were kept per job id, which a fresh cluster
    gives again: the Ray Data executor then called the old cluster's actor, "Can't find actor … from a
    different cluster"), and both executors give the batches the first Ray gave. (One script for both
    behaviours: every process imports torch and Ray and starts its own Ray, seconds each.)"""
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "user_types.py").write_text(USER_TYPES)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_DATA_", "RAY_ADDRESS", "RAY_DEDUP"))}
    env["PYTHONPATH"] = str(REPO)
    unset = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
    procs = {
        exit_kind: subprocess.Popen(
            [sys.executable, str(tmp_path / "train.py"), str(ds)] + flags, cwd=tmp_path, env=run_env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for exit_kind, flags, run_env in (("loader-running-at-exit", [], env), ("ray-shut-down-first", ["--shutdown"], unset))
    }
    for exit_kind, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (exit_kind, err[-3000:])
        restarted = ["30 True True", "True True"] if exit_kind == "ray-shut-down-first" else []
        assert out.splitlines() == ["main 30 list (3, 48, 64)", "module 30 user_types", "endless [4, 4, 4, 4, 4]", *restarted], (exit_kind, err[-3000:])
        noise = [line for line in err.splitlines() if line.strip()]
        assert noise == [], (exit_kind, noise[:20])


class _Tripwire:
    """Unpickling this creates a file: proof that a pickle from the dataset was executed."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickled_parts_stop_loading_unless_trusted(tmp_path):
    """A dataset whose field_map reads a pickled part stops at once with an error naming the shard,
    sample, part and the opt-in (no sample is unpickled); trusted, the pickles load."""
    trip = tmp_path / "unpickled"
    samples = [(f"s{i:03d}", {"pyd": pickle.dumps(_Tripwire(str(trip)) if i == 0 else f"text {i}")}) for i in range(6)]
    path = prepared(tmp_path / "ds", samples, 3, sample_type="TextSample", field_map={"text": "pyd"})
    with pytest.raises(er.FatalSampleError) as info:
        list(er.get_loader(er.get_val_dataset(path, split_part="train", batch_size=2, worker_config=WC)))
    message = str(info.value)
    assert "UntrustedCodeError" in message and "part 'pyd'" in message and "trust_dataset_code=True" in message
    assert f"dataset {path}: shards/shard_0000.tar: sample 's000'" in message
    assert not trip.exists()
    clean = prepared(tmp_path / "clean", samples[1:], 3, sample_type="TextSample", field_map={"text": "pyd"})
    loader = er.get_loader(er.get_val_dataset(clean, split_part="train", batch_size=5, trust_dataset_code=True))
    assert sorted(t for b in loader for t in b.text) == [f"text {i}" for i in range(1, 6)]


class _GuessingEncoder(er.DefaultTaskEncoder):
    decoder = er.SampleDecoder(guess_content=True)


def test_guess_content_loads_images_stored_as_pkl_untrusted_and_still_stops_at_a_real_pickle(tmp_path):
    """With SampleDecoder(guess_content=True) and no opt-in, images stored in a 'pkl' part load as those
    images (as Energon's decoder gives them); a real pickle there stops the loader with an error naming
    the shard, sample, part and the opt-in, and is never unpickled."""
    from energon_ray.synthetic import encode_image, sample_image

    png_bytes = encode_image(sample_image(0, (10, 6)), "PNG")
    images = [(f"s{i:03d}", {"pkl": png_bytes, "txt": f"c{i}".encode()}) for i in range(4)]
    good = prepared(tmp_path / "good", images, 2, field_map={"image": "pkl", "caption": "txt"})
    loader = er.get_loader(er.get_val_dataset(good, split_part="train", batch_size=4, worker_config=WC,
                                              task_encoder=_GuessingEncoder()))  # fmt: skip
    batches = list(loader)
    png = er.SampleDecoder().decode_part("png", png_bytes)
    assert sorted(k for b in batches for k in b.__key__) == [f"s{i:03d}" for i in range(4)]
    assert all(torch.equal(image, png) for b in batches for image in b.image)
    trip = tmp_path / "unpickled"
    mixed = images[:2] + [("s002", {"pkl": pickle.dumps(_Tripwire(str(trip))), "txt": b"c2"})]
    bad = prepared(tmp_path / "bad", mixed, 3, field_map={"image": "pkl", "caption": "txt"})
    with pytest.raises(er.FatalSampleError) as info:
        list(er.get_loader(er.get_val_dataset(bad, split_part="train", batch_size=3, worker_config=WC,
                                              task_encoder=_GuessingEncoder())))  # fmt: skip
    message = str(info.value)
    assert "UntrustedCodeError" in message and "pickled part 'pkl'" in message and "trust_dataset_code=True" in message
    assert f"dataset {bad}: shards/shard_0000.tar: sample 's002'" in message
    assert not trip.exists()


def test_ray_remote_args_no_task_takes_are_refused_before_any_task_runs(ds):
    """A misspelt option (``num_cpu``) was dropped silently: the tasks ran with Ray's one CPU."""
    dataset = er.get_val_dataset(ds, split_part="train", batch_size=2)
    with pytest.raises(ValueError, match=r"unknown key 'num_cpu' \(did you mean 'num_cpus'\?\)"):
        er.get_loader(dataset, ray_remote_args={"num_cpu": 1})


def test_tasks_no_node_of_the_private_ray_can_hold_are_refused_not_left_waiting(ds, caplog):
    """``{"num_cpus": 100}`` on a 2-CPU private Ray gave one batch (made in the trainer), then waited
    forever for tasks Ray could never place; ray.train workers asking for more than the Ray has
    (a GPU on a CPU-only box) waited forever too. On a cluster (its autoscaler may add nodes) a
    warning says so instead."""
    from energon_ray import ray_env

    dataset = er.get_val_dataset(ds, split_part="train", batch_size=2)
    with pytest.raises(ValueError, match=r"ray_remote_args: a segment task asks for CPU 100, which no node of this Ray has \(nodes: CPU 2\); this private local Ray"):
        er.get_loader(dataset, ray_remote_args={"num_cpus": 100})
    with pytest.raises(ValueError, match=r"a ray.train worker asks for CPU 1, 3 at once, and its nodes hold 2 \(nodes: CPU 2\)"):
        ray_env.run_torch_trainer(lambda config: None, {}, num_workers=3, use_gpu=False, cpus_per_worker=1, name=None, storage_path="/tmp", max_failures=0)
    with pytest.raises(ValueError, match=r"a ray.train worker asks for CPU 3, which no node of this Ray has"):
        ray_env.run_torch_trainer(lambda config: None, {}, num_workers=1, use_gpu=False, cpus_per_worker=3, name=None, storage_path="/tmp", max_failures=0)
    ray_env.check_resources({"CPU": 2}, "fits", count=1)  # what the nodes hold passes
    ray_env._private.discard(ray_env.connected())  # as if joined to a cluster
    try:
        with caplog.at_level(logging.WARNING, logger="energon_ray"):
            ray_env.check_resources({"CPU": 100}, "a segment task")
    finally:
        ray_env._private.add(ray_env.connected())
    assert "a segment task asks for CPU 100, which no node of this Ray has (nodes: CPU 2); they wait until the cluster's autoscaler" in caplog.text
    assert len(list(er.get_loader(dataset, ray_remote_args={"num_cpus": 1}))) == len(dataset)  # what fits runs
