"""Planning: hosts, prices and phase targets from the real committed configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.plan import BackendTraits, make_plan
from orchestrator.runtime.run import build_trainer_spec
from orchestrator.simulate.models import SimModels
from orchestrator.validate import compose_experiment
from provisioning.base import Cluster, Host
from provisioning.catalog import Market
from trainer.spec import JobSpec, LrSchedule, Optimizer


def test_icac19_plan_matches_the_papers_prices() -> None:
    plan = make_plan(compose_experiment("icac19_k80"))
    roles = [h.role for h in plan.hosts]
    assert roles.count("ps") == 1 and roles.count("worker") == 4
    workers = [h for h in plan.hosts if h.role == "worker"]
    assert all(h.gpu == "k80" and h.zone == "us-west1-b" and h.transient for h in workers)
    # ICAC'19: 4 transient K80 at $0.2556/h + the on-demand PS at $0.1429/h
    assert plan.hourly_usd == pytest.approx(4 * 0.2556 + 0.1429)
    assert plan.phases[-1].end_step == 64000
    # the estimate is the speed model's (the one model the band and the planner use): CM-DARE's
    # measured K80 step time, ASP efficiency, a checkpoint pause every 4,000 steps
    models = SimModels.load()
    step = models.step_time_s("resnet_cifar_32", "k80", 128)
    rate = models.asp_rate([(step, "k80")] * 4, "resnet_cifar_32", 1)
    train = 64000 / rate + 16 * models.checkpoint_s("resnet_cifar_32")
    assert plan.est_train_time_s == pytest.approx(train)
    assert plan.est_steps_per_sec == pytest.approx(64000 / train)
    assert plan.speed_error["k80"]["basis"] == "measured" and plan.extrapolated_gpus == []


def test_headline_plan_is_spot_t4_at_gce_list_prices() -> None:
    plan = make_plan(compose_experiment("cifar10_res32"))
    workers = [h for h in plan.hosts if h.role == "worker"]
    assert len(workers) == 4
    assert all(h.gpu == "t4" and h.zone == "us-west1-b" and h.transient for h in workers)
    # conf/pricing/gce.yaml, us-west1: Spot n1-standard-4 + Spot T4 per worker, on-demand PS
    assert plan.hourly_usd == pytest.approx(4 * (0.04815 + 0.14) + 0.19)
    # no paper measured a T4: the estimate exists, marked as the speed model's extrapolation
    assert plan.est_train_time_s is not None and plan.extrapolated_gpus == ["t4"]
    measured = SimModels.load().step_time_error("resnet_cifar_32", "k80")["sigma_log"]
    assert plan.speed_error["t4"]["sigma_log"] > measured


def test_workers_shorthand_resizes_the_cluster() -> None:
    plan = make_plan(compose_experiment("icac19_k80", ["cluster.workers=8"]))
    assert plan.workers == 8
    assert plan.hourly_usd == pytest.approx(8 * 0.2556 + 0.1429)


def test_heterogeneous_cluster_spans_zones_and_gpus() -> None:
    plan = make_plan(compose_experiment("mixed_gpu_cifar10"))
    workers = [(h.gpu, h.zone) for h in plan.hosts if h.role == "worker"]
    assert sorted(g for g, _ in workers) == ["k80", "k80", "p100", "v100"]
    assert len({z for _, z in workers}) == 3


def test_switch_schedule_turns_budget_into_global_step_targets() -> None:
    cfg = compose_experiment("cifar10_res32", [
        "cluster.workers=8", "job.train_steps=8000",
        "sync.phases=[{protocol: bsp, fraction: 0.05}, {protocol: asp, fraction: 0.95}]"])
    plan = make_plan(cfg)
    # Sync-Switch: b5-a95 with N=8, B=8000 -> BSP to 400, then ASP to 400 + 7600*8
    assert [p.end_step for p in plan.phases] == [400, 400 + 7600 * 8]
    assert [p.protocol for p in plan.phases] == ["bsp", "asp"]


def test_the_roles_read_the_composed_job_with_the_plans_step_target() -> None:
    """``job`` composes into the trainer's own JobSpec: the launch spec carries it as composed,
    but for ``train_steps`` (the plan's global-step target), its choices as plain names."""
    cfg = compose_experiment("cifar10_res32", [
        "cluster.workers=8", "job.train_steps=8000", "job.optimizer=adam", "job.seed=7",
        "sync.phases=[{protocol: bsp, fraction: 0.05}, {protocol: asp, fraction: 0.95}]"])
    assert isinstance(cfg.job, JobSpec)
    assert (cfg.job.optimizer, cfg.job.lr_schedule) == (Optimizer.adam, LrSchedule.step)
    plan = make_plan(cfg)
    cluster = Cluster("r", [Host(f"h{i}", spec, f"10.0.0.{i}", 2222, Path("/w"))
                            for i, spec in enumerate(plan.host_specs())])
    job = json.loads(json.dumps(build_trainer_spec(cfg, plan, cluster, "r").to_dict()))["job"]
    assert job["train_steps"] == 400 + 7600 * 8 and cfg.job.train_steps == 8000
    assert (job["optimizer"], job["lr_schedule"], job["lr_decay_steps"]) == (
        "adam", "step", [32000, 48000])
    assert (job["batch_size"], job["seed"], job["hparam_set"]) == (128, 7, "resnet_cifar_32")


def test_transient_parameter_server_is_shown_as_a_risk() -> None:
    plan = make_plan(compose_experiment("digits_local", ["cluster.ps_transient=true"]))
    assert any("parameter servers are transient" in r for r in plan.risks)


def test_local_default_has_no_speed_estimate_but_a_price() -> None:
    plan = make_plan(compose_experiment("digits_local"))
    assert plan.est_steps_per_sec is None and plan.est_cost_usd is None
    assert plan.hourly_usd > 0


def test_colocated_chief_and_evaluator_share_the_first_ps_machine_priced_once() -> None:
    plan = make_plan(compose_experiment("cifar10_res32"))
    ps = next(h for h in plan.hosts if h.name == "ps-0")
    for name in ("chief-0", "evaluator-0"):
        host = next(h for h in plan.hosts if h.name == name)
        assert (host.colocate_with, host.machine_type, host.zone, host.hourly_usd) == (
            "ps-0", ps.machine_type, ps.zone, 0.0)
    apart = make_plan(compose_experiment("cifar10_res32", ["cluster.chief_on_ps=false"]))
    chief = next(h for h in apart.hosts if h.name == "chief-0")
    assert chief.colocate_with is None and chief.hourly_usd > 0
    assert apart.hourly_usd > plan.hourly_usd


def test_a_lone_transient_worker_under_shrink_is_a_risk() -> None:
    risky = make_plan(compose_experiment("cifar10_res32", ["cluster.workers=1"]))
    assert any("lone transient worker" in r for r in risky.risks)
    for safe in (["cluster.workers=1", "cluster.recovery.on_revocation=replace"],
                 ["cluster.workers=2"], ["cluster.workers=1",
                                         "cluster.worker_groups.0.transient=false"]):
        assert not any("lone" in r for r in make_plan(compose_experiment("cifar10_res32",
                                                                          safe)).risks)


def test_plan_carries_its_backend_traits_and_plan_json_records_them() -> None:
    """make_plan looks the backend up once and plan.json records what it found."""
    local = make_plan(compose_experiment("digits_local"))
    assert local.backend == BackendTraits("local", simulated=False, hosts_here=True, billed=False,
                                          transient_market=None)
    sim = make_plan(compose_experiment("icac19_k80", ["provider=sim"]))
    assert sim.backend.simulated and not sim.backend.hosts_here
    assert sim.backend.transient_market == Market.preemptible  # the 2019 catalog's market
    record = json.loads(json.dumps(sim.to_dict()))  # as plan.json holds it
    assert record["backend"] == {"name": "sim", "simulated": True, "hosts_here": False,
                                 "billed": False, "transient_market": "preemptible"}
