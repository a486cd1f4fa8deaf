"""Real multi-process training on digits: 1 PS + 2 workers, the chief and the evaluator.

The ps/worker servers are shared by every test in this module (TF start-up is most of the
cost on a 2-core machine); each test starts its own chief and evaluator against them with
its own run directory. Every process runs in its own process group and is SIGKILLed at
teardown.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_harness import LocalCluster, make_spec

from trainer.spec import PhaseSpec, TrainerSpec

pytestmark = pytest.mark.slow
WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("servers")
    spec = make_spec(root, WORKERS, [PhaseSpec("asp", 10)])
    local = LocalCluster(spec, root / "trainer_spec.json")
    try:
        for server in local.servers:
            server.wait_event("ready", timeout=90)
        yield local
    finally:
        local.stop()


def spec_for(cluster: LocalCluster, run_dir: Path, phases: list[PhaseSpec],
             **job: object) -> tuple[TrainerSpec, Path]:
    """A spec for one run on the shared servers (same cluster, own run_dir and job)."""
    spec = make_spec(run_dir, WORKERS, phases, **job)
    spec.cluster = cluster.spec.cluster
    return spec, spec.to_json(run_dir / "trainer_spec.json")


def final_eval(evaluator) -> dict:
    finals = [e for e in evaluator.of_kind("eval") if e["final"]]
    assert len(finals) == 1, evaluator.tail()
    return finals[0]


def test_asp_reaches_accuracy(cluster: LocalCluster, tmp_path: Path) -> None:
    _, path = spec_for(cluster, tmp_path / "asp", [PhaseSpec("asp", 800)],
                          eval_frequency=400)
    chief, evaluator = cluster.train(spec_path=path, timeout=150)
    kinds = [e["kind"] for e in chief.events]
    assert kinds[0] == "train_start" and kinds[-1] == "train_end"
    assert chief.of_kind("train_start")[0]["workers"] == WORKERS
    assert {"step", "checkpoint", "phase_start", "phase_end"} <= set(kinds)
    end = chief.of_kind("train_end")[0]
    assert end["step"] >= 800  # at-least-once: a re-run closure may add a step
    steps = chief.of_kind("step")
    assert all(s["loss"] is not None and s["lr"] == pytest.approx(0.05) for s in steps)
    assert final_eval(evaluator)["accuracy"] >= 0.9
    assert [e["step"] for e in evaluator.of_kind("eval")][-1] == end["step"]
    assert (tmp_path / "asp" / "checkpoints" / "DONE").exists()
    assert list((tmp_path / "asp" / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert list((tmp_path / "asp" / "tensorboard" / "eval").glob("events.out.tfevents.*"))


def test_bsp_aggregates_one_gradient_per_worker(cluster: LocalCluster, tmp_path: Path) -> None:
    _, path = spec_for(cluster, tmp_path / "bsp", [PhaseSpec("bsp", 400)])
    _, evaluator = cluster.train(spec_path=path, timeout=150)
    done = json.loads((tmp_path / "bsp" / "checkpoints" / "DONE").read_text())
    assert done["step"] == 400 and done["bsp_updates"] == 400
    assert done["bsp_gradients"] == WORKERS * done["bsp_updates"]  # exactly W per step
    assert final_eval(evaluator)["accuracy"] >= 0.9


def test_phase_switch_is_in_place(cluster: LocalCluster, tmp_path: Path) -> None:
    phases = [PhaseSpec("bsp", 150), PhaseSpec("asp", 700, {"learning_rate": 0.03})]
    _, path = spec_for(cluster, tmp_path / "switch", phases)
    chief, evaluator = cluster.train(spec_path=path, timeout=150)
    starts, ends = chief.of_kind("phase_start"), chief.of_kind("phase_end")
    assert [s["protocol"] for s in starts] == ["bsp", "asp"]
    assert [e["protocol"] for e in ends] == ["bsp", "asp"]
    assert ends[0]["step"] == 150 and starts[1]["step"] == 150
    assert 0 < ends[0]["switch_s"] < 1.0, ends[0]
    assert len(chief.of_kind("train_start")) == 1  # one coordinator for both phases
    asp_steps = [s for s in chief.of_kind("step") if s["step"] > 160]
    assert asp_steps and all(s["lr"] == pytest.approx(0.03) for s in asp_steps)
    done = json.loads((tmp_path / "switch" / "checkpoints" / "DONE").read_text())
    assert done["step"] >= 700 and done["bsp_updates"] == 150
    assert final_eval(evaluator)["accuracy"] >= 0.9


def test_resume_continues_from_checkpoint(cluster: LocalCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "resume"
    _, first = spec_for(cluster, run_dir, [PhaseSpec("asp", 200)], checkpoint_frequency=100)
    chief, _ = cluster.train(spec_path=first, evaluator=False, timeout=120)
    reached = chief.of_kind("train_end")[0]["step"]
    assert reached >= 200
    _, longer = spec_for(cluster, run_dir, [PhaseSpec("asp", 400)], checkpoint_frequency=100)
    chief, _ = cluster.train(spec_path=longer, evaluator=False, timeout=120)
    assert chief.of_kind("train_start")[0]["step"] == reached
    assert chief.of_kind("train_end")[0]["step"] >= 400
    assert "resumed from" in chief.tail(200)


def test_bsp_survives_a_killed_worker(cluster: LocalCluster, tmp_path: Path) -> None:
    """Runs last: it SIGKILLs worker 1 of the shared cluster. The barrier must not stall:
    the coordinator reruns the lost closure on the survivor, so every step still averages
    W gradients (one more if a closure ran twice: at-least-once)."""
    _, path = spec_for(cluster, tmp_path / "kill", [PhaseSpec("bsp", 500)])
    chief = cluster.start("chief", 0, path)
    deadline = time.time() + 90
    while not any(e["step"] >= 100 for e in chief.of_kind("step")):
        assert time.time() < deadline and chief.proc.poll() is None, chief.tail()
        time.sleep(0.2)
    victim = next(s for s in cluster.servers if s.name == "worker1")
    victim.kill()
    assert chief.wait(120) == 0, chief.tail()
    failures = chief.of_kind("worker_failure")
    assert failures and failures[0]["worker"] == 1, chief.tail()
    done = json.loads((tmp_path / "kill" / "checkpoints" / "DONE").read_text())
    assert done["step"] == 500 and done["bsp_updates"] == 500
    assert WORKERS * 500 <= done["bsp_gradients"] <= WORKERS * 500 + 3
