"""Stage payload serde round trips, and the per-hook error policy (HookRunner, StageRun, FailureChain)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, List, NamedTuple

import numpy as np
import pyarrow as pa
import pytest
import torch

from energon_ray.errors import FatalSampleError, SampleException, SkipSample, log_exception, reraise_exception
from energon_ray.pipeline import serde
from energon_ray.pipeline.policy import DeferredHandler, FailureChain, HookRunner, StageRun
from energon_ray.samples import CaptioningSample, SourceInfo

# -- serde ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Inner:
    mask: torch.Tensor
    names: List[str]


class Pair(NamedTuple):
    left: torch.Tensor
    right: Any


def _assert_same(a: Any, b: Any) -> None:
    """Deep equality that also checks tensor/array dtype and shape."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name))
    else:
        assert a == b


def _payload() -> dict:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "tensors": {
            "f32": torch.rand(2, 3),
            "f64": torch.rand(3, dtype=torch.float64),
            "f16": torch.rand(4).to(torch.float16),
            "bf16": torch.randn(3, 4).to(torch.bfloat16),
            "i64": torch.arange(5),
            "i8": torch.tensor([-3, 4], dtype=torch.int8),
            "u8": torch.arange(7, dtype=torch.uint8),
            "bool": torch.tensor([True, False, True]),
            "c64": torch.tensor([1 + 2j, -1j], dtype=torch.complex64),
            "zero_d": torch.tensor(42, dtype=torch.int32),
            "empty": torch.empty(0, 3),
            "transposed": base.t(),
            "strided": base[1:, ::2],
        },
        "arrays": [np.arange(6, dtype=np.int16).reshape(2, 3), np.linspace(0, 1, 10)[::3], np.array(3.5)],
        "sample": CaptioningSample(
            __key__="k",
            __restore_key__=("Webdataset", 3),
            __subflavors__={"lang": "en"},
            __sources__=(SourceInfo(dataset_path="/d", index=3, shard_name="s.tar", file_names=("k.jpg",)),),
            image=torch.rand(3, 4, 5),
            caption="a caption with ünïcode",
        ),
        "nested": {
            "inner": Inner(mask=torch.ones(2, 2, dtype=torch.bool), names=["a", "b"]),
            "pair": Pair(torch.zeros(1), "r"),
        },
        "text": "plain",
        "numbers": (1, 2.5, None),
    }


def test_serde_round_trips_nested_structures_with_many_dtypes():
    """loads(dumps(x)) == x for nested containers of tensors (bf16, 0-d, views…), arrays and strings."""
    obj = _payload()
    _assert_same(serde.loads(serde.dumps(obj)), obj)


def test_serde_round_trips_tensors_that_need_grad():
    """A tensor with requires_grad comes back equal and still requiring grad."""
    t = torch.ones(3, requires_grad=True)
    out = serde.loads(serde.dumps({"t": t}))["t"]
    assert out.requires_grad and torch.equal(out.detach(), t.detach())


def test_loaded_tensors_and_arrays_are_writable_and_independent():
    """Loaded tensors and arrays can be modified in place without touching the original or another load."""
    obj = _payload()
    payload = serde.dumps(obj)
    first, second = serde.loads(payload), serde.loads(payload)
    for name, t in first["tensors"].items():
        if t.numel() == 0:
            continue
        if t.dtype == torch.bool:
            t.logical_not_()
        else:
            t.add_(1)
        assert not torch.equal(t, second["tensors"][name]), name
        assert torch.equal(second["tensors"][name], obj["tensors"][name]), name
    for arr in first["arrays"]:
        assert arr.flags.writeable
        arr += 1
    first["sample"].image.mul_(0)
    assert torch.equal(second["sample"].image, obj["sample"].image)


def test_loaded_views_are_contiguous_copies():
    """A non-contiguous view is loaded as a contiguous tensor with the view's values."""
    base = torch.arange(12).reshape(3, 4)
    view = base[:, 1::2]
    out = serde.loads(serde.dumps(view))
    assert out.is_contiguous() and out.tolist() == view.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16], ids=str)
