"""Real multi-process training on digits: 1 PS + 2 workers, the chief and the evaluator.

The ps/worker servers are shared by every test in this module (TF start-up is most of the
cost on a 2-core machine); each test starts its own chief and evaluator against them with
its own run directory. Every process runs in its own process group and is SIGKILLed at
teardown. The last two tests break the shared cluster (a worker, then the PS), so they run
last, in file order.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_harness import (
    HUNG_S,
    LocalCluster,
    hang,
    make_spec,
    reported_between,
    serving_cluster,
    wait_for_closures_settled,
    wait_for_step,
)

from trainer.checkpoints import checkpoint_paths
from trainer.spec import PhaseSpec, StragglerSpec, TrainerSpec

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]
WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with serving_cluster(tmp_path_factory.mktemp("servers"), WORKERS) as local:
        yield local


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


def write_control(path: Path, **fields: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(fields))
    tmp.replace(path)  # atomic, as the orchestrator writes it


def test_asp_reaches_accuracy(cluster: LocalCluster, tmp_path: Path) -> None:
    """Also: per-worker step times, with an injected straggler on worker 1 for a while, and
    the automatic steps per closure (1 while the straggler's 0.15 s steps are measured)."""
    spec, _ = spec_for(cluster, tmp_path / "asp", [PhaseSpec("asp", 800)], eval_frequency=400)
    spec.stragglers = [StragglerSpec(workers=[1], delay_s=0.15, start_step=0, end_step=250)]
    path = spec.to_json(tmp_path / "asp" / "trainer_spec.json")
    chief, evaluator = cluster.train(spec_path=path, timeout=150)
    timings = chief.of_kind("worker_steps")
    assert {t["worker"] for t in timings} == {0, 1}, chief.tail()
    during = {w: [t["step_time_s"] for t in timings if t["worker"] == w and t["step"] < 240]
              for w in (0, 1)}
    after = {w: [t["step_time_s"] for t in timings if t["worker"] == w and t["step"] > 300]
             for w in (0, 1)}
    assert statistics.median(during[1]) > 0.15, during  # the injected delay, on the worker
    assert statistics.median(during[1]) > 3 * statistics.median(during[0]), during
    assert statistics.median(after[1]) < 0.1, after  # the episode ended at step 250
    chosen = chief.of_kind("steps_per_closure")
    assert len(chosen) == 1 and chosen[0]["auto"] and chosen[0]["steps"] >= 1, chosen
    kinds = [e["kind"] for e in chief.events
             if e["kind"] not in ("steps_per_closure", "closure_unrolled")]
    assert kinds[0] == "train_start" and kinds[-1] == "train_end"
    assert chief.of_kind("train_start")[0]["workers"] == WORKERS
    assert {"step", "checkpoint", "phase_start", "phase_end"} <= set(kinds)
    end = chief.of_kind("train_end")[0]
    assert end["step"] == 800  # exact: steps past the budget are dropped on the PS
    steps = chief.of_kind("step")
    assert all(s["loss"] is not None and s["lr"] == pytest.approx(0.02) for s in steps)
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


def test_steps_per_closure_keeps_budgets_and_bsp_exact(cluster: LocalCluster,
                                                        tmp_path: Path) -> None:
    """8 steps per closure for both protocols: the phase boundaries still fall on their
    exact steps (odd targets force a short last closure and a BSP remainder), BSP still
    applies exactly one update per global step from one gradient per worker (its rounds held
    on the PS, trainer/steps.py), and per-worker step times are still reported, with an
    injected straggler during BSP."""
    phases = [PhaseSpec("asp", 203), PhaseSpec("bsp", 263), PhaseSpec("asp", 421)]
    spec, _ = spec_for(cluster, tmp_path / "spc", phases, steps_per_closure=8)
    spec.stragglers = [StragglerSpec(workers=[1], delay_s=0.2, start_step=203, end_step=233)]
    path = spec.to_json(tmp_path / "spc" / "trainer_spec.json")
    chief, evaluator = cluster.train(spec_path=path, timeout=150)
    chosen = chief.of_kind("steps_per_closure")
    assert [(c["steps"], c["auto"]) for c in chosen] == [(8, False)], chosen
    # full ASP closures ran unrolled (traced before training), the short last ones looped
    unrolled = chief.of_kind("closure_unrolled")
    assert [(u["protocol"], u["steps"]) for u in unrolled] == [("asp", 8), ("bsp", 8)], unrolled
    assert unrolled[0]["time"] <= chief.of_kind("train_start")[0]["time"]
    ends = chief.of_kind("phase_end")
    assert [e["step"] for e in ends] == [203, 263, 421], ends  # exact, no overshoot
    done = json.loads((tmp_path / "spc" / "checkpoints" / "DONE").read_text())
    assert done["bsp_updates"] == 60 and done["bsp_gradients"] == WORKERS * 60, done
    # the phase's first step is the switch (one step per closure), then 59 = 7 groups of 8
    # and a group of the last 3 rounds in the looped closure (traced before training too)
    assert done["bsp_groups"] == 8, done
    timings = chief.of_kind("worker_steps")
    assert {t["worker"] for t in timings} == {0, 1} and all(
        0 < t["step_time_s"] < 1 for t in timings), timings
    during = {w: [t["step_time_s"] for t in timings if t["worker"] == w
                  and 210 <= t["step"] <= 233] for w in (0, 1)}
    assert during[1] and statistics.median(during[1]) > 0.15, during  # inside the rounds
    assert not during[0] or statistics.median(during[0]) < statistics.median(during[1])
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
    assert done["step"] == 700 and done["bsp_updates"] == 150
    assert final_eval(evaluator)["accuracy"] >= 0.9


def test_control_override_checkpoint_and_notice(cluster: LocalCluster, tmp_path: Path) -> None:
    """The orchestrator switches BSP -> ASP in place mid-phase and asks for a checkpoint;
    then a preemption notice for the chief's host (chief and evaluator share it)."""
    run_dir = tmp_path / "control"
    spec, path = spec_for(cluster, run_dir, [PhaseSpec("bsp", 200)])
    notice = run_dir / "PREEMPTION_NOTICE"
    env = {"TRANSIENT_PREEMPTION_NOTICE": str(notice)}
    chief = cluster.start("chief", 0, path, env=env)
    evaluator = cluster.start("evaluator", 0, path, env=env)
    wait_for_step(chief, 40)
    write_control(spec.control_path, seq=1, protocol="asp", checkpoint=1)
    chief.wait_event("protocol_switch", timeout=30)
    notice.write_text(json.dumps({"host_id": "local-chief", "deadline": time.time() + 30}))
    cluster.finish(chief, evaluator, timeout=120)

    switch = chief.of_kind("protocol_switch")
    assert len(switch) == 1, chief.tail()
    switch = switch[0]
    assert (switch["from"], switch["to"], switch["reason"]) == ("bsp", "asp", "control")
    assert 0 < switch["switch_s"] < 1.0, switch
    reasons = [c["reason"] for c in chief.of_kind("checkpoint")]
    assert reasons[0] == "control" and "notice" in reasons and reasons[-1] == "final", reasons
    assert chief.of_kind("preemption_notice")[0]["deadline"] > time.time() - 60
    assert evaluator.of_kind("preemption_notice"), evaluator.tail()
    assert len(chief.of_kind("train_start")) == 1  # in place: one coordinator
    # budget: 200 BSP-equivalent steps = s0 BSP steps + 2 * (200 - s0) ASP steps
    done = json.loads((run_dir / "checkpoints" / "DONE").read_text())
    s0 = done["bsp_updates"]
    assert s0 == switch["step"] and 40 <= s0 < 200
    assert done["budget_units"] == 2 * 200
    assert done["step"] == s0 + 2 * (200 - s0)  # exact: ASP steps past it are dropped
    assert final_eval(evaluator)["step"] == done["step"]


def test_resume_continues_from_checkpoint(cluster: LocalCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "resume"
    _, first = spec_for(cluster, run_dir, [PhaseSpec("asp", 200)], checkpoint_frequency=100)
    chief, _ = cluster.train(spec_path=first, evaluator=False, timeout=120)
    reached = chief.of_kind("train_end")[0]["step"]
    assert reached >= 200
    # the final checkpoint is damaged (a host lost mid-write): the next run skips it
    newest, older = checkpoint_paths(run_dir / "checkpoints")[:2]
    assert newest.endswith(f"ckpt-{reached}")
    for shard in (run_dir / "checkpoints").glob(f"ckpt-{reached}.data-*"):
        shard.write_bytes(shard.read_bytes()[:100])
    _, longer = spec_for(cluster, run_dir, [PhaseSpec("asp", 400)], checkpoint_frequency=100)
    chief, _ = cluster.train(spec_path=longer, evaluator=False, timeout=120)
    skipped = chief.of_kind("checkpoint_skipped")
    assert [(s["path"], s["used"]) for s in skipped] == [(newest, older)], chief.tail()
    start = chief.of_kind("train_start")[0]
    assert start["resumed_from"] == older and start["step"] == int(older.rsplit("-", 1)[1])
    assert chief.of_kind("train_end")[0]["step"] >= 400
    assert "resumed from" in chief.tail(200)


def test_hung_worker_is_named_and_the_other_trains_on(cluster: LocalCluster,
                                                      tmp_path: Path) -> None:
    """Worker 1 hangs without dying (SIGSTOP) for longer than the chief's own timeouts
    (the heartbeat's naming, its drains and reports): the chief's heartbeat names it
    (`worker_unresponsive`, trainer/heartbeat.py) within seconds, and worker 0 trains on
    meanwhile, through checkpoints (drains that do not wait for the hung worker's closure,
    and no function or eager op registered with it then: trainer/tfcompat.py). After
    SIGCONT it answers again (`worker_responsive`) and the run ends on its exact budget (the
    steps its closure finishes past it are dropped on the PS)."""
    steps, k = 3000, 2
    _, path = spec_for(cluster, tmp_path / "hang", [PhaseSpec("asp", steps)],
                       steps_per_closure=k, checkpoint_frequency=200)
    chief = cluster.start("chief", 0, path)
    wait_for_step(chief, 60, timeout=180)  # the chief's start-up, on a loaded machine
    victim = next(s for s in cluster.servers if s.name == "worker1")
    silent, stopped, resumed = hang(chief, victim, 1, HUNG_S)
    assert chief.wait(240) == 0, chief.tail()
    # after it was named (by then what was queued before the stop is long done), the
    # global step still advanced, through a checkpoint; a stalled cluster reports nothing
    window = reported_between(chief, silent["time"], resumed)
    print(f"hung worker: named {silent['time'] - stopped:.1f} s after SIGSTOP; "
          f"{resumed - stopped:.1f} s stopped; reported after it was named: {window}")
    assert silent["time"] - stopped < 15, silent  # ~5 s (UNRESPONSIVE_S + a beat)
    steps_seen = [step for _, step in window]
    assert steps_seen and max(steps_seen) - min(steps_seen) >= 12, (window, chief.tail())
    assert ("checkpoint" in dict(window)), (window, chief.tail())
    end = chief.of_kind("train_end")[0]
    back = chief.of_kind("worker_responsive")
    if end["time"] > resumed + 5:  # still training when it resumed (not on a fast machine)
        assert [e["worker"] for e in back] == [1] and back[0]["time"] >= resumed, back
    assert end["step"] == steps, chief.tail()  # the hung closure's late steps: dropped


def test_hung_worker_does_not_hold_the_bsp_barrier(cluster: LocalCluster,
                                                   tmp_path: Path) -> None:
    """BSP: a hung worker blocks the step it holds a gradient for until the heartbeat names
    it (~5 s); then its closure is scheduled again for the survivor and the steps go on for
    as long as it stays hung (longer than the chief's own timeouts), each still one update
    from (at least) one gradient per worker."""
    steps = 800  # room for the trace of the chosen K's closure, 7 to 18 s loaded
    _, path = spec_for(cluster, tmp_path / "bsphang", [PhaseSpec("bsp", steps)])
    chief = cluster.start("chief", 0, path)
    wait_for_step(chief, 30, timeout=180)
    wait_for_closures_settled(chief, "bsp")
    victim = next(s for s in cluster.servers if s.name == "worker1")
    silent, _, resumed = hang(chief, victim, 1, HUNG_S)
    assert chief.wait(180) == 0, chief.tail()
    reported = [step for _, step in reported_between(chief, silent["time"], resumed, ("step",))]
    print(f"hung BSP worker: steps reported after it was named: {reported}")
    assert len(reported) >= 2 and reported[-1] - reported[0] >= 5, (reported, chief.tail())
    done = json.loads((tmp_path / "bsphang" / "checkpoints" / "DONE").read_text())
    assert done["step"] == steps and done["bsp_updates"] == steps
    assert WORKERS * steps <= done["bsp_gradients"] <= WORKERS * steps + 2, done


def test_bsp_survives_a_killed_worker(cluster: LocalCluster, tmp_path: Path) -> None:
    """Runs last: it SIGKILLs worker 1 of the shared cluster during BSP groups of 8 steps
    per closure. The group in flight ends (its partial round dropped, the steps it applied
    kept), BSP goes on one step per closure (the coordinator reruns the lost closure on the
    survivor, so every step still averages W gradients, one more if a closure ran twice),
    and groups resume once the worker is back; the budget is exact."""
    _, path = spec_for(cluster, tmp_path / "kill", [PhaseSpec("bsp", 500)],
                       steps_per_closure=8)
    chief = cluster.start("chief", 0, path)
    wait_for_step(chief, 100, timeout=240)  # generous: a loaded CI host starts TF slowly
    victim = next(s for s in cluster.servers if s.name == "worker1")
    victim.kill()
    chief.wait_event("worker_failure", timeout=20)
    cluster.servers.append(cluster.start("worker", 1))  # same address, new process: rejoins
    assert chief.wait(300) == 0, chief.tail()
    failures = chief.of_kind("worker_failure")
    assert failures and failures[0]["worker"] == 1, chief.tail()
    assert [e["worker"] for e in chief.of_kind("worker_rejoined")] == [1], chief.tail()
    done = json.loads((tmp_path / "kill" / "checkpoints" / "DONE").read_text())
    assert done["step"] == 500 and done["bsp_updates"] == 500
    assert WORKERS * 500 <= done["bsp_gradients"] <= WORKERS * 500 + 3
    assert done["bsp_groups"] > 0, done


def test_ps_loss_exits_3_and_a_new_cluster_resumes(cluster: LocalCluster,
                                                     tmp_path: Path) -> None:
    """Runs last: it SIGKILLs the shared PS. The chief must report `ps_unavailable` and exit
    3 promptly; a whole new cluster (new ps/worker processes at new addresses, fresh BSP
    accumulators) then resumes from the latest checkpoint and completes."""
    run_dir = tmp_path / "psloss"
    _, path = spec_for(cluster, run_dir, [PhaseSpec("bsp", 30), PhaseSpec("asp", 700)],
                       checkpoint_frequency=100)
    chief = cluster.start("chief", 0, path)
    wait_for_step(chief, 250)
    cluster.servers[0].kill()  # the PS
    killed = time.time()
    assert chief.wait(30) == 3, chief.tail()
    detected = chief.of_kind("failure")[-1]
    assert detected["error_kind"] == "ps_unavailable", detected
    assert detected["time"] - killed < 15, detected
    saved = [c["step"] for c in chief.of_kind("checkpoint")]
    assert saved and saved[-1] >= 200, saved

    new_spec = make_spec(run_dir, WORKERS, [PhaseSpec("bsp", 30), PhaseSpec("asp", 700)],
                         checkpoint_frequency=100)
    assert new_spec.cluster != cluster.spec.cluster
    replacement = LocalCluster(new_spec, run_dir / "trainer_spec.json")
    try:
        for server in replacement.servers:
            server.wait_event("ready", timeout=90)
        restarted = time.time()
        chief, _ = replacement.train(evaluator=False, timeout=120)
        start = chief.of_kind("train_start")[0]
        assert start["step"] == saved[-1], start
        assert start["resumed_from"].endswith(f"ckpt-{saved[-1]}")
        first_step = chief.of_kind("step")[0]
        print(f"ps loss: detected in {detected['time'] - killed:.1f} s; resumed training "
              f"{first_step['time'] - restarted:.1f} s after the new chief started")
        assert chief.of_kind("phase_start")[0]["protocol"] == "asp"  # bsp was done before
        assert chief.of_kind("train_end")[0]["step"] >= 700
    finally:
        replacement.stop()
