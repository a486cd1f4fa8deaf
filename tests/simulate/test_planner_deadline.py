"""The planner with a deadline (issue 25): the ranking, a lone transient worker, the share of runs
a band covers, the speed model's error, the extrapolation mark and its removal by calibration,
and the reliability of the printed P(deadline).

Small search spaces (one zone, two worker counts) keep these fast; every simulation is seeded,
so each figure asserted is the same on every run of the test.
"""

from __future__ import annotations

import io
import math
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.display import render_plan
from orchestrator.plan import make_plan
from orchestrator.simulate import calibrate, planner, reliability
from orchestrator.simulate.band import draws, predict_band, simulate_many, summarize_runs
from orchestrator.simulate.cloud import cloud_market
from orchestrator.simulate.engine import Simulation
from orchestrator.simulate.models import SimModels
from orchestrator.simulate.planner import evaluate, parse_args, rank
from orchestrator.simulate.planner_candidates import configure
from orchestrator.simulate.planner_misses import nearest_misses
from orchestrator.simulate.planner_report import header, print_table
from orchestrator.simulate.reliability import FRESH_SEED_OFFSET
from orchestrator.simulate.validate import compose

HEADLINE = ["+experiment=cifar10_res32", "planner.zones=first", "planner.workers=[1,4]",
            "planner.repeats=40", "planner.max_repeats=80"]


def binomial_bound(p: float, n1: int, n2: int, sigmas: float = 5.0) -> float:
    """``sigmas`` standard deviations of the difference of two independent shares of ``n1``
    and ``n2`` runs with probability ``p``: the bound the test asserts (5σ cannot flake)."""
    return sigmas * math.sqrt(max(p * (1 - p), 1e-4) * (1 / n1 + 1 / n2))


@pytest.fixture(autouse=True)
def empty_calibration_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No calibration of this machine or of a GPU unless a test records one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def question(*extra: str) -> object:
    return compose(parse_args([*HEADLINE, *extra]))


def test_with_a_deadline_what_is_unlikely_to_meet_it_is_dropped_and_said() -> None:
    cfg = question("deadline_h=0.75", "planner.gpus=[t4,l4]")
    rows = evaluate(cfg)
    ranked = rank(rows, cfg)
    assert cfg.planner.min_p_deadline == 0.9  # the default minimum, with any deadline
    assert ranked and all(r["p_deadline"] >= 0.9 for r in ranked)
    dropped = [r for r in rows if r not in ranked]
    assert dropped and all(r["p_deadline"] < 0.9 for r in dropped)
    assert "deadline 0.75 h with P ≥ 90%" in header(cfg, len(ranked), len(rows))
    # the runs behind the rows shown, not the settings' range
    shown = header(cfg, len(ranked), len(rows), [r["runs"] for r in ranked])
    low, high = min(r["runs"] for r in ranked), max(r["runs"] for r in ranked)
    assert (f"({low:,} simulated runs per row," if low == high
            else f"({low:,}–{high:,} simulated runs per row,") in shown, shown
    # objective=deadline ranks by the probability itself
    by_p = rank(rows, question("deadline_h=0.75", "planner.gpus=[t4,l4]", "objective=deadline"))
    assert [r["p_deadline"] for r in by_p] == sorted((r["p_deadline"] for r in by_p),
                                                     reverse=True)


def test_a_lone_transient_worker_is_planned_with_replace_and_shown_so() -> None:
    cfg = question("deadline_h=4", "planner.gpus=[t4]")
    assert str(cfg.cluster.recovery.on_revocation) == "shrink"
    rows = {(r["workers"], r["transient"]): r for r in evaluate(cfg)}
    lone = rows[1, True]
    assert lone["recovery"] == "replace" and lone["recovery_changed"]
    assert lone["p_complete"] == 1.0  # replace survives every revocation (with capacity)
    # shrink keeps its meaning where it survives: more workers, or an on-demand one
    assert rows[4, True]["recovery"] == "shrink" and rows[1, False]["recovery"] == "shrink"
    # the same cluster under shrink fails whenever its worker is revoked: what was hidden
    c = lone["candidate"]
    shrink = configure(cfg, c)
    shrink.cluster.recovery.on_revocation = cfg.cluster.recovery.on_revocation
    failed = summarize_runs(simulate_many(shrink, make_plan(shrink), 40), 4 * 3600)
    assert failed["p_complete"] < 1.0 and failed["time_to_result_s"]["p90"] is None
    console = Console(record=True, width=250)
    print_table(rank(list(rows.values()), cfg), cfg, len(rows), console)
    text = console.export_text()
    assert "replace *" in text and "would end a lone transient worker's run" in text


