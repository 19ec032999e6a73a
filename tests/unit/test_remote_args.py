"""``ray_remote_args`` checked before any task is submitted: unknown keys and bad amounts refused."""

from __future__ import annotations

import pytest

from energon_ray.pipeline.remote_args import GROUP_TASK_OPTIONS, TASK_OPTIONS, check_remote_args, task_needs


def test_task_options_pass_as_given_and_none_is_empty():
    args = {"num_cpus": 0.5, "num_gpus": 0, "memory": 2**30, "resources": {"ssd": 1}, "scheduling_strategy": "SPREAD"}
    assert check_remote_args(args) == args and check_remote_args(args) is not args
    assert check_remote_args(None) == {}
    assert set(GROUP_TASK_OPTIONS) <= set(TASK_OPTIONS)


@pytest.mark.parametrize(
    "args, message",
    [
        ({"num_cpu": 1}, "unknown key 'num_cpu' (did you mean 'num_cpus'?)"),
        ({"gpus": 1}, "unknown key 'gpus' (did you mean 'num_gpus'?)"),
        ({"colour": "red"}, "unknown key 'colour'; the loader's tasks take num_cpus, num_gpus, memory"),
        ({"max_retries": 5}, "unsupported key 'max_retries' (segment tasks are retried 3 times"),
        ({"runtime_env": {"pip": ["x"]}}, "unsupported key 'runtime_env' (give it to ray.init"),
        ({"num_cpus": -1}, "num_cpus must be a number ≥ 0, got -1"),
        ({"num_gpus": "1"}, "num_gpus must be a number ≥ 0, got '1'"),
        ({"memory": True}, "memory must be a number ≥ 0, got True"),
        ({"resources": {"ssd": None}}, "resources['ssd'] must be a number ≥ 0, got None"),
        ({"resources": ["ssd"]}, "'resources' must map resource names to amounts, got ['ssd']"),
    ],
)
def test_a_key_no_task_takes_or_a_bad_amount_is_refused_by_name(args, message):
    with pytest.raises(ValueError) as caught:
        check_remote_args(args)
    assert str(caught.value).startswith("ray_remote_args: ") and message in str(caught.value)


def test_not_a_mapping_is_a_type_error():
    with pytest.raises(TypeError, match="ray_remote_args must be a dict of Ray task options, got list"):
        check_remote_args([("num_cpus", 1)])


def test_a_tasks_needs_default_to_one_cpu():
    assert task_needs({}) == {"CPU": 1.0}
    assert task_needs({"num_cpus": 0.25, "num_gpus": 1, "memory": 100, "resources": {"ssd": 2, "off": 0}}) == {
        "CPU": 0.25, "GPU": 1.0, "memory": 100.0, "ssd": 2.0,
    }  # fmt: skip
    assert task_needs({"num_gpus": 1}, GROUP_TASK_OPTIONS) == {"CPU": 1.0}  # group tasks take no GPU


@pytest.mark.parametrize(
    "args, early",
    [
        (None, True),
        ({"num_cpus": 2, "scheduling_strategy": "DEFAULT", "label_selector": {"zone": "a"}}, True),
        ({"num_gpus": 1}, False),
        ({"memory": 2**30}, False),
        ({"resources": {"ssd": 1}}, False),
        ({"accelerator_type": "H100"}, False),
        ({"num_gpus": 0, "resources": {}}, True),
    ],
)
def test_chained_tasks_wait_for_their_carry_only_where_waiting_holds_cpus_alone(args, early):
    from energon_ray.pipeline.remote_args import waits_holding_cpus_only

    assert waits_holding_cpus_only(args) is early
