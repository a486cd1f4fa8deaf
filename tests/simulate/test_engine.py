"""The simulation engine: determinism, BSP vs ASP, PS saturation, recovery decisions, lifetimes.

Figures asserted here are derived from the exported parameters (``SimModels``), never typed in,
so a re-fit of the models does not break the tests, but a change of the engine's logic does.
"""

from __future__ import annotations

import random

import pytest

from orchestrator.config.schema import ExperimentConfig
from orchestrator.plan import BackendTraits, make_plan
from orchestrator.simulate.cloud import CloudLifetimes, cloud_market
from orchestrator.simulate.engine import Simulation, simulate
from orchestrator.simulate.models import NoModelError, SimModels
from orchestrator.simulate.validate import compose
from provisioning.catalog import PREEMPTIBLE_CAP_H, Market

BASE = ["+experiment=icac19_k80", "provider=sim", "sim.speed_error=false"]  # the point model
MODELS = SimModels.load()


def run(*overrides: str, seed: int = 0) -> Simulation:
    cfg = compose([*BASE, *overrides])
    sim = Simulation(cfg, make_plan(cfg), seed, MODELS)
    sim.run()
    return sim


def kinds(sim: Simulation) -> list[str]:
    return [e["kind"] for e in sim.events]


def test_same_seed_same_run_and_seeds_differ_under_revocations() -> None:
    a = run("cluster.workers=8", "sim.lifetimes=cmdare", seed=3)
    b = run("cluster.workers=8", "sim.lifetimes=cmdare", seed=3)
    assert a.events == b.events and a.result().summary == b.result().summary
    outcomes = {(s.result().summary["revocations"], s.result().summary["wall_time_s"])
                for s in (run("cluster.workers=8", seed=k) for k in range(12))}
    assert len(outcomes) > 1  # start-up and lifetimes are drawn per seed


def test_bsp_waits_for_slowest_plus_sync_and_asp_is_faster() -> None:
    steps = 2000
    common = ("cluster.workers=8", "cluster.worker_groups.0.transient=false",
              f"job.train_steps={steps}", "job.checkpoint_frequency=0", "job.eval_frequency=0")
    bsp = run(*common, "sync=bsp").result().summary
    asp = run(*common, "sync=asp").result().summary
    step_s = MODELS.step_time_s("resnet_cifar_32", "k80", 128)
    ckpt = MODELS.checkpoint_s("resnet_cifar_32")  # the final checkpoint
    assert bsp["train_time_s"] == pytest.approx(steps * MODELS.bsp_step_s([step_s] * 8) + ckpt,
                                                abs=2e-3)  # summaries round to ms
    asp_rate = MODELS.asp_rate([(step_s, "k80")] * 8, "resnet_cifar_32", 1)
    assert asp["train_time_s"] == pytest.approx(steps / asp_rate + ckpt, abs=2e-3)
    assert bsp["train_time_s"] > 5 * asp["train_time_s"]


def test_asp_throughput_is_capped_by_the_parameter_server() -> None:
    common = ("cluster.worker_groups.0.gpu=p100", "cluster.worker_groups.0.zone=null",
              "cluster.worker_groups.0.transient=false", "job.checkpoint_frequency=0",
              "job.eval_frequency=0", "job.train_steps=20000")
    cap = MODELS.ps_capacity("resnet_cifar_32", 1)
    sixteen = run("cluster.workers=16", *common).result().summary
    two_ps = run("cluster.workers=16", "cluster.parameter_servers=2", *common).result().summary
    assert sixteen["steps_per_sec"] < cap * 1.001  # saturated at one PS's capacity
    assert two_ps["steps_per_sec"] > 1.5 * sixteen["steps_per_sec"]  # a second PS lifts it


def test_replace_policy_requests_a_replacement_that_joins() -> None:
    sim = run("cluster.workers=4", "revocation=schedule", "revocation.notice_s=30",
              "+revocation.events=[{target: worker-1, at_s: 300}]",
              "cluster.recovery.on_revocation=replace")
    s = sim.result().summary
    assert s["status"] == "completed"
    assert (s["revocations"], s["replacements"], s["recoveries"], s["restarts"]) == (1, 1, 1, 0)
    k = kinds(sim)
    order = [k.index(x) for x in ("revocation_notice", "revocation", "recovery_start",
                                  "replacement_requested", "replacement_ready", "recovery_end")]
    assert order == sorted(order)
    # the chief checkpoints only on its own host's notice (trainer/loop.py), not a worker's
    assert "checkpoint" not in k[k.index("revocation_notice"):k.index("revocation")]
    ready = next(e for e in sim.events if e["kind"] == "replacement_ready")
    requested = next(e for e in sim.events if e["kind"] == "replacement_requested")
    assert ready["t"] - requested["t"] == pytest.approx(requested["delay_s"], abs=1e-3)


def test_shrink_continues_with_fewer_workers_and_is_slower() -> None:
    common = ("cluster.workers=4", "cluster.worker_groups.0.transient=false",
              "job.train_steps=20000")
    base = run(*common).result().summary
    shrunk = run(*common, "cluster.worker_groups.0.transient=true", "revocation=schedule",
                 "+revocation.events=[{target: worker-0, at_s: 60}]").result().summary
    assert (shrunk["revocations"], shrunk["replacements"], shrunk["recoveries"]) == (1, 0, 1)
    assert shrunk["train_time_s"] > base["train_time_s"] * 1.2