def test_a_band_of_no_width_says_the_parameter_server_holds_it() -> None:
    """Four on-demand A100s (×/÷1.45 each) all finish in 0.46 h: not certainty about the A100,
    but one PS's capacity, which no run perturbs; the table says so. One T4's band is wide."""
    cfg = question("deadline_h=2", "planner.gpus=[a100,t4]", "planner.transient=[false]",
                   "planner.parameter_servers=[1]")
    rows = {(r["gpu"], r["workers"]): r for r in evaluate(cfg)}
    capped, alone = rows["a100", 4], rows["t4", 1]
    assert capped["time_to_result_s"]["p90"] <= 1.02 * capped["time_to_result_s"]["p10"]
    assert alone["time_to_result_s"]["p90"] > 1.2 * alone["time_to_result_s"]["p10"]
    console = Console(record=True, width=250)
    print_table([capped, alone], cfg, 2, console)
    text = console.export_text()
    assert "time bands of almost no width (4× a100 on-demand)" in text
    assert "(44 steps/s for this job" in text
    console = Console(record=True, width=250)
    print_table([alone], cfg, 1, console)
    assert "almost no width" not in console.export_text()


def test_bands_say_what_share_of_runs_they_cover() -> None:
    def run(status: str, wall: float, cost: float) -> dict:
        return {"status": status, "wall_time_s": wall, "train_time_s": wall - 100,
                "cost_usd": cost, "revocations": 0 if status == "completed" else 1,
                "final_accuracy": None}

    runs = [run("completed", 1000 + 10 * i, 1.0) for i in range(6)]
    runs += [run("failed", 300, 0.3) for _ in range(4)]  # revoked early, paid, no result
    band = summarize_runs(runs, deadline_s=1030)
    assert band["p_complete"] == 0.6 and band["band_share"] == 0.6
    assert band["time_to_result_s"]["p10"] == 1009.0 and band["time_to_result_s"]["p90"] is None
    assert band["wall_time_s"]["p90"] < 1060  # over the completed runs only, and says so
    assert band["cost_usd"]["p10"] == 0.3  # what a run costs, the failed ones included
    assert band["p_deadline"] == 0.4  # 4 of 10 finished by 1030 s


def test_each_run_draws_the_speed_models_error_wider_for_an_extrapolated_gpu() -> None:
    models = SimModels.load()

    def factors(gpu: str, n: int = 300) -> list[float]:
        cfg = compose(["+experiment=cifar10_res32", "provider=sim", "cluster.workers=2",
                       f"cluster.worker_groups.0.gpu={gpu}", "cluster.worker_groups.0.zone=null",
                       "cluster.ps_zone=null", "pricing=papers_2019"])
        plan = make_plan(cfg)
        return [Simulation(cfg, plan, seed, models).speed_factor[gpu] for seed in range(n)]

    for gpu in ("k80", "v100"):
        logs = [math.log(f) for f in factors(gpu)]
        sigma = models.step_time_error("resnet_cifar_32", gpu)["sigma_log"]
        assert statistics.pstdev(logs) == pytest.approx(sigma, rel=0.15)  # 300 seeded draws
        assert abs(statistics.fmean(logs)) < 4 * sigma / math.sqrt(len(logs))  # median 1
    # quasi-random: any 200 consecutive seeds hold the 3 % tail 6 times (±1), as the planner's
    # P(deadline) needs when it hinges on the model being several times off
    sigma = models.step_time_error("resnet_cifar_32", "l4")["sigma_log"]
    tail = math.exp(sigma * statistics.NormalDist().inv_cdf(0.97))
    for first in (0, 1_000_000, 12_345):
        slow = sum(models.speed_factor("resnet_cifar_32", "l4", first + i) > tail
                   for i in range(200))
        assert 5 <= slow <= 7
    assert (models.step_time_error("resnet_cifar_32", "l4")["sigma_log"]
            > 4 * models.step_time_error("resnet_cifar_32", "v100")["sigma_log"])  # measured
    # outside the measured GPUs' TFLOPS and bandwidth the error grows with the distance
    assert (models.step_time_error("resnet_cifar_32", "a100")["sigma_log"]
            > models.step_time_error("resnet_cifar_32", "l4")["sigma_log"]
            > models.step_time_error("resnet_cifar_32", "t4")["sigma_log"])