def test_a_small_view_ships_only_its_own_elements(dtype):
    """Serializing a 10-element slice of a 1M-element tensor writes ~its 10 elements, not the base storage."""
    base = torch.zeros(1_000_000, dtype=dtype)
    payload = serde.dumps({"x": base[:10]})
    assert len(payload) < 10_000
    out = serde.loads(payload)["x"]
    assert out.dtype == dtype and out.shape == (10,)


def test_loads_accepts_bytes_memoryview_and_arrow_buffers():
    """loads accepts the payload as bytes, a memoryview or a pyarrow Buffer."""
    payload = serde.dumps({"x": torch.arange(4), "s": "v"})
    for form in (bytes(payload), memoryview(payload), pa.py_buffer(bytes(payload))):
        out = serde.loads(form)
        assert out["x"].tolist() == [0, 1, 2, 3] and out["s"] == "v"


def test_classes_go_by_reference_until_their_module_is_registered_by_value():
    """A class of an importable module is pickled by name (decided once, then remembered); after
    ``cloudpickle.register_pickle_by_value(module)`` the next payload carries it by value, so it
    loads where the module cannot be imported; a class defined in a function always goes by value."""
    import sys
    import types

    import cloudpickle

    module = sys.modules["serde_probe_module"] = types.ModuleType("serde_probe_module")
    try:
        exec("import dataclasses\n@dataclasses.dataclass\nclass Probe:\n    x: int\n", module.__dict__)
        by_name = [serde.dumps(module.Probe(x)) for x in (1, 2)]
        assert all(b"serde_probe_module" in bytes(p) and b"dataclass" not in bytes(p) for p in by_name)
        cloudpickle.register_pickle_by_value(module)
        try:
            by_value = serde.dumps(module.Probe(3))
        finally:
            cloudpickle.unregister_pickle_by_value(module)
    finally:
        del sys.modules[module.__name__]
    with pytest.raises(ModuleNotFoundError):
        serde.loads(by_name[0])
    loaded = serde.loads(by_value)
    assert type(loaded).__name__ == "Probe" and loaded.x == 3


def test_a_class_whose_name_now_leads_elsewhere_is_no_longer_sent_by_name():
    """A class pickled by name once, then replaced in its module under that name (a reload, a
    rebinding): its instances stop going by name (which would load as the new class) and load as
    instances of the class they are."""
    import sys
    import types

    module = sys.modules["serde_rebound_module"] = types.ModuleType("serde_rebound_module")
    try:
        exec("class Probe:\n    def __init__(self, x):\n        self.x = x\n", module.__dict__)
        old = module.Probe
        assert type(serde.loads(serde.dumps(old(1)))) is old
        exec("class Probe:\n    def __init__(self, x):\n        self.x = -x\n", module.__dict__)
        assert module.Probe is not old
        loaded = serde.loads(serde.dumps(old(2)))
        assert type(loaded) is old and loaded.x == 2
    finally:
        del sys.modules["serde_rebound_module"]

    @dataclasses.dataclass
    class Local:
        t: torch.Tensor

    for _ in range(2):
        out = serde.loads(serde.dumps(Local(torch.arange(3))))
        assert type(out) is Local and out.t.tolist() == [0, 1, 2]


class _Registered:
    def __init__(self, value: int):
        self.value = value


def test_a_copyreg_reducer_registered_after_the_first_payload_is_used():
    """serde's pickler reads copyreg's registrations as they are at each payload: a reducer
    registered after earlier payloads decides how the next one pickles the type."""
    import copyreg

    assert serde.loads(serde.dumps(_Registered(1))).value == 1
    copyreg.pickle(_Registered, lambda obj: (_Registered, (obj.value + 100,)))
    try:
        assert serde.loads(serde.dumps([_Registered(2)]))[0].value == 102
    finally:
        del copyreg.dispatch_table[_Registered]
    assert serde.loads(serde.dumps(_Registered(3))).value == 3


