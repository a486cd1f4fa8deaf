"""Concurrent sweeps (``hydra/launcher=parallel``): overlap, GPU quota and policy order, config
errors before anything starts, the sweep id on the cluster request, and Ctrl-C releasing every
live run.

Concurrency is proven from the times the launcher recorded (``launches.jsonl``), never from the
wall-clock length of a test. The fast tests use ``provider=sim``; the slow one trains two real
local clusters at once and interrupts them.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import sweep
from orchestrator.rundir import index
from orchestrator.simulate.queue import QueuedRun, admit, priority_key
from provisioning.base import Role
from tests.orchestrator.proc_utils import live_processes_mentioning
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    fake_fixture,
    make_provider_fixture,
    small_request,
)

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
SIM = ["+experiment=icac19_k80", "provider=sim", "hydra/launcher=parallel"]


def orchestrate(repo_root: Path, *args: str, timeout: float = 300
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", "-m", *args], cwd=repo_root,
                          env={**ENV, "PYTHONPATH": str(repo_root)}, capture_output=True,
                          text=True, timeout=timeout)


def launches(sweep_dir: Path) -> list[dict[str, Any]]:
    path = sweep_dir / index.LAUNCHES_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def intervals(sweep_dir: Path) -> dict[int, tuple[float, float, int]]:
    """num -> (started, ended, GPUs) from the launcher's record."""
    rec = launches(sweep_dir)
    start = {e["num"]: e["time"] for e in rec if e["kind"] == "started"}
    end = {e["num"]: e["time"] for e in rec if e["kind"] == "ended"}
    gpus = {e["num"]: e["gpus"] for e in rec}
    return {n: (start[n], end[n], gpus[n]) for n in start}


def rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / index.RUNS_CSV) as fh:
        return list(csv.DictReader(fh))


# --- in-process: the ordering the launcher shares with the simulated queue ----------------------


def test_start_order_and_admission_follow_the_policy() -> None:
    runs = [QueuedRun("a", 4, math.nan, 300.0), QueuedRun("b", 2, math.nan, 100.0),
            QueuedRun("c", 1, math.nan, math.inf), QueuedRun("d", 3, math.nan, 200.0)]
    fifo = sorted(runs, key=lambda r: priority_key("fifo", r, runs.index(r)))
    spf = sorted(runs, key=lambda r: priority_key("spf", r, runs.index(r)))
    assert [r.name for r in fifo] == ["a", "b", "c", "d"]
    assert [r.name for r in spf] == ["b", "d", "a", "c"]  # no prediction: last
    gpus = lambda r: r.gpus  # noqa: E731
    assert [r.name for r in admit(fifo, 5, gpus)] == ["a", "c"]  # b does not fit after a
    assert [r.name for r in admit(spf, 5, gpus)] == ["b", "d"]
    assert [r.name for r in admit(spf, math.inf, gpus, slots=3)] == ["b", "d", "a"]
    with pytest.raises(ValueError, match="preemption"):
        priority_key("las", runs[0], 0)


# --- provider=sim through the real command line ----------------------------------------------