def test_a_speed_nothing_supports_is_flagged_until_calibrated() -> None:
    """Issue 37: the L4's step time is an extrapolation no measurement or public figure checks,
    so it is not supported; the T4 (inside the measured hardware) and the A100 (public
    throughputs agree) are, as is every measured GPU. A calibration on an L4 makes it so."""
    models = SimModels.load()
    ok, why = models.supported("resnet_cifar_32", "l4")
    assert not ok and "no measurement or public throughput of L4" in why
    for gpu in ("k80", "v100", "t4", "a100"):
        assert models.supported("resnet_cifar_32", gpu)[0], gpu
    assert "public ResNet-50 throughputs" in models.supported("resnet_cifar_32", "a100")[1]
    cfg = question("deadline_h=2", "planner.gpus=[l4]", "planner.workers=[1]",
                   "planner.transient=[false]")
    row = evaluate(cfg)[0]  # each planner row carries it, for the table to act on
    assert row["extrapolated"] and row["speed_supported"] == (False, why)
    assert calibrate.main(["+experiment=cifar10_res32", "--gpu", "l4", "--step-s", "0.09"]) == 0
    cal = calibrate.with_gpu_calibrations(SimModels.load(), cfg)
    assert cal.supported("resnet_cifar_32", "l4") == (True, "calibrated on this GPU")


def test_extrapolated_rows_are_marked_until_a_calibration_on_that_gpu_replaces_them() -> None:
    cfg = question("deadline_h=2", "planner.gpus=[t4]", "planner.workers=[4]")
    row = evaluate(cfg)[0]
    assert row["extrapolated"] and row["speed_basis"] == "extrapolated"
    console = Console(record=True, width=250)
    print_table([row], cfg, 1, console)
    assert "4× t4 transient †" in console.export_text()
    piped = Console(file=io.StringIO(), width=80)  # a pipe or a file: rows whole, not wrapped
    print_table([row], cfg, 1, piped)
    text = piped.file.getvalue()
    assert "4× t4 transient †" in text and "…" not in text
    # the note says what † means, no more
    assert "scaled by TFLOPS and memory bandwidth to a GPU no paper measured" in text
    dry = compose(["+experiment=cifar10_res32", "dry_run=true", "sim.repeats=3"])
    assert "† extrapolated" in dry_run_text(dry)

    # a step time measured on a T4 (here given as a real run would report it)
    assert calibrate.main(["+experiment=cifar10_res32", "--gpu", "t4", "--step-s", "0.09"]) == 0
    row = evaluate(cfg)[0]
    assert not row["extrapolated"] and row["speed_basis"] == "calibrated"
    models = calibrate.with_gpu_calibrations(SimModels.load(), cfg)
    assert models.step_time_s("resnet_cifar_32", "t4", 128) == 0.09
    assert row["speed_sigma_log"] == SimModels.load().params["step_time_error"]["model"][
        "measured"]
    console = Console(record=True, width=250)
    print_table([row], cfg, 1, console)
    assert "†" not in console.export_text()
    text = dry_run_text(dry)
    assert "extrapolated" not in text
    plan = make_plan(dry)
    band = predict_band(dry, plan)
    assert band["estimate"]["train_time_s"] < plan.est_train_time_s  # 0.09 s < the 0.147 s extrapolated


def dry_run_text(cfg: object) -> str:
    plan = make_plan(cfg)
    plan.prediction = predict_band(cfg, plan)
    console = Console(record=True, width=250)
    render_plan(plan, console)
    return console.export_text()