def test_loads_rejects_foreign_payloads():
    """A payload without serde's magic header raises ValueError."""
    with pytest.raises(ValueError):
        serde.loads(b"NOPE" + bytes(16))


# -- HookRunner ------------------------------------------------------------------------------


def _fails_on(bad, exc=ValueError):
    def hook(x):
        if x in bad:
            raise exc(f"bad item {x}")
        return x * 10

    return hook


def test_hook_runner_returns_the_result_and_counts_no_failure_on_success():
    """A successful call returns the hook's result and leaves the failure counters at zero."""
    runner = HookRunner("encode_sample", _fails_on(()), tolerance=3, handler=log_exception)
    run = runner.new_run()
    assert runner.call(run, 2, "sample 2") == 20
    assert (run.failures, run.ignored, run.trail) == (0, 0, 0) and run.had_success


def test_hook_runner_returns_failed_and_counts_a_value_error():
    """A ValueError in the hook gives FAILED and counts one failure with its message."""
    runner = HookRunner("encode_sample", _fails_on({1}), tolerance=10, handler=log_exception)
    run = runner.new_run()
    assert runner.call(run, 1, "sample k1") is HookRunner.FAILED
    assert run.failures == 1 and run.trail == 1
    assert "sample k1" in run.last_error and "ValueError" in run.last_error and "bad item 1" in run.last_error


def test_a_failure_in_user_code_pickled_by_value_names_its_file_and_line(tmp_path):
    """A hook of the user's module, pickled by value as the segment tasks receive it (cloudpickle names
    its code ``<dynamic-code>``), fails with its module's file and line in the message, and with its
    file, line and source in the traceback a user's error handler gets, as where it was defined."""
    import importlib.util
    import sys

    import cloudpickle

    path = tmp_path / "my_hooks.py"
    path.write_text("def encode_sample(x):\n    raise ValueError(f'bad item {x}')\n")
    spec = importlib.util.spec_from_file_location("my_hooks", path)
    module = sys.modules["my_hooks"] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)
        try:
            shipped = cloudpickle.loads(cloudpickle.dumps(module.encode_sample))
        finally:
            cloudpickle.unregister_pickle_by_value(module)
    finally:
        del sys.modules["my_hooks"]
    assert shipped.__code__.co_filename == "<dynamic-code>"
    for hook in (module.encode_sample, shipped):
        runner = HookRunner("encode_sample", hook, tolerance=10, handler=log_exception)
        run = runner.new_run()
        assert runner.call(run, 1, "sample k1") is HookRunner.FAILED
        assert run.last_error == f"sample k1: ValueError: bad item 1 (at {path}:2 in encode_sample)"
        deferring = HookRunner("encode_sample", hook, tolerance=10, handler=DeferredHandler())
        run = deferring.new_run()
        assert deferring.call(run, 1, "sample k1") is HookRunner.FAILED
        trace = run.deferred[0].trace
        assert f'File "{path}", line 2, in encode_sample\n    raise ValueError(f\'bad item {{x}}\')\n' in trace, trace
        assert trace.endswith("ValueError: bad item 1\n") and "<dynamic-code>" not in trace


def test_a_hook_runner_refusing_none_counts_a_none_result_as_the_hooks_failure():
    """With refuse_none, a hook returning None gives FAILED and a failure naming the stage and the
    item (call and call_many); without it, None is an ordinary result."""
    refusing = HookRunner("pack_selected_samples", lambda x: None, tolerance=10, handler=log_exception, refuse_none=True)
    run = refusing.new_run()
    assert refusing.call(run, 1, "sample k1") is HookRunner.FAILED
    assert refusing.call_many(run, 2, "sample k2") is HookRunner.FAILED
    assert run.failures == 2 and "sample k2: TypeError: pack_selected_samples returned None (a missing `return`?)" in run.last_error
    plain = HookRunner("load", lambda x: None, tolerance=10, handler=log_exception)
    assert plain.call(plain.new_run(), 1, "sample k1") is None