def test_ps_loss_restarts_from_checkpoint_and_loses_the_steps_since() -> None:
    sim = run("cluster.workers=4", "revocation=schedule", "revocation.include_ps=true",
              "+revocation.events=[{target: ps-0, at_step: 10000}]")
    s = sim.result().summary
    assert s["status"] == "completed" and s["restarts"] == 1
    assert s["lost_steps"] == 10000 - 8000  # checkpoints every 4,000 steps, no notice
    noticed = run("cluster.workers=4", "revocation=schedule", "revocation.include_ps=true",
                  "revocation.notice_s=30",
                  "+revocation.events=[{target: ps-0, at_step: 10000}]").result().summary
    # the chief (on ps-0's VM) saved on the notice: only the steps of the notice's remainder
    assert 0 < noticed["lost_steps"] < 10000 - 8000
    restart = next(e for e in sim.events if e["kind"] == "recovery_start")
    assert restart["resume_step"] == 8000 and restart["action"] == "restart"
    failed = run("cluster.workers=4", "revocation=schedule", "revocation.include_ps=true",
                 "cluster.recovery.max_restarts=0",
                 "+revocation.events=[{target: ps-0, at_step: 10000}]").result().summary
    assert failed["status"] == "failed" and "max_restarts=0" in failed["error"]


def test_straggler_policy_switches_to_asp_in_place() -> None:
    common = ("cluster.workers=4", "cluster.worker_groups.0.transient=false", "sync=bsp",
              "job.train_steps=3000", "straggler=one_worker")
    plain = run(*common).result().summary
    switched = run(*common, "sync.policy.policy=straggler_switch")
    s = switched.result().summary
    assert s["stragglers_injected"] >= 1 and s["stragglers"] >= 1
    assert "protocol_switch" in kinds(switched) and "policy_decision" in kinds(switched)
    assert s["train_time_s"] < plain["train_time_s"]


def test_preemptible_lifetimes_are_capped_at_24h_spot_are_not() -> None:
    cfg = compose(BASE)
    host = make_plan(cfg).hosts[1]
    lifetimes = MODELS.lifetime_models("cmdare")
    pre = CloudLifetimes(cfg.revocation, lifetimes, Market.preemptible, None, PREEMPTIBLE_CAP_H)
    spot = CloudLifetimes(cfg.revocation, lifetimes, Market.spot, None, None)
    spot_6h = CloudLifetimes(cfg.revocation, lifetimes, Market.spot, None, 6.0)
    rng = random.Random(0)
    drawn_pre = [pre.sample_lifetime_h(host, rng) for _ in range(2000)]
    drawn_spot = [spot.sample_lifetime_h(host, rng) for _ in range(2000)]
    drawn_6h = [spot_6h.sample_lifetime_h(host, rng) for _ in range(2000)]
    assert all(x is not None and x <= 24 for x in drawn_pre)
    assert drawn_pre.count(24.0) > 0  # outlived the measurements: GCE stops it at 24 h
    assert all(x is not None for x in drawn_spot) and max(drawn_spot) > 24
    assert max(drawn_6h) == 6.0  # a Spot VM's max run duration ends it


def test_market_follows_the_cloud_not_a_setting() -> None:
    """provider=sim simulates the priced cloud's market; a real backend its own VMs' market;
    local processes no cloud market at all."""
    def market(cfg: ExperimentConfig) -> tuple[Market | None, float | None]:
        return cloud_market(cfg, BackendTraits.of(cfg.provider.name, cfg.pricing))

    assert market(compose(BASE)) == (Market.preemptible, PREEMPTIBLE_CAP_H)  # 2019
    today = compose(["+experiment=cifar10_res32", "provider=sim"])
    assert market(today) == (Market.spot, None)
    gce = compose(["+experiment=cifar10_res32", "provider.max_run_duration_s=7200"])
    assert market(gce) == (Market.spot, 2.0)
    assert market(compose(["+experiment=digits_local"])) == (None, None)


@pytest.mark.parametrize(("overrides", "line"), [
    (["+experiment=cifar10_res32", "pricing=papers_2019", "cluster.worker_groups.0.gpu=v100"],
     "config error: pricing.transient_market: provider=gce creates spot VMs, but pricing "
     "'papers_2019' sells preemptible ones"),
    ([*BASE, "sim.market=spot"],
     "config error: sim.market: no longer a setting (the simulated market follows "
     "pricing.transient_market"),
])
def test_the_market_is_not_chosen_apart_from_the_cloud(overrides: list[str], line: str) -> None:
    from orchestrator.config.errors import ConfigError
    from orchestrator.validate import compose_experiment

    name = overrides[0].split("=", 1)[1]
    with pytest.raises(ConfigError) as err:
        compose_experiment(name, overrides[1:])
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_accuracy_only_where_a_paper_measured_the_setup() -> None:
    eight = simulate(compose([*BASE, "cluster.workers=8"]), make_plan(compose(
        [*BASE, "cluster.workers=8"]))).summary
    sixteen_cfg = compose([*BASE, "cluster.workers=16"])
    sixteen = simulate(sixteen_cfg, make_plan(sixteen_cfg)).summary
    assert eight["final_accuracy"] is not None and "ICAC'19" in eight["accuracy_source"]
    assert sixteen["final_accuracy"] is None and sixteen["accuracy_source"] is None


def test_cpu_workers_have_no_model() -> None:
    cfg = compose(["provider=sim"])  # digits on CPU workers
    with pytest.raises(NoModelError, match="no speed model"):
        simulate(cfg, make_plan(cfg))


def test_every_seed_terminates() -> None:
    """Regression: a revocation due at a float-rounded time once spun the revoker forever
    (seed 110 of 8 workers); 200 seeds must all finish."""
    cfg = compose([*BASE, "cluster.workers=8"])
    plan = make_plan(cfg)
    revoked = [Simulation(cfg, plan, seed, MODELS).run().summary["revocations"]
               for seed in range(200)]
    assert len(revoked) == 200 and max(revoked) >= 1