def test_the_dry_run_prints_one_estimate_of_the_plan() -> None:
    """Issue 23: no `est. speed: n/a` above a simulated band of the same plan."""
    cfg = compose(["+experiment=cifar10_res32", "dry_run=true", "sim.repeats=3"])
    plan = make_plan(cfg)
    band = predict_band(cfg, plan)
    assert band["estimate"]["train_time_s"] == pytest.approx(plan.est_train_time_s, abs=1e-3)
    text = dry_run_text(cfg)
    assert "est. speed: n/a" not in text and "simulated (p10–p90 of 3 runs" in text


def test_an_experiments_own_revocation_plan_is_not_called_drawn_per_run() -> None:
    """transient_k80_8 injects a seeded trace of revocations: every simulated run replays the
    same plan, so the band and the plan must not say revocations are drawn per run."""
    own = compose(["+experiment=transient_k80_8", "dry_run=true", "sim.repeats=3"])
    same = "revocations: the experiment's trace model (seed 0), the same in every run"
    assert same in header(own, 0, 0)
    text = dry_run_text(own)
    assert same in text and "revocations and the speed model's error drawn per run" not in text
    band = predict_band(own, make_plan(own))
    assert band["revocations"]["p10"] == band["revocations"]["p90"] >= 1  # the one plan, replayed
    cloud = question("deadline_h=2")  # revocations from the cloud's lifetimes, per run
    assert "(40–80 simulated runs each, revocations and the speed model's error drawn per run;" \
        in header(cloud, 0, 0)
    local = compose(["+experiment=digits_local", "dry_run=true"])
    assert cloud_market(local, make_plan(local).backend)[0] is None
    assert draws(local, market=False) == ("the speed model's error drawn per run; no cloud "
                                           "revokes these hosts")


def test_printed_p_deadline_is_within_sampling_error_of_fresh_runs() -> None:
    """The reliability check of docs/simulation.md, on one configuration whose P(deadline)
    is neither 0 nor 1 (4 Spot T4s, 0.7 h: a sixth of the runs make it): the planner's P from 400 runs
    against 400 fresh ones is within 5σ of their binomial difference (docs: 1,000 fresh runs
    per configuration, ±5 points), while the P without the speed model's error is not."""
    cfg = question("deadline_h=0.7", "planner.gpus=[t4]", "planner.workers=[4]",
                   "planner.transient=[true]", "planner.repeats=400",
                   "planner.max_repeats=400")
    row = evaluate(cfg)[0]
    printed = row["p_deadline"]
    assert 0.1 < printed < 0.9 and row["runs"] == 400
    run_cfg = configure(cfg, row["candidate"])
    plan = make_plan(run_cfg)
    fresh = summarize_runs(simulate_many(run_cfg, plan, 400, first=FRESH_SEED_OFFSET),
                           0.7 * 3600)["p_deadline"]
    bound = binomial_bound(printed, 400, 400)
    assert abs(fresh - printed) <= bound
    run_cfg.sim.speed_error = False  # what the planner printed before: revocations only
    point = summarize_runs(simulate_many(run_cfg, plan, 400), 0.7 * 3600)["p_deadline"]
    assert abs(point - fresh) > bound


def test_when_nothing_meets_the_deadline_the_closest_are_named() -> None:
    cfg = question("deadline_h=0.3", "planner.gpus=[t4]")  # under the PS-capped 0.46 h
    rows = evaluate(cfg)
    assert rank(rows, cfg) == [] and max(r["p_deadline"] for r in rows) < 0.9
    line = nearest_misses(rows, cfg)
    assert line.startswith("nothing meets the limits: the parameter servers' capacity bounds "
                           "every configuration (1 PS serves 44.0 steps/s; ")
    assert line.splitlines()[1].startswith("closest by time: ") and "t4 transient †" in line


def named(line: str) -> list[str]:
    """The candidates a nearest-misses line names, in order ("4× t4 transient † in zone")."""
    closest = line.splitlines()[1]
    assert closest.startswith("closest by ")
    return [part.split(":")[0] for part in closest.split(": ", 1)[1].split("; ")]