def test_hook_runner_returns_ignored_on_skip_sample_without_counting_a_failure():
    """SkipSample gives IGNORED, counts it as ignored, and does not count a failure."""
    runner = HookRunner("encode_sample", _fails_on({1}, SkipSample), tolerance=1, handler=log_exception)
    run = runner.new_run()
    assert runner.call(run, 1, "sample 1") is HookRunner.IGNORED
    assert (run.failures, run.ignored, run.trail) == (0, 1, 0)


def test_skip_sample_neither_counts_nor_resets_the_consecutive_failures():
    """A skipped item between two failures leaves the run unbroken, so tolerance 2 is reached."""

    def hook(x):
        if x == "skip":
            raise SkipSample()
        raise ValueError(x)

    runner = HookRunner("batch", hook, tolerance=2, handler=log_exception)
    run = runner.new_run()
    runner.call(run, "a", "batch 0")
    runner.call(run, "skip", "batch 1")
    with pytest.raises(FatalSampleError):
        runner.call(run, "b", "batch 2")


@pytest.mark.parametrize("exc", [ImportError, MemoryError, RecursionError, NameError, SystemError, ReferenceError])
def test_system_errors_raise_fatal_sample_error_at_once(exc):
    """A system error (ImportError, MemoryError, …) raises FatalSampleError on its first occurrence;
    ReferenceError (a dead weakref) too, as in Energon's list (it was skipped and counted)."""
    runner = HookRunner("encode_sample", _fails_on({1}, exc), tolerance=100, handler=log_exception)
    with pytest.raises(FatalSampleError) as info:
        runner.call(runner.new_run(), 1, "sample 1")
    assert isinstance(info.value.__cause__, exc)


def test_fatal_sample_error_from_a_hook_propagates_unchanged():
    """A FatalSampleError raised inside the hook propagates as the same exception."""
    err = FatalSampleError("stop now")

    def hook(x):
        raise err

    runner = HookRunner("encode_sample", hook, tolerance=100, handler=log_exception)
    with pytest.raises(FatalSampleError) as info:
        runner.call(runner.new_run(), 1, "sample 1")
    assert info.value is err


def test_tolerance_consecutive_failures_raise_fatal_sample_error():
    """The tolerance-th consecutive failure raises FatalSampleError naming the stage."""
    runner = HookRunner("encode_sample", _fails_on({1, 2, 3}), tolerance=3, handler=log_exception)
    run = runner.new_run()
    assert runner.call(run, 1, "s1") is HookRunner.FAILED
    assert runner.call(run, 2, "s2") is HookRunner.FAILED
    with pytest.raises(FatalSampleError, match="encode_sample"):
        runner.call(run, 3, "s3")


def test_a_success_between_failures_resets_the_count():
    """With a success between them, tolerance-1 failures on each side never raise."""
    runner = HookRunner("encode_sample", _fails_on({1, 2}), tolerance=3, handler=log_exception)
    run = runner.new_run()
    for item in (1, 2, 0, 1, 2, 0, 1, 2):
        runner.call(run, item, f"s{item}")
    assert run.failures == 6 and run.trail == 2


def test_tolerance_zero_never_raises():
    """failure_tolerance 0 disables the limit: any number of failures is only counted."""
    runner = HookRunner("encode_sample", _fails_on(set(range(500))), tolerance=0, handler=log_exception)
    run = runner.new_run()
    for i in range(500):
        assert runner.call(run, i, f"s{i}") is HookRunner.FAILED
    assert run.failures == 500