def test_sweep_runs_concurrently_under_the_quota_in_spf_order(repo_root: Path,
                                                             tmp_path: Path) -> None:
    """1, 2 and 4 K80 workers (1, 2, 4 GPUs) under a quota of 6: SPF starts the fastest (4
    workers) and the 2-worker run beside it; the 1-worker run waits for GPUs."""
    sweep_dir = tmp_path / "sweep"
    proc = orchestrate(repo_root, *SIM, "cluster.workers=1,2,4", "queue.quota_gpus=6",
                       "queue.policy=spf", "queue.max_concurrent=3",
                       f"hydra.sweep.dir={sweep_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    runs = intervals(sweep_dir)
    assert sorted(runs) == [0, 1, 2]
    order = sorted(runs, key=lambda n: runs[n][0])
    assert order == [2, 1, 0]  # shortest predicted first: 4 workers, then 2, then 1
    started = [e["num"] for e in launches(sweep_dir) if e["kind"] == "started"]
    assert started == [2, 1, 0]
    (s4, e4, _), (s2, e2, _), (s1, _, _) = runs[2], runs[1], runs[0]
    assert s2 < e4 and s4 < e2  # the 4- and 2-worker runs were live at the same time
    assert s1 >= min(e4, e2)  # 1 + 2 + 4 > 6: the third waited for a run to end
    for start, _, _ in runs.values():  # never over the quota
        assert sum(g for s, e, g in runs.values() if s <= start < e) <= 6
    table = rows(sweep_dir)
    assert sorted(r["cluster.workers"] for r in table) == ["1", "2", "4"]
    assert all(r["status"] == "completed" and r["provider"] == "sim" for r in table)
    assert len({r["run_dir"] for r in table}) == 3
    assert all(Path(r["run_dir"]).parent == sweep_dir for r in table)
    assert "[1/3] ended: completed" in proc.stdout and "[3/3] started" in proc.stdout


def test_config_error_in_one_point_starts_nothing(repo_root: Path, tmp_path: Path) -> None:
    """The 8-worker point needs more GPUs than the quota: the sweep stops with one line before
    the 1-worker point (fine on its own) starts."""
    sweep_dir = tmp_path / "sweep"
    proc = orchestrate(repo_root, *SIM, "cluster.workers=1,8", "queue.quota_gpus=4",
                       f"hydra.sweep.dir={sweep_dir}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: queue.quota_gpus: "), lines
    assert "needs 8 GPUs" in lines[0] and "[sweep point: " in lines[0]
    assert "cluster.workers=8" in lines[0]
    assert launches(sweep_dir) == []  # nothing queued, nothing started
    assert not [p for p in sweep_dir.iterdir() if p.is_dir()]


@pytest.mark.parametrize(("first", "other", "gpus", "field", "text"), [
    (["queue.policy=las"], ["queue.policy=las"], 0, "queue.run_gpus", "never preempt"),
    (["queue.policy=gittins"], ["queue.policy=gittins"], 0, "queue.run_gpus", "0 GPUs"),
    (["queue.quota_gpus=4"], ["queue.quota_gpus=8"], 1, "queue.quota_gpus", "differs"),
    (["queue.las_threshold_gpu_h=1"], ["queue.las_threshold_gpu_h=2"], 1,
     "queue.las_threshold_gpu_h", "differs"),
], ids=["las-without-gpus", "gittins-without-gpus", "two-quotas", "two-thresholds"])
def test_queue_settings_a_real_sweep_cannot_follow(first: list[str], other: list[str],
                                                   gpus: int, field: str, text: str) -> None:
    """las and gittins measure service in GPUs × time: a run holding none is refused (CPU
    workers here declare theirs with queue.run_gpus); one queue setting per sweep."""
    from orchestrator.config.errors import ConfigError
    from orchestrator.parallel import Point, _check_queue
    from orchestrator.validate import compose_experiment

    base = ["provider=sim"]
    exp0 = compose_experiment("icac19_k80", base + first)
    exp1 = compose_experiment("icac19_k80", base + other)
    point = Point(1, other, None, Path("1"), gpus=gpus, predicted_s=1.0)
    with pytest.raises(ConfigError) as err:
        _check_queue(exp1, exp0, point)
    assert err.value.line().startswith(f"config error: {field}: ") and text in err.value.line()
    _check_queue(exp0, exp0, Point(0, first, None, Path("0"), gpus=1, predicted_s=1.0))


def test_a_nonpositive_las_threshold_is_a_config_error() -> None:
    from orchestrator.config.errors import ConfigError
    from orchestrator.validate import compose_experiment

    with pytest.raises(ConfigError) as err:
        compose_experiment("icac19_k80", ["provider=sim", "queue.las_threshold_gpu_h=0"])
    assert err.value.line().startswith("config error: queue.las_threshold_gpu_h: ")


# --- the sweep id reaches the provider ----------------------------------------------------------


def test_sweep_id_on_the_request_labels_every_vm(fake, make_provider, tmp_path: Path) -> None:
    """GCE takes the sweep id from the cluster request (the run context every backend gets),
    for the first VMs and for replacements; a run outside a sweep has no sweep label."""
    provider = make_provider()
    sid = sweep.sweep_id(tmp_path / "cifar10_res32" / "2026-01-01_00-00-00-42")
    assert sid == "cifar10_res32-2026-01-01_00-00-00-42"
    request = dataclasses.replace(small_request("swept", tmp_path, workers=1), sweep_id=sid)
    cluster = provider.acquire(request)
    lone = provider.acquire(small_request("lone", tmp_path / "lone", workers=1))
    new = None
    try:
        labels = {i.name: i.body["labels"] for i in fake.live_instances()}
        swept = [v for v in labels.values() if v["run-id"] == "swept"]
        assert len(swept) == 2 and all(v["sweep-id"] == sid for v in swept)
        assert all("sweep-id" not in v for v in labels.values() if v["run-id"] == "lone")
        new = provider.replace(cluster, [cluster.hosts_for(Role.WORKER)[0].id])
        replacement = new.hosts_for(Role.WORKER)[0]
        assert fake.instances[(provider.vm_of(replacement.id).zone,
                               provider.vm_of(replacement.id).name)].body["labels"][
            "sweep-id"] == sid
    finally:
        provider.release(cluster)
        provider.release(lone)
        if new is not None:
            provider.release(new)
    assert fake.live_instances() == []


# --- provider=local: two real clusters at once, then Ctrl-C ---------------------------------


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_ctrl_c_releases_every_concurrent_local_run(repo_root: Path, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "+experiment=digits_local", "-m",
         "job.seed=1,2", "cluster.workers=1", "job.train_steps=100000",
         "job.eval_frequency=0", "hydra/launcher=parallel", f"hydra.sweep.dir={sweep_dir}"],
        cwd=repo_root, env={**ENV, "PYTHONPATH": str(repo_root)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        # Ctrl-C as at a terminal, even when pytest itself runs in the background of a
        # non-interactive shell (which ignores SIGINT, and children inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    run_dirs = [sweep_dir / "0", sweep_dir / "1"]
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # interrupt while both are training
            if all('"kind": "step"' in _text(d / "events.jsonl") for d in run_dirs):
                break
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.5)
        else:
            pytest.fail("both runs should have been training")
        assert all(live_processes_mentioning(str(d)) for d in run_dirs)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:] + out[-3000:]
    runs = intervals(sweep_dir)
    assert max(s for s, _, _ in runs.values()) < min(e for _, e, _ in runs.values())
    table = rows(sweep_dir)
    assert sorted(r["job.seed"] for r in table) == ["1", "2"]
    assert all(r["status"] == "interrupted" for r in table)
    for run_dir in run_dirs:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["global_steps"] > 0
        events = [json.loads(line) for line in _text(run_dir / "events.jsonl").splitlines()]
        assert events[-1]["kind"] == "teardown"
        provision = next(e for e in events if e["kind"] == "provision")
        assert provision["sweep_id"] == sweep.sweep_id(sweep_dir)
    assert not live_processes_mentioning(str(sweep_dir))
    assert "stopping 2 live run(s)" in out


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_packaging_and_hydra_find_the_plugin_outside_the_checkout(repo_root: Path,
                                                                 tmp_path: Path) -> None:
    """pyproject's package list (read by setuptools' own namespace-package finder, as the
    wheel build does) takes the plugin and no ``hydra_plugins/__init__.py`` (which would hide
    every other Hydra plugin); copied elsewhere, as an installed wheel lays it out, Hydra
    discovers it by scanning the namespace package."""
    import shutil
    import tomllib

    from setuptools import find_namespace_packages

    include = tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    found = find_namespace_packages(where=str(repo_root), include=include)
    assert "hydra_plugins.transient_launcher" in found and "hydra_plugins" not in found
    assert not (repo_root / "hydra_plugins" / "__init__.py").exists()
    site = tmp_path / "site"
    shutil.copytree(repo_root / "hydra_plugins", site / "hydra_plugins",
                    ignore=shutil.ignore_patterns("__pycache__"))
    probe = ("from hydra.core.plugins import Plugins\n"
             "from hydra.core.config_store import ConfigStore\n"
             "from hydra.plugins.launcher import Launcher\n"
             "found = [p for p in Plugins.instance().discover(Launcher)\n"
             "         if p.__name__ == 'ParallelLauncher']\n"
             "import sys; print(sys.modules[found[0].__module__].__file__)\n"
             "print('parallel.yaml' in ConfigStore.instance().list('hydra/launcher'))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, env={**ENV, "PYTHONPATH": str(site)}, check=True).stdout
    assert out.split() == [str(site / "hydra_plugins/transient_launcher/parallel.py"), "True"]
