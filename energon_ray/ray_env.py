"""Starting or joining Ray: a private local instance unless the user names a cluster."""

from __future__ import annotations

import logging
import os
import warnings
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

from energon_ray.ray_settings import (
    FREE_OBJECTS_PERIOD_MS, NOTEBOOK_EXTRAS_LOGGER, STATE_API_CALLBACKS, UnschedulableError, check_reachable, verbose,
)
from energon_ray.signals import release_leaked_logging_locks, sigint_at_default
from energon_ray.task_imports import import_stages, import_without_collections

logger = logging.getLogger("energon_ray")


def import_ray_quietly() -> Any:
    """``ray``, imported without the lines Ray prints in a Jupyter kernel that lacks ``ipywidgets``
    (tqdm's "IProgress not found" warning as Ray imports ``tqdm.auto``, and an INFO line per Ray module
    with a rich display, also for ``ray.train`` later), unless verbose (``ENERGON_RAY_VERBOSE=1``)."""
    quiet = not verbose()
    if quiet:
        logging.getLogger(NOTEBOOK_EXTRAS_LOGGER).setLevel(logging.WARNING)
    with warnings.catch_warnings():
        if quiet:
            warnings.filterwarnings("ignore", message="IProgress not found")
        import ray
    return ray


def ensure_ray(address: Optional[str] = None, **init_kwargs: Any) -> None:
    """Make sure Ray is initialized.

    If Ray is already initialized (a ``ray.train`` worker, a notebook that called ``ray.init``), it is
    used as is. Otherwise: an explicit ``address`` or ``RAY_ADDRESS`` attaches to that cluster; without
    one, a private local Ray is started (``address="local"``), so a stray Ray on the same machine is
    never joined by accident. The private Ray frees released objects every ``FREE_OBJECTS_PERIOD_MS``
    and reports a failed task that Ray retries only when verbose (a ``_system_config`` in
    ``init_kwargs`` may say otherwise); for a cluster of your own, pass
    ``--system-config='{"free_objects_period_milliseconds": 20}'`` to ``ray start --head``.
    """
    ray = import_ray_quietly()
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # quiet by default, also where attaching to a cluster ("Connecting to existing Ray cluster at …")
    init_kwargs.setdefault("configure_logging", True)
    init_kwargs.setdefault("logging_level", logging.INFO if verbose() else logging.WARNING)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        logger.info("energon_ray: attaching to Ray cluster at %s", address)
        check_reachable(address)
        ray.init(address=address, **init_kwargs)
        return
    init_kwargs.setdefault("include_dashboard", False)
    system = dict(init_kwargs.pop("_system_config", None) or {})
    system.setdefault("free_objects_period_milliseconds", FREE_OBJECTS_PERIOD_MS)
    # The loader's segment tasks are owned by this process: a user's ray.shutdown() while a loader
    # still runs fails them "with retries left", and Ray's core worker then logs an error line per
    # task for the error it can no longer push to the (gone) driver. Quiet unless verbose.
    system.setdefault("enable_output_error_log_if_still_retry", verbose())
    # Ray announces that a local cluster turns token authentication on when RAY_AUTH_MODE is unset
    # (a WARNING line at every start of the main job): our private Ray keeps Ray's default, quietly.
    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = auth_log.level
    if not verbose():
        auth_log.setLevel(logging.ERROR)
    try:
        with sigint_at_default():
            ray.init(address="local", _system_config=system, **init_kwargs)
    finally:
        auth_log.setLevel(level)
    _private.add(connected())


#: the connections (``connected()``) of the private local Rays ``ensure_ray`` started: no autoscaler
#: adds a node to them, so a task that no node can hold would wait forever
_private: set = set()