def test_call_many_lists_the_outputs_of_generator_hooks():
    """call_many turns a generator hook's outputs (0..n) into a list; a plain hook gives a one-item list."""

    def gen(x):
        for i in range(x):
            yield i

    runner = HookRunner("encode_sample", gen, tolerance=5, handler=log_exception)
    run = runner.new_run()
    assert runner.call_many(run, 3, "s") == [0, 1, 2]
    assert runner.call_many(run, 0, "s") == []
    plain = HookRunner("encode_sample", lambda x: x + 1, tolerance=5, handler=log_exception)
    assert plain.call_many(plain.new_run(), 1, "s") == [2]


def test_call_many_keeps_the_outputs_before_an_error_raised_midway_through_a_generator():
    """A generator that fails (or skips) after yielding keeps what it yielded (Energon's lazy map
    gave it) and counts the failure; the failure after outputs is the first of a run (the outputs
    were successes), so it alone never reaches the tolerance."""

    def gen(x):
        yield 1
        yield 2
        raise ValueError("midway")

    def fails_at_once(x):
        raise ValueError("at once")
        yield  # noqa: unreachable

    runner = HookRunner("encode_sample", gen, tolerance=2, handler=log_exception)
    run = runner.new_run()
    assert runner.call_many(run, 0, "s") == [1, 2]
    assert (run.failures, run.trail) == (1, 1) and "after 2 outputs, kept" in run.last_error
    assert runner.call_many(run, 0, "s") == [1, 2]  # the outputs reset the run: no FatalSampleError
    assert run.failures == 2
    at_once = HookRunner("encode_sample", fails_at_once, tolerance=5, handler=log_exception)
    assert at_once.call_many(at_once.new_run(), 0, "s") is HookRunner.FAILED

    def skips(x):
        yield 1
        raise SkipSample()

    skipper = HookRunner("encode_sample", skips, tolerance=5, handler=log_exception)
    run = skipper.new_run()
    assert skipper.call_many(run, 0, "s") == [1] and run.ignored == 1 and run.failures == 0


def test_call_many_on_a_generator_method():
    """A generator defined as a bound method is detected and listed."""

    class TE:
        def encode_sample(self, x):
            yield x
            yield x

    runner = HookRunner("encode_sample", TE().encode_sample, tolerance=5, handler=log_exception)
    assert runner.is_generator
    assert runner.call_many(runner.new_run(), "a", "s") == ["a", "a"]


def test_custom_handler_receives_exception_item_and_sources():
    """A custom handler is called with (exception, item, list of sources) and the item is then FAILED."""
    calls = []
    runner = HookRunner(
        "encode_sample", _fails_on({1}), tolerance=5, handler=lambda e, s, src: calls.append((e, s, src))
    )
    run = runner.new_run()
    source = SourceInfo(dataset_path="/d", index=1, shard_name="s.tar", file_names=("k.jpg",))
    assert runner.call(run, 1, "s1", sources=(source,)) is HookRunner.FAILED
    (exc, item, sources), = calls
    assert isinstance(exc, ValueError) and item == 1 and sources == [source]
    assert run.failures == 1


def test_a_handler_that_raises_aborts_with_its_own_exception():
    """A handler that raises (like reraise_exception) aborts with its own exception, as Energon's
    ErrorContext lets it through (it was wrapped in a FatalSampleError here, while the loader's Ray
    tasks' deferred handler gave the user's exception: a wrapper's map_fn and a segment's hook differed)."""

    class Abort(Exception):
        pass

    def abort(exc, item, sources):
        raise Abort(f"abort on {item}") from exc

    runner = HookRunner("encode_batch", _fails_on({1}), tolerance=100, handler=abort)
    with pytest.raises(Abort, match="abort on 1") as info:
        runner.call(runner.new_run(), 1, "batch 1")
    assert isinstance(info.value.__cause__, ValueError)
    runner.handler = reraise_exception
    with pytest.raises(ValueError, match="bad item 1"):
        runner.call(runner.new_run(), 1, "batch 1")


