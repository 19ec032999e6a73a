"""``ray job submit`` of the main job to a real head started by ``ray start`` (README's cluster steps).

The head runs on free ports with its own temporary folder; the test stops exactly that head (its
processes and their children), never the session's Ray or anyone else's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import ray

from tests.helpers import tiny_job_config

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _head_processes(temp: str):
    """The processes whose command line names the head's folder, and their children (never this one)."""
    found = {}
    me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid in me:
            continue
        try:
            if any(temp in part for part in proc.info["cmdline"] or ()):
                found[proc.pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return list(found.values())


def _stop_head(temp: str) -> None:
    procs = _head_processes(temp)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=3)  # the head's gcs_server and a daemon wait out any grace: kill them
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)


def test_ray_job_submit_runs_the_main_job_on_a_real_head(tmp_path):
    temp = tempfile.mkdtemp(prefix="erh", dir="/tmp")  # short: Ray's socket paths must stay under 107 bytes
    port, dashboard = _free_port(), _free_port()
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    address = f"http://127.0.0.1:{dashboard}"
    cfg = tiny_job_config(tmp_path)
    # every port of its own: another Ray on this machine (the session's) holds the default agent ports
    agent_ports = [f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
                   f"--runtime-env-agent-port={_free_port()}", f"--metrics-export-port={_free_port()}"]  # fmt: skip
    started = subprocess.run(
        [RAY, "start", "--head", f"--port={port}", f"--dashboard-port={dashboard}", "--dashboard-host=127.0.0.1",
         f"--temp-dir={temp}", "--num-cpus=2", "--include-dashboard=true", "--disable-usage-stats", *agent_ports],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        runtime_env = {"py_executable": sys.executable, "excludes": [".venv", ".git", ".pytest_cache", "notebooks", "benchmarks"]}
        for _ in range(15):  # the head's job agent comes up a few seconds after `ray start` returns
            submitted = subprocess.run(
                [RAY, "job", "submit", "--address", address, "--working-dir", str(ROOT), "--runtime-env-json",
                 json.dumps(runtime_env), "--", sys.executable, "jobs/captioning_job.py", "--config", str(cfg),
                 "--workdir", str(tmp_path / "run")],
                env=env, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            output = submitted.stdout + submitted.stderr
            if "No available agent to submit job" not in output:
                break
            time.sleep(2)
        assert submitted.returncode == 0, output[-4000:]
        job = re.search(r"Job '(raysubmit_\w+)' succeeded", output).group(1)
        status = subprocess.run([RAY, "job", "status", "--address", address, job], env=env, capture_output=True, text=True, timeout=60)
        assert re.search(rf"Job '{job}' succeeded", status.stdout + status.stderr), status.stdout[-2000:]
        logs = subprocess.run([RAY, "job", "logs", "--address", address, job], env=env, capture_output=True, text=True, timeout=60).stdout
        assert "batch 0: images (8, 3, 32, 32) torch.float32" in logs
        assert re.search(r"\d+ samples in \d+ batches, [\d.]+ s: \d+ samples/s overall", logs), logs[-3000:]
    finally:
        _stop_head(temp)
    assert _head_processes(temp) == []
    time.sleep(0.5)
    assert ray.get(ray.remote(lambda: 1).remote()) == 1  # the session's own Ray is untouched
    shutil.rmtree(temp, ignore_errors=True)