def check_resources(needs: Dict[str, float], what: str, count: int = 1) -> None:
    """Refuse ``count`` tasks or workers that each need ``needs`` (``{"CPU": 1, "GPU": 1}``) where
    they could never all run: no live node has ``needs``, or the nodes together hold fewer than
    ``count`` of them. On the private local Ray that is an error (Ray would wait forever); on a
    cluster a warning (its autoscaler may add such nodes).

    Raises:
        UnschedulableError: on a private local Ray, naming ``what``, ``needs`` and the nodes' resources.
    """
    import ray

    needs = {k: v for k, v in needs.items() if v > 0}
    nodes = [node.get("Resources") or {} for node in ray.nodes() if node.get("Alive")]
    if not nodes or not needs:
        return
    room = [min(int(node.get(k, 0) // v) for k, v in needs.items()) for node in nodes]
    if max(room) >= 1 and sum(room) >= count:
        return
    shown = ", ".join(f"{k} {v:g}" for k, v in needs.items())
    have = "; ".join(", ".join(f"{k} {node.get(k, 0):g}" for k in needs) for node in nodes)
    problem = f"{what} asks for {shown}, " + (
        "which no node of this Ray has" if max(room) < 1 else f"{count} at once, and its nodes hold {sum(room)}"
    ) + f" (nodes: {have})"
    if connected() in _private:
        raise UnschedulableError(f"{problem}; this private local Ray has no autoscaler to add a node, so it would wait forever")
    logger.warning("energon_ray: %s; they wait until the cluster's autoscaler adds such nodes", problem)


def import_task_modules() -> None:
    """Import torch and energon_ray's stages in a Ray task, deaf to Ray's cancel meanwhile; first
    release logging locks an earlier, interrupted task of this worker left held
    (``release_leaked_logging_locks``).

    ``ray.cancel`` (and Ray Data stopping an execution) interrupts a running task with
    ``KeyboardInterrupt`` wherever it is; one that lands inside ``import torch`` leaves torch
    half-registered, and every later task of that worker process fails on import ("Only a single
    TORCH_LIBRARY can be used to register the namespace prims", seen in test_remote). Ray delivers
    the interrupt as SIGINT to the main thread, which is ignored while the imports run
    (``deaf_to_cancel``); a cancel arriving then is dropped, and the task runs on (a closed
    execution's output is not read).
    """
    import sys

    release_leaked_logging_locks()
    give_way()
    if "energon_ray.pipeline.batch_stages" not in sys.modules:
        if _in_ray_worker():
            import_without_collections()
        else:
            import_stages()


def _in_ray_worker() -> bool:
    import ray

    return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE


_threads_limited = False


def limit_torch_threads() -> None:
    """Use as many torch threads as CPUs Ray gave this task (like DataLoader workers use 1)."""
    global _threads_limited
    if _threads_limited:
        return
    import ray
    import torch

    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    except Exception:
        cpus = 1.0
    torch.set_num_threads(max(1, int(round(cpus))))
    _threads_limited = True


def node() -> Optional[str]:
    """This process's Ray node id (~4 µs; not kept: a process that restarts Ray is on another node)."""
    import ray

    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


_gave_way = False


def give_way() -> None:
    """In a Ray worker process, once: lower its CPU priority to ``ENERGON_RAY_WORKER_NICE`` (a
    niceness, 0 to 19; unset or 0: unchanged, the default). A training process beside the workers (a
    private Ray, or a ray.train worker on the same node) then gets a core at once when it needs one,
    and preprocessing keeps every core nobody else wants. Opt-in until measured on a GPU host (on 2
    cores a training thread's 10 ms of CPU took 10.4-10.7 ms wall either way); Ray reuses the process
    for later tasks, which keep the lower priority. Never in the driver (a cold start makes blocks
    there)."""
    global _gave_way
    if _gave_way:
        return
    _gave_way = True
    value = os.environ.get("ENERGON_RAY_WORKER_NICE", "").strip()
    try:
        target = min(19, int(value or 0))
    except ValueError:
        logger.warning("energon_ray: ENERGON_RAY_WORKER_NICE=%r is not a number; the priority is left as is", value)
        return
    if target <= 0 or not _in_ray_worker():
        return
    current = os.nice(0)
    if current < target:
        os.nice(target - current)


def connected() -> Tuple[str, str]:
    """This process's connection to Ray: its job id and its node's id. A process that shuts Ray
    down and starts it again is job 01000000 of the new cluster as it was of the old one (and a
    driver's worker id is derived from its job id), but on a new node (a raylet's id is random);
    joining the same cluster again gives a new job id. What is kept per connection (the feeder
    actor, warm-up) is keyed by both."""
    import ray

    context = ray.get_runtime_context()
    return context.get_job_id(), context.get_node_id()


#: the connection ``warm_up`` last ran for
_warmed: Optional[Tuple[str, str]] = None


def warm_up(workers: Optional[int] = None) -> None:
    """Get Ray ready for the first batch while the caller does other work (builds its model…).

    Ray workers import torch and energon_ray's stages: several seconds on a small machine that would
    otherwise delay the first batch. One task per CPU (``workers``: at most 16 by default), each
    holding a CPU as a segment task does, so the segment tasks reuse exactly these processes instead
    of starting more that import the same again (measured: 4 processes importing torch at once on 2
    cores, first batch 8.3 s). Runs once per connection to Ray (``connected``), in the background;
    failures are ignored (it is only a head start). The loader's feeder actor starts Ray Data and
    its actors itself.
    """
    global _warmed
    connection = connected()
    if _warmed == connection:
        return
    _warmed = connection
    _warming.clear()  # an earlier connection's tasks: gone with its Ray
    import ray

    if workers is None:
        workers = min(16, max(1, int(ray.cluster_resources().get("CPU", 1))))

    @ray.remote(num_cpus=1)
    def _import() -> bool:
        import_task_modules()
        return True

    _warming.extend(_import.remote() for _ in range(workers))


#: ``warm_up``'s import tasks not yet seen finished
_warming: List[Any] = []


def workers_warming() -> bool:
    """Whether ``warm_up``'s imports are still running in some Ray worker (``False`` once all
    finished, or where this process started none)."""
    if not _warming:
        return False
    import ray

    try:
        _, rest = ray.wait(list(_warming), num_returns=len(_warming), timeout=0, fetch_local=False)
    except Exception:  # Ray went away: nothing is warming any more
        rest = []
    _warming[:] = rest
    return bool(rest)


def start_ray_data_actors() -> None:
    """Start the two actors Ray Data creates at its first execution: its autoscaling coordinator,
    whose answer gates the first tasks of an execution (measured: a fresh process started only then,
    2-7 s of a cold first batch on 2 cores), and its stats actor. Both are named and shared, so
    creating them early changes nothing but when. Internal Ray Data calls: any failure is ignored."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import get_or_create_autoscaling_coordinator

        get_or_create_autoscaling_coordinator()
    except Exception:  # another Ray version: Ray Data starts it itself
        logger.debug("energon_ray: Ray Data's autoscaling coordinator not started early", exc_info=True)
    try:
        from ray.data._internal.stats import get_or_create_stats_actor

        get_or_create_stats_actor()
    except Exception:
        logger.debug("energon_ray: Ray Data's stats actor not started early", exc_info=True)


#: Ray's internal key-value store (the GCS) namespace of closed executions' marks.
_CLOSED = b"energon_ray_closed"


#: the marks this process wrote, oldest first; one 4096 closes old is dropped (none of its tasks is left)
_MARKED: Deque[str] = deque(maxlen=4096)


def mark_closed(run_id: str) -> None:
    """Mark an execution closed, cluster-wide: a segment task of it that Ray starts after all reads
    nothing (measured: cancelled Ray Data tasks still queued in the feeder's task submitter ran
    seconds later, when the next execution's tasks got workers, and read whole shards again)."""
    try:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(run_id.encode(), b"1", overwrite=True, namespace=_CLOSED)
    except Exception:  # Ray is shutting down: nothing of the run can start any more
        logger.debug("energon_ray: could not mark run %s closed", run_id, exc_info=True)
        return
    if len(_MARKED) == _MARKED.maxlen:
        forget_closed(_MARKED[0])
    _MARKED.append(run_id)


def is_closed(run_id: Optional[str]) -> bool:
    """Whether ``mark_closed(run_id)`` happened (``False`` when it cannot be told: then the task reads)."""
    if not run_id:
        return False
    try:
        from ray.experimental.internal_kv import _internal_kv_exists

        return bool(_internal_kv_exists(run_id.encode(), namespace=_CLOSED))
    except Exception:
        return False


def forget_closed(run_id: str) -> None:
    """Drop a close mark (long after the close: no task of the run is left)."""
    try:
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(run_id.encode(), namespace=_CLOSED)
    except Exception:
        pass


def train_rank_world() -> Optional[Tuple[int, int]]:
    """World rank and size inside a ``ray.train`` worker, else ``None``."""
    try:
        import_ray_quietly()
        import ray.train

        ctx = ray.train.get_context()
        return int(ctx.get_world_rank()), int(ctx.get_world_size())
    except Exception:  # not inside a Ray Train worker
        return None


def torch_trainer_class() -> Any:
    """``ray.train.torch.TorchTrainer``; on a private local Ray ``ensure_ray`` started (unless verbose),
    a subclass without Ray Train's callbacks that need the State API (``STATE_API_CALLBACKS``)."""
    ensure_ray()
    from ray.train.torch import TorchTrainer

    if verbose() or connected() not in _private or not hasattr(TorchTrainer, "_create_default_callbacks"):
        return TorchTrainer

    class PrivateRayTorchTrainer(TorchTrainer):
        """A TorchTrainer for a Ray without a dashboard."""

        def _create_default_callbacks(self) -> List[Any]:
            found = super()._create_default_callbacks()
            return [callback for callback in found if type(callback).__name__ not in STATE_API_CALLBACKS]

    return PrivateRayTorchTrainer


def run_torch_trainer(loop: Any, config: dict, *, num_workers: int, use_gpu: bool, cpus_per_worker: float,
                      name: Optional[str], storage_path: str, max_failures: int, what: str = "a ray.train worker") -> Any:  # fmt: skip
    """``TorchTrainer(loop).fit()`` on the Ray of ``ensure_ray``: ``num_workers`` workers of
    ``cpus_per_worker`` CPUs each, checkpoints under ``storage_path``; Ray Train's ``Result``.

    Raises:
        UnschedulableError: workers the private local Ray could never hold (``what`` names them).
    """
    TorchTrainer = torch_trainer_class()  # first: Ray is imported quietly
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    check_resources({"CPU": cpus_per_worker, **({"GPU": 1.0} if use_gpu else {})}, what, count=num_workers)
    trainer = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus_per_worker}),
        run_config=RunConfig(name=name, storage_path=storage_path, failure_config=FailureConfig(max_failures=max_failures)),
    )
    return trainer.fit()


class LightningOnRay:
    """What a ``ray.train`` worker needs to run Lightning through Ray's integration: the
    ``Trainer`` overrides (``RayDDPStrategy``, ``RayLightningEnvironment``), the report callback,
    ``prepare_trainer``, the checkpoint to resume from, and how to hand rank 0's result back."""

    def __init__(self, use_gpu: bool):
        import ray.train
        from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

        self.overrides = dict(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()], devices="auto",
                              accelerator="gpu" if use_gpu else "cpu")  # fmt: skip
        self.callback = RayTrainReportCallback()
        self.checkpoint_name = RayTrainReportCallback.CHECKPOINT_NAME
        self.prepare_trainer = prepare_trainer
        self.checkpoint = ray.train.get_checkpoint()
        self._report = ray.train.report

    def hand_back(self, summary: dict) -> dict:
        """Rank 0's result: Ray Train v2 returns the loop's value to the driver; v1 only reported metrics."""
        try:
            from ray.train.v2._internal.constants import is_v2_enabled

            v2 = bool(is_v2_enabled())
        except ImportError:
            v2 = False
        if not v2:
            self._report({"summary": summary})
        return summary