def test_sample_exception_is_an_ordinary_counted_failure():
    """SampleException (a ValueError) is counted and skipped, not fatal."""
    runner = HookRunner("load", _fails_on({1}, SampleException), tolerance=5, handler=log_exception)
    run = runner.new_run()
    assert runner.call(run, 1, "s1") is HookRunner.FAILED and run.failures == 1


# -- StageRun / FailureChain ---------------------------------------------------------------------


def _segment(pattern: str, tolerance: int = 100, stage: str = "encode_sample") -> StageRun:
    """A segment's run from a pattern like '60F' / 'S40F' / '40FS' (S = success, nF = n failures)."""
    run = StageRun(stage=stage, tolerance=tolerance)
    number = ""
    for ch in pattern:
        if ch.isdigit():
            number += ch
        elif ch == "F":
            for _ in range(int(number or 1)):
                run.failure("boom")
            number = ""
        elif ch == "S":
            run.success()
    return run


def test_stage_run_tracks_leading_and_trailing_failures():
    """StageRun records the failures before the first success (lead) and after the last (trail)."""
    run = _segment("3FS2FS4F")
    assert (run.lead, run.trail, run.failures, run.had_success) == (3, 4, 9, True)


def test_stage_run_keeps_a_bounded_number_of_messages():
    """Only the first MAX_REPORTED messages are kept while the failure count stays exact."""
    from energon_ray.pipeline.policy import MAX_REPORTED

    run = _segment(f"{MAX_REPORTED + 15}F", tolerance=0)
    assert run.failures == MAX_REPORTED + 15 and len(run.messages) == MAX_REPORTED


def test_failure_chain_joins_trailing_and_leading_failures_across_segments():
    """60 trailing failures then 40 leading failures of the next segment reach tolerance 100."""
    chain = FailureChain()
    chain.add(0, _segment("S60F"))
    with pytest.raises(FatalSampleError, match="100 consecutive"):
        chain.add(0, _segment("40FS"))


def test_failure_chain_resets_on_a_success_between_segments():
    """A success at the start of the next segment breaks the run: no error."""
    chain = FailureChain()
    chain.add(0, _segment("S60F"))
    chain.add(0, _segment("S40F"))
    chain.add(0, _segment("59FS"))


def test_failure_chain_carries_through_an_all_failing_segment():
    """30 trailing + a segment of 40 failures only + 30 leading failures reach tolerance 100."""
    chain = FailureChain()
    chain.add(0, _segment("S30F"))
    chain.add(0, _segment("40F"))
    with pytest.raises(FatalSampleError):
        chain.add(0, _segment("30FS"))


def test_failure_chain_keeps_runs_of_workers_and_stages_apart():
    """Failures of different worker streams or different stages are not joined."""
    chain = FailureChain()
    chain.add(0, _segment("S60F"))
    chain.add(1, _segment("40FS"))
    chain.add(0, _segment("40FS", stage="encode_batch"))


def test_failure_chain_ignores_empty_segments():
    """A segment with neither success nor failure keeps the carried run unchanged."""
    chain = FailureChain()
    chain.add(0, _segment("S60F"))
    chain.add(0, _segment(""))
    with pytest.raises(FatalSampleError):
        chain.add(0, _segment("40F"))


def test_failure_chain_with_tolerance_zero_never_raises():
    """With tolerance 0 joined runs of any length pass."""
    chain = FailureChain()
    for _ in range(5):
        chain.add(0, _segment("90F", tolerance=0))


def test_zero_copy_loads_gives_views_of_the_payload():
    """loads(copy=False) rebuilds tensors and nested payloads inside the payload's own memory."""
    inner = serde.dumps({"y": torch.ones(3)})
    n = serde.INBAND_BYTES // 4 + 1  # one float32 over the in-band size
    payload = serde.dumps({"x": torch.arange(n, dtype=torch.float32), "inner": inner})
    out = serde.loads(payload, copy=False)
    start, end = payload.address, payload.address + payload.size
    assert start <= out["x"].data_ptr() < end and out["x"].tolist() == list(range(n))
    assert start <= out["inner"].address < end
    assert serde.loads(out["inner"], copy=False)["y"].tolist() == [1.0, 1.0, 1.0]