def test_when_nothing_meets_the_budget_the_closest_are_the_cheapest_that_meet_the_rest() -> None:
    # a budget alone: no P(deadline) to print (no deadline was asked), the cheapest first
    cfg = question("budget_usd=0.01", "planner.gpus=[t4]")
    rows = evaluate(cfg)
    assert rank(rows, cfg) == []
    line = nearest_misses(rows, cfg)
    assert "P(deadline)" not in line and "completes " in line
    cheapest = min(rows, key=lambda r: r["mean_cost_usd"])
    assert named(line)[0] == f"{cheapest['candidate'].label} † in {cheapest['zone']}"
    assert line.startswith("nothing meets the limits: over budget: the cheapest configuration "
                           f"costs ${cheapest['mean_cost_usd']:.2f} (mean; ")
    # a deadline and a budget: what meets the deadline, over the budget by the least, comes
    # before what is cheaper but unlikely to make it (the probability first)
    cfg = question("deadline_h=0.75", "budget_usd=0.05", "planner.gpus=[l4]")
    rows = evaluate(cfg)
    assert rank(rows, cfg) == []
    likely = [r for r in rows if r["p_deadline"] >= 0.9]
    unlikely = [r for r in rows if r["p_deadline"] < 0.9]
    assert likely and unlikely  # else the order below proves nothing
    best = min(likely, key=lambda r: r["mean_cost_usd"])
    assert min(r["mean_cost_usd"] for r in unlikely) < best["mean_cost_usd"]
    line = nearest_misses(rows, cfg)
    assert named(line)[0] == f"{best['candidate'].label} † in {best['zone']}"
    assert "P(deadline) " in line and line.startswith(
        "nothing meets the limits: over budget: the cheapest configuration that meets the "
        f"deadline costs ${best['mean_cost_usd']:.2f} (mean; {best['candidate'].label}), "
        "the budget is $0.05")


def test_nvidia_product_names_map_to_catalog_gpus() -> None:
    assert [calibrate.gpu_key(n) for n in (
        "Tesla K80", "Tesla P100-PCIE-16GB", "Tesla V100-SXM2-16GB", "Tesla T4",
        "NVIDIA A100-SXM4-40GB", "NVIDIA L4", "NVIDIA H100 80GB HBM3", "GeForce GTX 1080")] == [
        "k80", "p100", "v100", "t4", "a100", "l4", "h100", None]


@pytest.mark.parametrize(("arg", "line"), [
    ("deadline_h=0", "config error: deadline_h: must be > 0 (got 0)"),
    ("budget_usd=abc", "config error: budget_usd: 'abc' is not a valid number (a number)"),
    ("planner.deadline_h=-1", "config error: planner.deadline_h: must be > 0 (got -1)"),
    # questions that cannot be answered: refused, not searched with a meaningless setting
    ("objective=deadline", "config error: objective: 'deadline' ranks by the chance of "
     "finishing before planner.deadline_h, which is not set (set a deadline: deadline_h=HOURS; "
     "or rank by cost or time)"),
    ("planner.zones=all", "config error: planner.zones: invalid value 'all' (one of: region, "
     "first)"),
    ("planner.gpus=[h100]", "config error: planner.gpus.0: unknown GPU 'h100' in catalog 'gce' "
     "(one of: k80, p100, v100, t4, a100, l4)"),
])
def test_a_bad_limit_is_named_as_the_user_typed_it(arg: str, line: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        planner.main(["+experiment=cifar10_res32", arg])
    assert ended.value.code == 2 and capsys.readouterr().err.strip() == line


@pytest.mark.parametrize(("args", "line"), [
    (["deadline_h=0"], "config error: deadline_h: must be > 0 (got 0)"),
    ([], "config error: deadline_h: the reliability check needs a deadline (hours, e.g. "
         "deadline_h=2)"),
])
def test_the_reliability_check_names_a_bad_question_in_one_line(
        args: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        reliability.main(["+experiment=cifar10_res32", *args])
    assert ended.value.code == 2 and capsys.readouterr().err.strip() == line