def test_tensors_mapped_from_read_only_memory_load_without_a_warning_every_time():
    """A payload in read-only memory (Ray's store, as Python sees it) loads with ``copy=False`` as
    views, without torch's warning about read-only arrays, however often (torch warns once per
    process; the loader stops guarding once it has)."""
    n = serde.INBAND_BYTES // 4 + 1
    payload = pa.py_buffer(serde.dumps({"x": torch.arange(n, dtype=torch.float32)}).to_pybytes())
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = serde.loads(payload, copy=False)
        assert payload.address <= out["x"].data_ptr() < payload.address + payload.size and out["x"][-1] == n - 1


def test_small_tensors_travel_in_the_stream_and_load_writable_and_independent():
    """Tensors up to ``INBAND_BYTES`` are pickled inside the stream (no out-of-band buffer): a
    ``copy=False`` load gives them their own writable memory, outside the payload; a payload
    without buffers keeps the same format (magic, body length, no buffers) and loads as before."""
    small = torch.arange(serde.INBAND_BYTES // 8, dtype=torch.int64).reshape(2, -1)[:, ::2]  # a non-contiguous view
    payload = pa.py_buffer(serde.dumps({"small": small, "key": "a"}).to_pybytes())  # read-only, as Ray's store
    assert bytes(memoryview(payload)[:4]) == b"ERS1" and int.from_bytes(bytes(memoryview(payload)[8:12]), "little") == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's warning for a read-only array would fail here
        out = serde.loads(payload, copy=False)
    assert torch.equal(out["small"], small) and out["small"].is_contiguous() and out["key"] == "a"
    start, end = payload.address, payload.address + payload.size
    assert not start <= out["small"].data_ptr() < end
    out["small"].add_(1)
    assert torch.equal(serde.loads(payload, copy=False)["small"], small)


def test_dumps_parts_joined_is_dumps_and_loads_checks_its_parts():
    obj = {"big": torch.rand(70, 70), "bf16": torch.ones(9000, dtype=torch.bfloat16), "small": torch.arange(3), "s": "v"}
    parts = serde.dumps_parts(obj)
    assert len(parts.buffers) == 2 and parts.buffers[0].address == obj["big"].data_ptr()
    assert serde.join(parts).to_pybytes() == serde.dumps(obj).to_pybytes()
    _assert_same(serde.loads(parts, copy=False), obj)
    with pytest.raises(ValueError, match="do not match their header"):
        serde.loads(serde.Parts(parts.head, parts.buffers[:1]), copy=False)
    assert serde.loads(serde.dumps_parts([1, "x"])) == [1, "x"]


def test_log_exception_names_the_failed_samples_key_and_fields(caplog):
    """The default handler logs, as Energon's prints, the sample it was given: its key and each field
    in short (a tensor's dtype and shape, a text's repr), after the sources and the error."""
    sample = CaptioningSample(__key__="sample_000007", image=torch.zeros(3, 4, 5), caption="a cat")
    source = SourceInfo(dataset_path="/d", index=7, shard_name="parts/shard_0001.tar", file_names=("sample_000007.jpg",))
    try:
        raise ValueError("boom")
    except ValueError as exc:
        with caplog.at_level("WARNING", logger="energon_ray"):
            log_exception(exc, sample, [source])
    lines = caplog.records[-1].getMessage().splitlines()
    assert lines[0] == f"Skipping sample from {source}: ValueError: boom"
    assert lines[1:8] == [
        "sample:", "  __key__: 'sample_000007'", "  __restore_key__: ()", "  __subflavors__: None",
        "  __sources__: None", "  image: Tensor float32 [3, 4, 5]", "  caption: 'a cat'",
    ]  # fmt: skip
    assert lines[8] == "Traceback (most recent call last):"
